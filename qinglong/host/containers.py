"""The composition root: one dependency-injector container per profile, built in ``main``.

Nothing here runs at import time. ``build_container`` takes validated settings, picks the profile's
container, and the providers load plugins (by entry point), collect trigger providers and the
backend spec, validate the ``[backend]`` section with the backend's own model and create the
backend without connecting. The containers reference no plugin module: what differs between
profiles is wiring (the replica identity), never an import.
"""

from __future__ import annotations

import inspect
import os
import socket
import time
import uuid
from operator import methodcaller
from typing import Any

from dependency_injector import containers, providers

from qinglong.contracts.capabilities import (
    AdmitsOccurrences,
    EventingBackend,
    ExecutingBackend,
    proposed_log_dir,
)
from qinglong.contracts.errors import PluginLoadError, SettingsError
from qinglong.contracts.execution import ExecutorContext, minimal_environment
from qinglong.contracts.store import BackendContext, SchedulerBackendSpec, SchedulerLimits

from .assembly import create_executors, diagnostics, extra_hint, load_plugins
from .lifecycle import Lifecycle
from .plugins import PluginHost
from .secrets import host_sealer
from .settings import LoadedSettings, validate_section


def wall_clock_ms() -> int:
    """The process clock in epoch milliseconds (edge and standalone decide with it)."""
    return time.time_ns() // 1_000_000


def backend_spec(host: PluginHost, loaded: LoadedSettings) -> SchedulerBackendSpec:
    """The scheduler backend the profile names, from the loaded plugins."""
    specs = host.backend_specs()
    name = loaded.profile.backend
    if name not in specs:
        raise PluginLoadError(
            f"the {loaded.profile.name} profile needs scheduler backend {name!r}, which no loaded "
            f"plugin provides (loaded backends: {', '.join(sorted(specs)) or 'none'})"
        )
    return specs[name]


def backend_settings(spec: SchedulerBackendSpec, loaded: LoadedSettings) -> Any:
    """The ``[backend]`` section validated by the backend's own settings model."""
    return validate_section(loaded, "backend", spec.settings_model, loaded.settings.backend)


def single_owner(loaded: LoadedSettings) -> str:
    """Edge and standalone: one process owns the file; ``[scheduler] owner`` or host and profile."""
    return loaded.settings.scheduler.owner or f"{loaded.profile.name}@{socket.gethostname()}"


def replica_owner(loaded: LoadedSettings) -> str:
    """Cluster: ``[scheduler] owner``, or ``host:pid:random`` so every replica start is distinct."""
    configured = loaded.settings.scheduler.owner
    return configured or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def resolve_owner(strategy: Any, loaded: LoadedSettings) -> str:
    """Apply the profile's owner strategy."""
    return strategy(loaded)


def create_backend(spec: SchedulerBackendSpec, context: BackendContext, loaded: LoadedSettings) -> Any:
    """Create (not open) the backend; a missing driver names the extra that brings it."""
    try:
        return spec.create(context)
    except ImportError as exc:
        raise PluginLoadError(
            f"scheduler backend {spec.name!r} cannot import its driver ({exc.__class__.__name__}: {exc}): "
            f"{extra_hint(loaded.profile.extra)}"
        ) from exc


def execution_log_dir(loaded: LoadedSettings, backend_settings: Any) -> str | None:
    """Where Attempt directories live: ``[execution] log_dir``, else what the backend's settings
    propose (``<database path>.logs`` beside the file the path resolves to, for a
    :class:`~qinglong.contracts.capabilities.LocalStoreSettings` file; None for other backends).
    Absolute, so a job's working directory never changes what it names."""
    configured = loaded.settings.execution.log_dir
    if configured:
        return os.path.abspath(configured)
    return proposed_log_dir(backend_settings)


def executor_context(loaded: LoadedSettings, backend_settings: Any) -> ExecutorContext:
    """What every executor's factory receives: the log directory, the minimal base environment
    (HOME of the control plane, nothing else of its environment) and the TERM-to-KILL grace."""
    return ExecutorContext(
        log_dir=execution_log_dir(loaded, backend_settings) or os.path.abspath("qinglong.logs"),
        base_env=minimal_environment(os.environ.get("HOME")),
        kill_grace_ms=loaded.settings.execution.kill_grace_ms,
        orphan_drain_ms=loaded.settings.execution.orphan_drain_ms,
        orphans=loaded.settings.execution.orphans,
    )


