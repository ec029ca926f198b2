"""The parts every program of the host assembles the same way: the profile's plugins, the
diagnostics sink, the executors; and the ``qinglong worker`` composition root.

Kept apart from :mod:`.containers` (the control plane's roots, with their lifecycle, store
contracts and loops) so that a worker speaking to the API tier's gateway imports none of those.
"""

from __future__ import annotations

from typing import Any

from dependency_injector import containers, providers

from qinglong.contracts.errors import PluginLoadError
from qinglong.contracts.execution import ExecutorContext

from .diagnostics import FanoutSink, StderrSink
from .plugins import PluginHost, missing_extra_requirements
from .settings import LoadedSettings

DISTRIBUTION = "qinglong"


def extra_hint(profile_extra: str) -> str:
    """The install command that brings a profile's extra."""
    return f"pip install '{DISTRIBUTION}[{profile_extra}]'"


def check_profile_extra(loaded: LoadedSettings) -> None:
    """Refuse, before importing any plugin, a profile whose extra is not installed."""
    missing = missing_extra_requirements(DISTRIBUTION, loaded.profile.extra)
    if missing:
        raise PluginLoadError(
            f"the {loaded.profile.name} profile needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {extra_hint(loaded.profile.extra)}"
        )


def load_plugins(loaded: LoadedSettings, *, check_extra: bool = True) -> PluginHost:
    """Load the profile's plugins, then the ones the settings enable, then check hook names.
    ``check_extra`` False: a worker speaking to the API tier's gateway needs none of the
    profile's store packages (``qinglong[worker]``)."""
    if check_extra:
        check_profile_extra(loaded)
    host = PluginHost()
    host.load(loaded.profile.plugins, required_by=f"the {loaded.profile.name} profile")
    host.load(loaded.settings.plugins.enable, required_by=loaded.origin(("plugins", "enable")))
    return host


def diagnostics(host: PluginHost, loaded: LoadedSettings) -> FanoutSink:
    """The host's stderr sink plus every plugin's sink, behind redaction."""
    own = StderrSink(loaded.settings.diagnostics.level, loaded.settings.diagnostics.format)
    return FanoutSink([own, *host.diagnostic_sinks(loaded.settings)], fallback=own)


def create_executors(host: PluginHost, context: ExecutorContext) -> dict[str, Any]:
    """Every loaded plugin's executors, created (by name); a failing factory is a PluginLoadError
    naming the executor."""
    executors = {}
    for name, spec in host.executor_specs().items():
        try:
            executors[name] = spec.create(context)
        except Exception as exc:
            raise PluginLoadError(
                f"executor {name!r} could not be created: {exc.__class__.__name__}: {exc}") from exc
    return executors


def release_freed_memory() -> None:
    """Give back to the system the memory a boot used and freed (settings validation, plugin
    loading): glibc otherwise keeps freed blocks in its heap, counted in the process's RSS for
    as long as it runs. A no-op where the C library has no ``malloc_trim``."""
    import gc

    gc.collect()
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return
    trim(0)


class GatewayWorkerContainer(containers.DeclarativeContainer):
    """``qinglong worker`` speaking to the API tier's gateway: the profile's plugins (no store
    package needed: ``qinglong[worker]``), the diagnostics sink and the executors; nothing of the
    store, the lifecycle or the HTTP server."""

    loaded = providers.Dependency(instance_of=LoadedSettings)
    executor_context = providers.Dependency(instance_of=ExecutorContext)

    plugin_host = providers.Singleton(load_plugins, loaded, check_extra=False)
    diagnostics = providers.Singleton(diagnostics, plugin_host, loaded)
    executors = providers.Singleton(create_executors, plugin_host, executor_context)
