"""Hook specifications and the ``hookimpl`` marker: the whole plugin interface.

A plugin is a module (or object) registered under an entry point of group ``qinglong.plugins``. It
imports only :mod:`qinglong.contracts` and its own libraries, and implements some of these hooks::

    from qinglong.contracts.hookspecs import hookimpl

    @hookimpl
    def qinglong_trigger_providers():
        return [MyProvider()]

The host loads only the plugins its profile names plus those the settings enable, registers them,
then calls :meth:`pluggy.PluginManager.check_pending`, so a misspelled ``qinglong_*`` function is an
error rather than silence. pluggy calls the hooks, so ``tryfirst``, ``trylast`` and hook wrappers
(``wrapper=True``) work as pluggy documents them; the host remembers which plugin returned each
item, so a refusal names the plugin and its distribution. Every hook returns an iterable of items
(a list, or a generator that yields them); ``None`` counts as no items. An exception raised in a
hook stops the command with ``PluginLoadError`` naming the plugin and the hook (exit code 3).

Hooks are called in this order during ``qinglong run``:

1. ``qinglong_diagnostic_sinks`` and ``qinglong_trigger_providers`` while the container is built;
2. ``qinglong_scheduler_backends`` to find the backend the profile names;
3. ``qinglong_executors`` when the profile executes Runs locally (edge, standalone), before the
   dispatcher starts;
4. ``qinglong_lifecycle_components`` after the backend exists, before anything starts; then
   ``qinglong_notifiers`` when ``[notifications]`` names channels and the backend keeps an outbox;
   ``qinglong_event_sources`` when the backend admits occurrences.

``qinglong_trigger_cli_options`` is called only by ``qinglong trigger add`` and ``trigger update``,
before their command line is parsed. ``qinglong_cli_commands`` is called only when the command line
names a command the host does not know itself, or asks for the top-level ``--help``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import pluggy

from .frozen import record

if TYPE_CHECKING:  # types only; nothing here is imported at run time
    from .cli import CliCommand
    from .diagnostics import DiagnosticSink
    from .event_sources import EventSourceContext
    from .events import NotifierSpec
    from .execution import ExecutorSpec
    from .worker import WorkerProtocolSpec
    from .providers import TriggerCliOptions, TriggerProvider
    from .store import SchedulerBackend, SchedulerBackendSpec

PROJECT_NAME = "qinglong"
ENTRY_POINT_GROUP = "qinglong.plugins"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class ComponentPhase(str, enum.Enum):
    """Where a lifecycle component starts and stops.

    ``stack`` components start after the scheduler and stop after it drained; ``admission``
    components (HTTP or any other intake) start last and are the first withdrawn at stop.
    """

    STACK = "stack"
    ADMISSION = "admission"


@runtime_checkable
class LifecycleComponent(Protocol):
    """Something the lifecycle starts and stops. ``stop`` must return within the bound it is given."""

    name: str
    phase: ComponentPhase

    async def start(self) -> None:
        """Start; raise to abort the whole start (everything already started is stopped)."""
        ...

    async def stop(self) -> None:
        """Stop; the lifecycle cancels it after the configured bound."""
        ...


class PluginSettingsSection(Protocol):
    """The ``[plugins]`` section: which plugins the operator enabled, and their own tables."""

    enable: Sequence[str]
    settings: Mapping[str, Mapping[str, Any]]


@runtime_checkable
class Settings(Protocol):
    """The validated settings, as a plugin sees them.

    The host's settings model satisfies this protocol; contracts name only what a plugin may rely
    on. Read your own table with :func:`plugin_settings` (``[plugins.settings.<name>]``).
    """

    profile: str
    plugins: PluginSettingsSection
    backend: Mapping[str, Any]


@record(slots=False)
class HostContext:
    """What ``qinglong_lifecycle_components`` receives: the running profile's pieces."""

    profile: str
    settings: Settings
    backend: "SchedulerBackend"
    diagnostics: "DiagnosticSink"
    providers: Mapping[str, "TriggerProvider"]


