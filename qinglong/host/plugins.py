"""Loading plugins by entry point, and typed access to their hooks.

Only the named entry points of group ``qinglong.plugins`` are imported: the profile's plugins plus
those the settings enable. Every other plugin stays unimported, so a forbidden library (psycopg on
edge) cannot be pulled in by a plugin that merely exists in the environment.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable, Iterable

import pluggy

from qinglong.contracts.diagnostics import DiagnosticSink
from qinglong.contracts.errors import PluginLoadError, quoted
from qinglong.contracts.execution import ExecutorSpec
from qinglong.contracts.hookspecs import (
    ENTRY_POINT_GROUP,
    PROJECT_NAME,
    HostContext,
    LifecycleComponent,
    QinglongHookSpecs,
)
from qinglong.contracts.providers import TriggerCliOptions, TriggerProvider

if TYPE_CHECKING:
    from qinglong.contracts.store import SchedulerBackendSpec

#: While the host calls a hook: (plugin name, item) for every item an implementation returned.
_PRODUCED: contextvars.ContextVar[list[tuple[str, Any]] | None] = contextvars.ContextVar(
    "qinglong_hook_results", default=None
)

_LONG_FLAG = re.compile(r"^--[a-z][a-z0-9]*(-[a-z0-9]+)*$")
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


def _attributed(plugin_name: str, hook_name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` as pluggy should call it: its items remembered as this plugin's, its errors named.

    ``functools.wraps`` keeps the ``hookimpl`` options (``tryfirst``, ``trylast``, ...) and, through
    ``__wrapped__``, the signature pluggy reads the argument names from, so pluggy orders and calls
    the implementation exactly as it would the original.
    """

    @functools.wraps(function)
    def call(*args: Any) -> Any:
        try:
            produced = function(*args)
            # A generator (``yield`` one item at a time, as conda's hooks do) runs here, inside
            # the plugin's frame, so its errors are named too; wrappers then see a plain list.
            if produced is None:
                items = None
            elif isinstance(produced, (str, bytes)) or not hasattr(produced, "__iter__"):
                raise PluginLoadError(
                    f'plugin "{plugin_name}" returned {produced!r} from {hook_name}, '
                    "not an iterable of items (return a list, even of one)"
                )
            else:
                items = list(produced)
        except PluginLoadError:
            raise
        except Exception as exc:
            raise PluginLoadError(
                f'plugin "{plugin_name}" failed in {hook_name}: {exc.__class__.__name__}: {exc}'
            ) from exc
        record = _PRODUCED.get()
        if record is not None and items:
            record.extend((plugin_name, item) for item in items)
        return items

    return call


class _AttributedPlugin:
    """What is registered with pluggy for one plugin: its hook implementations, each attributed.

    Hook wrappers (``wrapper=True`` or ``hookwrapper=True``) are registered unchanged: they see and
    may change the results of the implementations inside them, as pluggy promises.
    """

    def __init__(self, plugin: Any, plugin_name: str, project_name: str) -> None:
        self.__qinglong_plugin__ = plugin
        marker = f"{project_name}_impl"
        for attr in dir(plugin):
            try:
                member = getattr(plugin, attr)
            except Exception:  # a property that raises is not a hook implementation
                continue
            opts = getattr(member, marker, None) if inspect.isroutine(member) else None
            if not isinstance(opts, dict):
                continue
            wrapper = opts.get("wrapper") or opts.get("hookwrapper")
            hook_name = opts.get("specname") or attr
            setattr(self, attr, member if wrapper else _attributed(plugin_name, hook_name, member))

    def __repr__(self) -> str:
        return f"<plugin {self.__qinglong_plugin__!r}>"


