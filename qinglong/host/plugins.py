"""Loading plugins by entry point, and typed access to their hooks.

Only the named entry points of group ``qinglong.plugins`` are imported: the profile's plugins plus
those the settings enable. Every other plugin stays unimported, so a forbidden library (psycopg on
edge) cannot be pulled in by a plugin that merely exists in the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Iterable

import pluggy

from qinglong.contracts.diagnostics import DiagnosticSink
from qinglong.contracts.errors import PluginLoadError
from qinglong.contracts.hookspecs import (
    ENTRY_POINT_GROUP,
    PROJECT_NAME,
    HostContext,
    LifecycleComponent,
    QinglongHookSpecs,
)
from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.store import SchedulerBackendSpec

_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


@dataclass
class PluginInfo:
    """What ``qinglong plugins`` shows about one entry point."""

    name: str
    value: str
    distribution: str
    version: str
    loaded: bool = False
    hooks: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "name": self.name,
            "module": self.value,
            "distribution": self.distribution,
            "version": self.version,
            "loaded": self.loaded,
            "hooks": self.hooks,
        }


def _dist_label(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown", "?"
    return dist.metadata["Name"], dist.version


def missing_extra_requirements(distribution: str, extra: str) -> list[str]:
    """Requirements of ``distribution[extra]`` that are not installed (by distribution name)."""
    try:
        requires = metadata.distribution(distribution).requires or []
    except metadata.PackageNotFoundError:
        return []
    missing = []
    for req in requires:
        marker = _EXTRA_MARKER.search(req.partition(";")[2])
        name = _REQ_NAME.match(req)
        if not marker or marker.group(1) != extra or not name:
            continue
        try:
            metadata.distribution(name.group(1))
        except metadata.PackageNotFoundError:
            missing.append(name.group(1))
    return sorted(set(missing))


class PluginHost:
    """A pluggy manager that knows which entry points exist and loads only those it is told to."""

    def __init__(self, group: str = ENTRY_POINT_GROUP) -> None:
        self.group = group
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(QinglongHookSpecs)
        self._entry_points: dict[str, metadata.EntryPoint] = {}
        self._infos: dict[str, PluginInfo] = {}
        for ep in metadata.entry_points(group=group):
            if ep.name in self._entry_points:
                other = self._entry_points[ep.name]
                if other.value == ep.value and _dist_label(other) == _dist_label(ep):
                    continue  # the same distribution seen twice on sys.path
                raise PluginLoadError(
                    f"two distributions register plugin {ep.name!r}: "
                    f"{'%s %s' % _dist_label(other)} ({other.value}) and "
                    f"{'%s %s' % _dist_label(ep)} ({ep.value}); uninstall one of them"
                )
            self._entry_points[ep.name] = ep
            dist, version = _dist_label(ep)
            self._infos[ep.name] = PluginInfo(ep.name, ep.value, dist, version)

    @property
    def available(self) -> list[str]:
        """Names of every installed plugin, loaded or not."""
        return sorted(self._entry_points)

    def load(self, names: Iterable[str], *, required_by: str = "the settings") -> None:
        """Import and register the named plugins, then check every hook implementation is known."""
        for name in names:
            if self.pm.has_plugin(name):
                continue
            ep = self._entry_points.get(name)
            if ep is None:
                raise PluginLoadError(
                    f"unknown plugin {name!r} (named by {required_by}); installed plugins: "
                    f"{', '.join(self.available) or 'none'}"
                )
            info = self._infos[name]
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginLoadError(
                    f'Error importing plugin "{name}" from distribution {info.distribution} {info.version}: '
                    f"{exc.__class__.__name__}: {exc}"
                ) from exc
            try:
                self.pm.register(plugin, name=name)
            except (ValueError, pluggy.PluginValidationError) as exc:
                raise PluginLoadError(
                    f'plugin "{name}" from distribution {info.distribution} {info.version} '
                    f"cannot be registered: {exc}"
                ) from exc
            info.loaded = True
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            plugin_name = self.pm.get_name(exc.plugin) or "?"
            info = self._infos.get(plugin_name)
            where = f" from distribution {info.distribution} {info.version}" if info else ""
            raise PluginLoadError(
                f'plugin "{plugin_name}"{where} implements an unknown hook: {exc}; '
                "hook names start with 'qinglong_' and are listed in docs/plugins.md"
            ) from None

    def infos(self) -> list[PluginInfo]:
        """Every installed plugin, with the hooks of the loaded ones."""
        for name, info in self._infos.items():
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                info.hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])
        return [self._infos[n] for n in sorted(self._infos)]

    def _collect(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call each implementation of ``hook_name`` separately, remembering which plugin gave what."""
        caller = getattr(self.pm.hook, hook_name)
        results: list[tuple[str, Any]] = []
        for impl in caller.get_hookimpls():  # registration order
            try:
                produced = impl.function(**{k: kwargs[k] for k in impl.argnames})
            except Exception as exc:
                raise PluginLoadError(
                    f'plugin "{impl.plugin_name}" failed in {hook_name}: {exc.__class__.__name__}: {exc}'
                ) from exc
            for item in produced or ():
                results.append((impl.plugin_name, item))
        return results

    def _owner_label(self, plugin_name: str) -> str:
        info = self._infos.get(plugin_name)
        return f'"{plugin_name}" ({info.distribution} {info.version})' if info else f'"{plugin_name}"'

    def trigger_providers(self) -> dict[str, TriggerProvider]:
        """Trigger providers by kind; two providers of one kind are refused, naming both."""
        found: dict[str, TriggerProvider] = {}
        owners: dict[str, str] = {}
        for plugin_name, provider in self._collect("qinglong_trigger_providers"):
            kind = getattr(provider, "kind", None)
            if not isinstance(kind, str) or not kind or not isinstance(provider, TriggerProvider):
                raise PluginLoadError(
                    f"plugin {self._owner_label(plugin_name)} returned {provider!r} from "
                    "qinglong_trigger_providers, which is not a TriggerProvider (kind, validate, "
                    "next_after, latest_at_or_before, describe)"
                )
            if kind in found:
                raise PluginLoadError(
                    f"two plugins provide trigger kind {kind!r}: {self._owner_label(owners[kind])} and "
                    f"{self._owner_label(plugin_name)}; disable one of them"
                )
            found[kind], owners[kind] = provider, plugin_name
        return found

    def backend_specs(self) -> dict[str, SchedulerBackendSpec]:
        """Scheduler backends by name; two of one name are refused, naming both plugins."""
        found: dict[str, SchedulerBackendSpec] = {}
        owners: dict[str, str] = {}
        for plugin_name, spec in self._collect("qinglong_scheduler_backends"):
            if not isinstance(spec, SchedulerBackendSpec):
                raise PluginLoadError(
                    f"plugin {self._owner_label(plugin_name)} returned {spec!r} from "
                    "qinglong_scheduler_backends, which is not a SchedulerBackendSpec"
                )
            if spec.name in found:
                raise PluginLoadError(
                    f"two plugins provide scheduler backend {spec.name!r}: "
                    f"{self._owner_label(owners[spec.name])} and {self._owner_label(plugin_name)}"
                )
            found[spec.name], owners[spec.name] = spec, plugin_name
        return found

    def diagnostic_sinks(self, settings: Any) -> list[DiagnosticSink]:
        """Extra diagnostic sinks from plugins."""
        return [sink for _, sink in self._collect("qinglong_diagnostic_sinks", settings=settings)]

    def lifecycle_components(self, context: HostContext) -> list[LifecycleComponent]:
        """Components to start and stop around the scheduler."""
        components = []
        for plugin_name, component in self._collect("qinglong_lifecycle_components", context=context):
            if not isinstance(component, LifecycleComponent):
                raise PluginLoadError(
                    f"plugin {self._owner_label(plugin_name)} returned {component!r} from "
                    "qinglong_lifecycle_components, which is not a LifecycleComponent"
                )
            components.append(component)
        return components