class QinglongHookSpecs:
    """The hook specifications. Every hook name starts with ``qinglong_``."""

    @hookspec
    def qinglong_trigger_providers(self) -> Iterable["TriggerProvider"]:
        """Return the trigger providers this plugin offers.

        Called once per process while the host builds its container (every command that reads or
        publishes triggers, and ``qinglong run``), for every loaded plugin, in pluggy's order.

        :returns: An iterable of :class:`~qinglong.contracts.providers.TriggerProvider`; each
            provider's ``kind`` must be unique across the loaded plugins.

        Two providers of one kind are refused, naming both plugins and their distributions; an
        item that is not a ``TriggerProvider`` is refused naming the plugin. Returning nothing
        (``None`` or an empty list) offers no kind. Raising stops the command with
        ``PluginLoadError`` naming the plugin.
        """

    @hookspec
    def qinglong_trigger_cli_options(self) -> Iterable["TriggerCliOptions"]:
        """Return how operators write this plugin's trigger kinds on the command line.

        Called once by ``qinglong trigger add`` and ``qinglong trigger update``, after the settings
        are read and before the command line is parsed; no other command calls it. The declared
        flags are added to both commands, and the ones given reach ``to_spec``, whose spec the
        kind's provider then validates at publish.

        :returns: An iterable of :class:`~qinglong.contracts.providers.TriggerCliOptions`, at most
            one per kind.

        Two declarations for one kind, a flag that is not a long option, and a flag of the
        command itself (``--task``, ``--kind``, ``--spec``, ...) are refused naming the plugin.
        Returning nothing leaves the kind to ``--kind KIND --spec JSON``. Raising stops the command
        with ``PluginLoadError`` naming the plugin.
        """

    @hookspec
    def qinglong_cli_commands(self) -> Iterable["CliCommand"]:
        """Return commands this plugin adds to the ``qinglong`` command line.

        Called once, after the settings are read and the profile's and the enabled plugins are
        loaded, only when the command line names a command the host does not know itself (or
        asks for the top-level ``qinglong --help``, which lists them); ``qinglong run`` and every
        host command, its own ``--help`` included, never call it. The host builds each command's parser from the declaration and, when the
        command is named, calls its handler with a :class:`~qinglong.contracts.cli.CliContext`.

        :returns: An iterable of :class:`~qinglong.contracts.cli.CliCommand`; each name must be
            unique across the host's commands and the loaded plugins.

        A name that is a host command (``run``, ``task``, ...) or another plugin's command is
        refused naming both; an item that is not a ``CliCommand``, or whose declaration is wrong
        (a bad name or flag, a group without subcommands), is refused naming the plugin.
        Returning nothing adds no command. Raising stops the command line with
        ``PluginLoadError`` naming the plugin (exit code 3).
        """

    @hookspec
    def qinglong_scheduler_backends(self) -> Iterable["SchedulerBackendSpec"]:
        """Return the scheduler backends this plugin offers.

        Called once per process while the container is built. The profile names exactly one
        backend (``[profile] backend = "edge_sqlite"``); the host validates the ``[backend]``
        settings section with that spec's ``settings_model`` and calls its ``create`` only when the
        backend is needed (``create`` must not connect).

        :returns: An iterable of :class:`~qinglong.contracts.store.SchedulerBackendSpec`.

        Two plugins offering one backend name are refused naming both; an item that is not a
        ``SchedulerBackendSpec`` is refused naming the plugin. Returning nothing offers no backend
        (a profile naming a backend nobody offers is refused, listing the offered ones). Raising
        stops the command with ``PluginLoadError`` naming the plugin.
        """

    @hookspec
    def qinglong_executors(self) -> Iterable["ExecutorSpec"]:
        """Return the executors this plugin offers: how an Attempt's process is started and watched.

        Called once by ``qinglong run`` on a profile that executes Runs itself, before the
        dispatcher starts (and by ``task put``, to refuse a task naming an executor nobody
        offers). A task names its executor in its execution spec (``executor``, default
        ``local_process``, the built-in plugin registered like any other).

        :returns: An iterable of :class:`~qinglong.contracts.execution.ExecutorSpec`; each name
            must be unique across the loaded plugins.

        Two plugins offering one name are refused naming both; an item that is not an
        ``ExecutorSpec`` is refused naming the plugin. Returning nothing offers no executor.
        Raising stops the command with ``PluginLoadError`` naming the plugin.
        """

    @hookspec
    def qinglong_worker_protocols(self) -> Iterable["WorkerProtocolSpec"]:
        """Return the stores the API tier's worker gateway can serve workers from.

        Called once by ``qinglong api`` at start, when ``[api] gateway_dsn`` is set (``qinglong
        run`` serves no worker routes, even with the API on). The gateway uses the spec named by the profile's backend
        (``[profile] backend``) and opens its pool with ``create_gateway(gateway_dsn,
        application_name, pool_size, backend_settings=...)`` (the backend's ``[backend]``
        settings, or None); workers speak only to the gateway.

        :returns: An iterable of :class:`~qinglong.contracts.worker.WorkerProtocolSpec`; each name
            must be unique across the loaded plugins.

        Two plugins offering one name are refused naming both; an item that is not a
        ``WorkerProtocolSpec`` is refused naming the plugin. Returning nothing offers none (a
        profile whose backend offers none cannot run workers, and ``qinglong worker`` says so).
        Raising stops the command with ``PluginLoadError`` naming the plugin.
        """

    @hookspec
    def qinglong_lifecycle_components(self, context: HostContext) -> Iterable[LifecycleComponent]:
        """Return components for the lifecycle to start and stop around the scheduler.

        Called once by ``qinglong run`` after schema readiness and startup recovery succeeded,
        before anything is started. Start order: scheduler, ``stack`` components, ``admission``
        components (each phase in the order pluggy returned them); stop order is the reverse, each
        step bounded by ``[lifecycle] stop_timeout_ms``.

        :param context: The running profile's pieces: profile name, settings, backend (open),
            diagnostic sink and trigger providers by kind.
        :returns: An iterable of :class:`LifecycleComponent`.

        An item that is not a ``LifecycleComponent`` is refused naming the plugin. Returning
        nothing adds no component. Raising stops ``qinglong run`` before anything started, with
        ``PluginLoadError`` naming the plugin; a component whose ``start`` raises stops everything
        already started.
        """

    @hookspec
    def qinglong_notifiers(self) -> Iterable["NotifierSpec"]:
        """Return the kinds of notification channel this plugin offers.

        Called once by ``qinglong run`` after the backend exists, only when the settings name
        channels (``[notifications.channels.<name>]``) and the backend keeps an outbox; no other
        command calls it. Each channel's ``kind`` picks a spec, whose ``create(name, options)``
        builds the :class:`~qinglong.contracts.events.Notifier` from the channel's other keys
        (``create`` must not connect; it raises ``ValueError`` for bad options, never quoting a
        secret). The delivery loop then calls the notifier's ``send`` for each event routed to
        the channel, at least once, with the same event id every time.

        :returns: An iterable of :class:`~qinglong.contracts.events.NotifierSpec`; each kind must
            be unique across the loaded plugins (the built-ins are ``webhook`` and ``email``).

        Two plugins offering one kind are refused naming both; an item that is not a
        ``NotifierSpec`` is refused naming the plugin. Returning nothing offers no kind (a channel
        naming a kind nobody offers is a settings error listing the offered ones). Raising stops
        the command with ``PluginLoadError`` naming the plugin.
        """

    @hookspec
    def qinglong_event_sources(self, context: "EventSourceContext") -> Iterable[LifecycleComponent]:
        """Return event sources: components that admit Runs for what happened.

        Called once by ``qinglong run`` after schema readiness and startup recovery, when the
        backend admits occurrences (:class:`~qinglong.contracts.capabilities.AdmitsOccurrences`),
        before anything is started. The components start with the ``stack`` phase, after the
        scheduler, and are stopped before the database closes.

        :param context: :class:`~qinglong.contracts.event_sources.EventSourceContext`: the
            settings, the diagnostic sink, the clock, this start's identity, ``triggers(kind)``
            (the enabled triggers of a kind) and ``admit(kind, trigger_id, event_id, payload)``,
            the one way a source admits a Run: once per trigger and event id, only while the
            trigger is of that kind and enabled, in one transaction of the store.
        :returns: An iterable of :class:`LifecycleComponent`.

        An item that is not a ``LifecycleComponent`` is refused naming the plugin. Returning
        nothing adds no source. Raising stops ``qinglong run`` before anything started, with
        ``PluginLoadError`` naming the plugin; a source whose ``start`` raises stops everything
        already started.
        """

    @hookspec
    def qinglong_diagnostic_sinks(self, settings: Settings) -> Iterable["DiagnosticSink"]:
        """Return extra diagnostic sinks (the host always has its own stderr sink).

        Called once per process while the container is built, before any event is emitted.

        :param settings: The validated settings (:class:`Settings`); read the plugin's own table
            with :func:`plugin_settings`.
        :returns: An iterable of :class:`~qinglong.contracts.diagnostics.DiagnosticSink`.

        Events reach a sink already redacted, in the order the sinks were returned; a sink whose
        ``emit`` raises is disabled and reported on stderr. Returning nothing adds no sink.
        Raising stops the command with ``PluginLoadError`` naming the plugin.
        """


def plugin_settings(settings: Settings, plugin_name: str) -> Mapping[str, Any]:
    """The ``[plugins.settings.<plugin_name>]`` table of the settings, or an empty mapping."""
    tables = getattr(getattr(settings, "plugins", None), "settings", None) or {}
    return tables.get(plugin_name, {})


__all__ = [
    "ComponentPhase",
    "ENTRY_POINT_GROUP",
    "HostContext",
    "LifecycleComponent",
    "PROJECT_NAME",
    "PluginSettingsSection",
    "QinglongHookSpecs",
    "Settings",
    "hookimpl",
    "hookspec",
    "plugin_settings",
]
