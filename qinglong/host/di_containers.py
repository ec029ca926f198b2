"""The dependency-injector containers of the standalone and cluster profiles.

Imported only when one of those profiles builds its root (:func:`~qinglong.host.containers.
build_container`): the edge profile wires the same providers in plain Python
(:class:`~qinglong.host.containers.EdgeContainer`), because importing dependency-injector's compiled
containers costs a router about 2.3 MiB of its resident memory. The providers call the factory
functions of :mod:`qinglong.host.containers`, so each rule of the wiring lives there once.
"""

from __future__ import annotations

from operator import methodcaller

from dependency_injector import containers, providers

from qinglong.contracts.store import BackendContext, SchedulerLimits

from .containers import (
    backend_settings,
    backend_spec,
    components_factory,
    create_backend,
    diagnostics,
    dispatcher_factory,
    http_admission,
    load_plugins,
    replica_owner,
    resolve_owner,
    single_owner,
    wall_clock_ms,
)
from .lifecycle import Lifecycle
from .settings import LoadedSettings


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
    backend_context = providers.Singleton(
        BackendContext,
        settings=backend_settings,
        limits=limits,
        providers=trigger_providers,
        diagnostics=diagnostics,
        clock_ms=clock_ms,
        owner=owner,
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
class StandaloneContainer(HostContainer):
    """``standalone``: one process owns the SQLite file, with the standalone profile's bigger
    budgets (the wiring :class:`~qinglong.host.containers.EdgeContainer` spells out without
    dependency-injector)."""


@containers.copy(HostContainer)
class ClusterContainer(HostContainer):
    """``cluster``: many replicas share one PostgreSQL, so each start gets a distinct owner."""

    owner_strategy = providers.Object(replica_owner)


CONTAINERS: dict[str, type[HostContainer]] = {
    "standalone": StandaloneContainer,
    "cluster": ClusterContainer,
}