def dispatcher_factory(host: PluginHost, loaded: LoadedSettings, backend_settings: Any,
                       sink: Any, clock_ms: Any) -> Any:
    """``backend -> Dispatcher | None`` for the lifecycle: a dispatcher only when ``[execution]
    enabled`` and the backend executes Runs locally (an
    :class:`~qinglong.contracts.capabilities.ExecutingBackend` whose ``execution()`` is not None).
    The executors are collected (hook ``qinglong_executors``) only then."""

    def build(backend: Any) -> Any:
        if not loaded.settings.execution.enabled:
            return None
        store = backend.execution() if isinstance(backend, ExecutingBackend) else None
        if store is None:
            return None
        from .execution import Dispatcher, DispatcherConfig

        context = executor_context(loaded, backend_settings)
        config = DispatcherConfig.from_settings(loaded.settings.execution, context.log_dir)
        return Dispatcher(store, create_executors(host, context), config, sink, clock_ms)

    return build


def create_notifiers(host: PluginHost, loaded: LoadedSettings) -> dict[str, Any]:
    """The configured channels (``[notifications.channels.<name>]``), each built by the notifier
    its ``kind`` names; an unknown kind or bad options is a SettingsError naming the channel."""
    specs = host.notifier_specs() if loaded.settings.notifications.channels else {}
    notifiers = {}
    for name, table in loaded.settings.notifications.channels.items():
        options = {k: v for k, v in table.items() if k not in ("kind", "operator_events")}
        spec = specs.get(table["kind"])
        where = loaded.origin(("notifications", "channels", name))
        if not isinstance(table.get("operator_events", False), bool):
            raise SettingsError(f"{where}: channel {name!r}: operator_events: expected true or "
                                "false")
        if spec is None:
            raise SettingsError(
                f"{where}: channel {name!r}: kind {table['kind']!r} is not offered by any loaded "
                f"plugin (offered: {', '.join(sorted(specs)) or 'none'})")
        try:
            notifiers[name] = spec.create(name, options)
        except ValueError as exc:
            raise SettingsError(f"{where}: channel {name!r}: {exc}") from None
    return notifiers


def delivery_loop(host: PluginHost, loaded: LoadedSettings, backend: Any, sink: Any,
                  clock_ms: Any) -> Any:
    """The event delivery loop when the backend keeps an outbox and ``[notifications] enabled``."""
    section = loaded.settings.notifications
    outbox = backend.outbox() if isinstance(backend, EventingBackend) else None
    if outbox is None or not section.enabled:
        return None
    from qinglong.contracts.events import DeliveryPolicy, NotifyPolicy

    from .events import DeliveryLoop

    return DeliveryLoop(
        outbox, create_notifiers(host, loaded), sink, clock_ms,
        policy=DeliveryPolicy(section.max_tries, section.backoff_ms,
                              max(section.backoff_cap_ms, section.backoff_ms)),
        default_notify=NotifyPolicy(section.default), poll_ms=section.poll_ms,
        batch=section.batch, lease_ms=section.lease_ms, send_timeout_ms=section.send_timeout_ms,
        concurrency=section.concurrency, log_lines=section.log_lines,
        retention_ms=int(section.retention_days * 86_400_000),
        operator_channels=tuple(name for name, table in section.channels.items()
                                if table.get("operator_events") is True))


def scheduler_watch(loaded: LoadedSettings, backend: Any, sink: Any, clock_ms: Any,
                    owner: str) -> Any:
    """The watch that writes ``scheduler.not_ready`` and ``scheduler.ready`` when the backend
    keeps an outbox."""
    outbox = backend.outbox() if isinstance(backend, EventingBackend) else None
    if outbox is None:
        return None
    from .events import SchedulerWatch

    return SchedulerWatch(outbox, sink, clock_ms, owner,
                          after_ms=loaded.settings.notifications.scheduler_not_ready_after_ms)


def boot_id() -> str | None:
    """The kernel's id of this boot (Linux), or None."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def event_sources(host: PluginHost, loaded: LoadedSettings, backend: Any, sink: Any,
                  clock_ms: Any, owner: str) -> list[Any]:
    """The event sources (hook ``qinglong_event_sources``) when the backend admits occurrences,
    each given the one admission function of the store."""
    admission = backend.occurrences() if isinstance(backend, AdmitsOccurrences) else None
    if admission is None:
        return []
    from qinglong.contracts.event_sources import EventSourceContext, start_identity

    async def admit(kind: str, trigger_id: str, event_id: str, payload: Any = None) -> Any:
        return await admission.admit_occurrence(kind, trigger_id, event_id, payload, clock_ms())

    async def triggers(kind: str) -> list[Any]:
        reader = backend.reader()
        if "kind" in inspect.signature(reader.list_triggers).parameters:
            # the store filters: a start never holds the heads of every cron trigger
            return [h for h in await reader.list_triggers(kind=kind) if h.enabled]
        heads = await reader.list_triggers()
        return [h for h in heads if h.kind == kind and h.enabled]

    context = EventSourceContext(loaded.settings, sink, clock_ms, start_identity(owner, boot_id()),
                                 admit, triggers)
    return host.event_sources(context)


def components_factory(host: PluginHost, loaded: LoadedSettings, sink: Any, clock_ms: Any,
                       owner: str) -> Any:
    """``context -> components``: the host's own stack components (the event delivery loop, the
    scheduler's watch),
    the event sources and the plugins' (hook ``qinglong_lifecycle_components``)."""

    def build(context: Any) -> list[Any]:
        own = [c for c in (delivery_loop(host, loaded, context.backend, sink, clock_ms),
                           scheduler_watch(loaded, context.backend, sink, clock_ms, owner))
               if c is not None]
        return (own
                + event_sources(host, loaded, context.backend, sink, clock_ms, owner)
                + list(host.lifecycle_components(context)))

    return build


