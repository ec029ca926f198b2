"""Hook specifications and the ``hookimpl`` marker: the whole plugin interface.

A plugin is a module (or object) registered under an entry point of group ``qinglong.plugins``. It
imports only :mod:`qinglong.contracts` and its own libraries, and implements some of these hooks::

    from qinglong.contracts.hookspecs import hookimpl

    @hookimpl
    def qinglong_trigger_providers():
        return [MyProvider()]

The host loads only the plugins its profile names plus those the settings enable, registers them,
then calls :meth:`pluggy.PluginManager.check_pending`, so a misspelled ``qinglong_*`` function is an
error rather than silence. Hooks are called in this order during ``qinglong run``:

1. ``qinglong_diagnostic_sinks`` and ``qinglong_trigger_providers`` while the container is built;
2. ``qinglong_scheduler_backends`` to find the backend the profile names;
3. ``qinglong_lifecycle_components`` after the backend exists, before anything starts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, runtime_checkable

import pluggy

if TYPE_CHECKING:  # types only; nothing here is imported at run time
    from .diagnostics import DiagnosticSink
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


@dataclass(frozen=True)
class HostContext:
    """What ``qinglong_lifecycle_components`` receives: the running profile's pieces."""

    profile: str
    settings: Any
    backend: "SchedulerBackend"
    diagnostics: "DiagnosticSink"
    providers: Mapping[str, "TriggerProvider"]


class QinglongHookSpecs:
    """The hook specifications. Every hook name starts with ``qinglong_``."""

    @hookspec
    def qinglong_trigger_providers(self) -> Iterable["TriggerProvider"]:
        """Return the trigger providers this plugin offers (an iterable, possibly empty).

        Called once while the host builds its container, for every loaded plugin. Each provider's
        ``kind`` must be unique across loaded plugins: the host refuses two providers of one kind,
        naming both plugins and their distributions.
        """

    @hookspec
    def qinglong_trigger_cli_options(self) -> Iterable["TriggerCliOptions"]:
        """Return how operators write this plugin's trigger kinds on the command line."""

    @hookspec
    def qinglong_scheduler_backends(self) -> Iterable["SchedulerBackendSpec"]:
        """Return the scheduler backends this plugin offers, as ``SchedulerBackendSpec`` values.

        Called once while the container is built. The profile names exactly one backend
        (``[profile] backend = "edge_sqlite"``); the host validates the ``[backend]`` settings section
        with that spec's ``settings_model`` and calls its ``create`` only when the backend is needed.
        Two plugins offering the same backend name are refused.
        """

    @hookspec
    def qinglong_lifecycle_components(self, context: HostContext) -> Iterable[LifecycleComponent]:
        """Return components for the lifecycle to start and stop around the scheduler.

        Called once by ``qinglong run`` after schema readiness and startup recovery succeeded,
        before anything is started. ``context`` holds the profile, settings, backend, diagnostic sink
        and trigger providers. Start order: scheduler, ``stack`` components, ``admission``
        components; stop order is the reverse, each step bounded.
        """

    @hookspec
    def qinglong_diagnostic_sinks(self, settings: Any) -> Iterable["DiagnosticSink"]:
        """Return extra diagnostic sinks (the host always has its own stderr sink).

        Called once while the container is built, with the validated settings. Events reach a sink
        already redacted; a sink that raises is disabled and reported on stderr.
        """


def plugin_settings(settings: Any, plugin_name: str) -> Mapping[str, Any]:
    """The ``[plugins.settings.<plugin_name>]`` table of the settings, or an empty mapping."""
    tables = getattr(getattr(settings, "plugins", None), "settings", None) or {}
    return tables.get(plugin_name, {})


__all__ = [
    "ComponentPhase",
    "ENTRY_POINT_GROUP",
    "HostContext",
    "LifecycleComponent",
    "PROJECT_NAME",
    "QinglongHookSpecs",
    "hookimpl",
    "hookspec",
    "plugin_settings",
]