class PluginHost:
    """A pluggy manager that knows which entry points exist and loads only those it is told to."""

    def __init__(self, group: str = ENTRY_POINT_GROUP) -> None:
        self.group = group
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(QinglongHookSpecs)
        self._entry_points: dict[str, metadata.EntryPoint] = {}
        self._infos: dict[str, PluginInfo] = {}
        self._load_order: list[str] = []
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
                self.register(plugin, name)
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

    def register(self, plugin: Any, name: str) -> None:
        """Register ``plugin`` under ``name`` so that every item its hooks return is known as its own.

        pluggy calls the hooks (``pm.hook.<name>(...)``): ``tryfirst``, ``trylast`` and hook wrappers
        of any plugin work as pluggy documents them; the host only remembers who returned what.
        """
        for other in self._load_order:
            registered = self.pm.get_plugin(other)
            if getattr(registered, "__qinglong_plugin__", None) is plugin:
                raise ValueError(f"the same object is already registered as plugin {other!r}")
        self._load_order.append(name)
        try:
            self.pm.register(_AttributedPlugin(plugin, name, self.pm.project_name), name=name)
        except BaseException:
            self._load_order.remove(name)
            raise

    def infos(self) -> list[PluginInfo]:
        """Every installed plugin, with the hooks of the loaded ones."""
        for name, info in self._infos.items():
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                info.hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])
        return [self._infos[n] for n in sorted(self._infos)]

    def _collect(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call ``hook_name`` through pluggy; each item comes with the name of the plugin that gave it.

        The order is pluggy's call order (``tryfirst`` first, then the last registered first,
        ``trylast`` last), after every hook wrapper had its say. An item a wrapper added or replaced
        is attributed to the wrapper's plugin.
        """
        caller = getattr(self.pm.hook, hook_name)
        wrappers = [impl.plugin_name for impl in caller.get_hookimpls() if impl.wrapper or impl.hookwrapper]
        by_wrapper = " or ".join(f'"{w}"' for w in wrappers) if wrappers else "an unknown plugin"
        token = _PRODUCED.set([])
        try:
            results = caller(**kwargs)
            produced = _PRODUCED.get() or []
        except PluginLoadError:
            raise
        except Exception as exc:
            # Plain implementations name themselves (see _attributed); this is a wrapper's failure.
            raise PluginLoadError(
                f"the hook wrapper of plugin {by_wrapper} failed in {hook_name}: {exc.__class__.__name__}: {exc}"
            ) from exc
        finally:
            _PRODUCED.reset(token)
        # ``produced`` holds every item while we look them up, so no id() is reused meanwhile.
        origin = {id(item): plugin_name for plugin_name, item in produced}
        collected: list[tuple[str, Any]] = []
        for items in results or ():
            try:
                iterator = iter(items)
            except TypeError:
                raise PluginLoadError(
                    f"{hook_name} gave {items!r} where an iterable of items was expected "
                    f"(a result changed by the hook wrapper of {by_wrapper}?)"
                ) from None
            for item in iterator:
                collected.append((origin.get(id(item), ", ".join(wrappers) or "?"), item))
        return collected

    def _first_loaded(self, *plugin_names: str) -> list[str]:
        """``plugin_names`` in the order they were loaded (the profile's plugins come first)."""
        rank = {name: i for i, name in enumerate(self._load_order)}
        return sorted(plugin_names, key=lambda n: rank.get(n, len(rank)))

    def _owner_label(self, plugin_name: str) -> str:
        info = self._infos.get(plugin_name)
        return f'"{plugin_name}" ({info.distribution} {info.version})' if info else f'"{plugin_name}"'

    def _unique(self, hook: str, expected: str, valid: Callable[[Any], bool],
                key: Callable[[Any], str], duplicate: str,
                check: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
        """The items ``hook`` returns, by ``key``.

        Refused: an item that is not ``valid`` (naming the plugin and ``expected``), whatever
        ``check(plugin_name, item)`` raises, and two items of one key (``duplicate``, formatted
        with ``key`` and the two plugins in load order).
        """
        found: dict[str, Any] = {}
        owners: dict[str, str] = {}
        for plugin_name, item in self._collect(hook):
            if not valid(item):
                raise PluginLoadError(
                    f"plugin {self._owner_label(plugin_name)} returned {item!r} from {hook}, "
                    f"which is not {expected}"
                )
            if check is not None:
                check(plugin_name, item)
            name = key(item)
            if name in found:
                first, second = self._first_loaded(owners[name], plugin_name)
                raise PluginLoadError(duplicate.format(
                    key=repr(name), first=self._owner_label(first), second=self._owner_label(second)))
            found[name], owners[name] = item, plugin_name
        return found

    def trigger_providers(self) -> dict[str, TriggerProvider]:
        """Trigger providers by kind; two providers of one kind are refused, naming both."""
        def valid(provider: Any) -> bool:
            kind = getattr(provider, "kind", None)
            return isinstance(kind, str) and bool(kind) and isinstance(provider, TriggerProvider)

        return self._unique(
            "qinglong_trigger_providers",
            "a TriggerProvider (kind, validate, next_after, latest_at_or_before, describe)",
            valid, lambda provider: provider.kind,
            "two plugins provide trigger kind {key}: {first} and {second}; disable one of them")

    def trigger_cli_options(self, reserved: Iterable[str] = ()) -> dict[str, TriggerCliOptions]:
        """Command-line options of trigger kinds, by kind.

        Refused, naming the plugin: a value that is not a ``TriggerCliOptions``, two declarations
        for one kind, a flag that is not a long option, and a flag in ``reserved`` (the command's
        own options, such as ``--task``).
        """
        reserved = set(reserved)

        def check_flags(plugin_name: str, declared: TriggerCliOptions) -> None:
            for flag in declared.flags():
                if not isinstance(flag, str) or not _LONG_FLAG.match(flag):
                    raise PluginLoadError(
                        f"plugin {self._owner_label(plugin_name)} declares option {flag!r} for trigger kind "
                        f"{declared.kind!r}; options are long flags such as '--every'"
                    )
                if flag in reserved:
                    raise PluginLoadError(
                        f"plugin {self._owner_label(plugin_name)} declares option {flag} for trigger kind "
                        f"{declared.kind!r}, which is an option of the command itself"
                    )

        return self._unique(
            "qinglong_trigger_cli_options", "a TriggerCliOptions",
            lambda declared: isinstance(declared, TriggerCliOptions) and isinstance(declared.kind, str),
            lambda declared: declared.kind,
            "two plugins declare command-line options of trigger kind {key}: {first} and {second}; "
            "disable one of them",
            check_flags)

    def cli_commands(self, reserved: Iterable[str] = ()) -> dict[str, tuple[str, Any]]:
        """Commands plugins add to the command line, by name: ``(plugin name, CliCommand)``.

        Refused, naming the plugin: an item that is not a ``CliCommand``, a declaration the parser
        cannot take (:meth:`~qinglong.contracts.cli.CliCommand.problems`), and a name in
        ``reserved`` (the host's own commands); two plugins declaring one name are refused naming
        both.
        """
        from qinglong.contracts.cli import CliCommand

        reserved = set(reserved)
        owners: dict[int, str] = {}

        def check(plugin_name: str, command: Any) -> None:
            problems = command.problems()
            if problems:
                raise PluginLoadError(f"plugin {self._owner_label(plugin_name)} declares a command the "
                                      f"command line cannot take: {'; '.join(problems)}")
            if command.name in reserved:
                raise PluginLoadError(
                    f"plugin {self._owner_label(plugin_name)} declares command {command.name!r}, which is "
                    f"a command of qinglong itself; rename the plugin's command")
            owners[id(command)] = plugin_name

        found = self._unique(
            "qinglong_cli_commands", "a CliCommand", lambda command: isinstance(command, CliCommand),
            lambda command: command.name,
            "two plugins declare command {key}: {first} and {second}; disable one of them", check)
        return {name: (owners[id(command)], command) for name, command in found.items()}

    def backend_specs(self) -> dict[str, SchedulerBackendSpec]:
        """Scheduler backends by name; two of one name are refused, naming both plugins."""
        from qinglong.contracts.store import SchedulerBackendSpec

        return self._unique(
            "qinglong_scheduler_backends", "a SchedulerBackendSpec",
            lambda spec: isinstance(spec, SchedulerBackendSpec), lambda spec: spec.name,
            "two plugins provide scheduler backend {key}: {first} and {second}")

    def executor_specs(self) -> dict[str, ExecutorSpec]:
        """Executors by name; two of one name are refused, naming both plugins, and so is a name
        no task could state (a task's executor is shaped like an identifier)."""
        from qinglong.contracts.errors import UserError
        from qinglong.contracts.execution import check_executor_name

        def named(plugin_name: str, spec: ExecutorSpec) -> None:
            try:
                check_executor_name("-", spec.name)
            except UserError:
                raise PluginLoadError(
                    f"plugin {self._owner_label(plugin_name)} provides executor {quoted(spec.name)}, which no "
                    "task can name: expected 1-64 ASCII letters, digits, '-', '_' or '.', starting with a "
                    "letter or digit") from None

        return self._unique(
            "qinglong_executors", "an ExecutorSpec (name, create)",
            lambda spec: (isinstance(spec, ExecutorSpec) and isinstance(spec.name, str) and bool(spec.name)
                          and callable(spec.create)),
            lambda spec: spec.name,
            "two plugins provide executor {key}: {first} and {second}; disable one of them", named)

    def worker_protocol_specs(self) -> dict[str, Any]:
        """Worker protocols by name; two of one name are refused, naming both plugins."""
        from qinglong.contracts.worker import WorkerProtocolSpec

        return self._unique(
            "qinglong_worker_protocols", "a WorkerProtocolSpec (name, create_gateway)",
            lambda spec: (isinstance(spec, WorkerProtocolSpec) and isinstance(spec.name, str)
                          and bool(spec.name) and callable(spec.create_gateway)),
            lambda spec: spec.name,
            "two plugins provide worker protocol {key}: {first} and {second}; disable one of them")

    def notifier_specs(self) -> dict[str, Any]:
        """Notifier kinds by name; two of one kind are refused, naming both plugins."""
        from qinglong.contracts.events import NotifierSpec

        return self._unique(
            "qinglong_notifiers", "a NotifierSpec (kind, create)",
            lambda spec: (isinstance(spec, NotifierSpec) and isinstance(spec.kind, str)
                          and bool(spec.kind) and callable(spec.create)),
            lambda spec: spec.kind,
            "two plugins provide notifier kind {key}: {first} and {second}; disable one of them")

    def diagnostic_sinks(self, settings: Any) -> list[DiagnosticSink]:
        """Extra diagnostic sinks from plugins."""
        return [sink for _, sink in self._collect("qinglong_diagnostic_sinks", settings=settings)]

    def event_sources(self, context: Any) -> list[LifecycleComponent]:
        """Event sources: components that admit occurrences through ``context.admit``."""
        components = []
        for plugin_name, component in self._collect("qinglong_event_sources", context=context):
            if not isinstance(component, LifecycleComponent):
                raise PluginLoadError(
                    f"plugin {self._owner_label(plugin_name)} returned {component!r} from "
                    "qinglong_event_sources, which is not a LifecycleComponent"
                )
            components.append(component)
        return components

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