def http_admission(loaded: LoadedSettings) -> Any:
    """``lifecycle -> [HTTP surface]`` when ``[http] listen`` is set, else None; its token is checked
    here, before anything starts (the module is stdlib-only: prometheus_client is imported only
    when the surface is built)."""
    from qinglong import __version__

    from .http import admission_factory

    return admission_factory(loaded, __version__)


class HostContainer(containers.DeclarativeContainer):
    """Wiring shared by every profile."""

    config = providers.Configuration(strict=True)
    loaded = providers.Dependency(instance_of=LoadedSettings)

    plugin_host = providers.Singleton(load_plugins, loaded)
    trigger_providers = providers.Singleton(methodcaller("trigger_providers"), plugin_host)
    diagnostics = providers.Singleton(diagnostics, plugin_host, loaded)
    backend_spec = providers.Singleton(backend_spec, plugin_host, loaded)
    backend_settings = providers.Singleton(backend_settings, backend_spec, loaded)

    limits = providers.Singleton(
        SchedulerLimits,
        page_size=config.scheduler.page_size,
        claim_budget=config.scheduler.claim_budget,
        lease_ms=config.scheduler.lease_ms,
        cadence_ms=config.scheduler.cadence_ms,
        max_queued=config.execution.max_queued,
    )
    owner_strategy = providers.Object(single_owner)
    owner = providers.Singleton(resolve_owner, owner_strategy, loaded)
    clock_ms = providers.Object(wall_clock_ms)
    sealer = providers.Singleton(host_sealer, loaded, backend_settings)
    backend_context = providers.Singleton(
        BackendContext,
        settings=backend_settings,
        limits=limits,
        providers=trigger_providers,
        diagnostics=diagnostics,
        clock_ms=clock_ms,
        owner=owner,
        sealer=sealer,
    )
    backend = providers.Singleton(create_backend, backend_spec, backend_context, loaded)
    dispatcher_factory = providers.Singleton(dispatcher_factory, plugin_host, loaded, backend_settings,
                                             diagnostics, clock_ms)
    http_admission = providers.Singleton(http_admission, loaded)
    components_factory = providers.Singleton(components_factory, plugin_host, loaded, diagnostics,
                                             clock_ms, owner)

    lifecycle = providers.Singleton(
        Lifecycle,
        profile=config.profile,
        settings=loaded.provided.settings,
        backend=backend,
        diagnostics=diagnostics,
        providers=trigger_providers,
        components_factory=components_factory,
        cadence_ms=config.scheduler.cadence_ms,
        start_step_timeout_ms=config.lifecycle.start_step_timeout_ms,
        start_wait_ms=config.lifecycle.start_wait_ms,
        stop_timeout_ms=config.lifecycle.stop_timeout_ms,
        dispatcher_factory=dispatcher_factory,
        admission_factory=http_admission,
    )


@containers.copy(HostContainer)
class EdgeContainer(HostContainer):
    """``edge``: one process owns the SQLite file."""


@containers.copy(HostContainer)
class StandaloneContainer(HostContainer):
    """``standalone``: the edge wiring with the standalone profile's bigger budgets."""


@containers.copy(HostContainer)
class ClusterContainer(HostContainer):
    """``cluster``: many replicas share one PostgreSQL, so each start gets a distinct owner."""

    owner_strategy = providers.Object(replica_owner)


CONTAINERS: dict[str, type[HostContainer]] = {
    "edge": EdgeContainer,
    "standalone": StandaloneContainer,
    "cluster": ClusterContainer,
}


def build_container(loaded: LoadedSettings) -> HostContainer:
    """The profile's container with its configuration loaded from the validated settings."""
    cls = CONTAINERS.get(loaded.profile.name)
    if cls is None:
        raise SettingsError(
            f"profile {loaded.profile.name!r} has no composition root; known: {', '.join(sorted(CONTAINERS))}"
        )
    container = cls(loaded=loaded)
    container.config.from_pydantic(loaded.settings)
    return container
