"""The plugin interface is documented and tested hook by hook, as strictly as datasette does.

Every hook specification must have a test named ``test_hook_<hook>...``, its exact signature as a
heading in docs/plugins.md, and a docstring saying its parameters, when it is called, what it
returns, and what happens when it returns nothing or raises.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re

import pytest

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.hookspecs import QinglongHookSpecs, Settings
from qinglong.host.containers import build_container
from qinglong.host.plugins import PluginHost
from qinglong.host.settings import load_settings

from host_helpers import REPO

HOOKS = sorted(name for name, _ in inspect.getmembers(QinglongHookSpecs, inspect.isfunction)
               if name.startswith("qinglong_"))
_HEADING = re.compile(r"^#### `(qinglong_\w+\(.*\) -> .+)`$", re.MULTILINE)


def _declared_signature(name: str) -> str:
    """``name(param: Type, ...) -> Return`` from the hookspec, annotations as written."""
    spec = inspect.signature(getattr(QinglongHookSpecs, name))
    params = [p for p in spec.parameters.values() if p.name != "self"]

    def text(annotation: object) -> str:
        return str(annotation).replace('"', "").replace("'", "")

    inner = ", ".join(f"{p.name}: {text(p.annotation)}" for p in params)
    return f"{name}({inner}) -> {text(spec.return_annotation)}"


def test_the_hook_list_is_not_empty():
    """The meta-tests below would pass vacuously on an empty list."""
    assert "qinglong_trigger_providers" in HOOKS and len(HOOKS) >= 5


def test_every_hook_has_a_test_named_for_it():
    """A hook without a test of its own can break for plugin authors while the suite stays green."""
    names = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_hook_"):
                names.add(node.name)
    missing = [hook for hook in HOOKS if not any(n.startswith(f"test_hook_{hook}") for n in names)]
    assert missing == []


def test_docs_show_every_hook_with_its_exact_signature():
    """A plugin author copies the signature from docs/plugins.md; a stale one is a hook that
    check_pending refuses or an argument that never arrives."""
    documented = _HEADING.findall((REPO / "docs" / "plugins.md").read_text())
    assert sorted(documented) == sorted(_declared_signature(hook) for hook in HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_docstring_says_when_what_and_what_if_it_fails(hook):
    """pytest's hookspec.py style: parameters, lifecycle moment, result, and the empty and failing cases."""
    function = getattr(QinglongHookSpecs, hook)
    doc = " ".join((inspect.getdoc(function) or "").split())
    params = [p for p in inspect.signature(function).parameters if p != "self"]
    for param in params:
        assert f":param {param}:" in doc, f"{hook} does not describe :param {param}:"
    assert "Called" in doc, f"{hook} does not say when it is called"
    assert ":returns:" in doc, f"{hook} does not say what it returns"
    assert "Returning nothing" in doc, f"{hook} does not say what returning nothing means"
    assert "Raising" in doc, f"{hook} does not say what happens when it raises"


SINK_PLUGIN = '''
from qinglong.contracts.hookspecs import Settings, hookimpl, plugin_settings

RECEIVED = []
SETTINGS = []


class Sink:
    def __init__(self, prefix):
        self.prefix = prefix

    def emit(self, event):
        RECEIVED.append(f"{self.prefix}{event.message}")


@hookimpl
def qinglong_diagnostic_sinks(settings):
    SETTINGS.append(isinstance(settings, Settings))
    return [Sink(plugin_settings(settings, "audit")["prefix"])]
'''


def test_hook_qinglong_diagnostic_sinks_gets_typed_settings_and_redacted_events(site, tmp_path, monkeypatch):
    """A sink must receive the validated settings (its own table readable) and only redacted text:
    a DSN password in an event would otherwise reach a plugin's log shipping."""
    site.add_distribution("acme-audit", {"acme_audit.py": SINK_PLUGIN}, {"audit": "acme_audit"})
    monkeypatch.syspath_prepend(str(site.root))
    monkeypatch.delitem(importlib.sys.modules, "acme_audit", raising=False)
    importlib.invalidate_caches()
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["audit"]\n[plugins.settings.audit]\nprefix = "audit: "\n'
                        '[diagnostics]\nlevel = "error"\n')
    container = build_container(load_settings(settings))
    container.diagnostics().emit(DiagnosticEvent("error", "test.event",
                                                 "cannot reach postgresql://app:hunter2@db/q"))
    module = importlib.import_module("acme_audit")
    assert module.SETTINGS == [True]
    assert module.RECEIVED == ["audit: cannot reach postgresql://app:***@db/q"]


BACKEND_PLUGIN = '''
from pydantic import BaseModel, ConfigDict

from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.store import SchedulerBackendSpec


class MemorySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")


def create(context):
    raise AssertionError("create must not be called while backends are only listed")


@hookimpl
def qinglong_scheduler_backends():
    yield SchedulerBackendSpec(name="acme_memory", settings_model=MemorySettings, create=create)
'''


def test_hook_qinglong_scheduler_backends_offers_a_third_party_backend_by_name(site, monkeypatch):
    """A backend from another distribution must be found by its name beside the built-in ones,
    without being created (create may connect; listing must not)."""
    site.add_distribution("acme-memory", {"acme_memory.py": BACKEND_PLUGIN}, {"memory": "acme_memory"})
    monkeypatch.syspath_prepend(str(site.root))
    monkeypatch.delitem(importlib.sys.modules, "acme_memory", raising=False)
    importlib.invalidate_caches()
    host = PluginHost()
    host.load(["edge_sqlite", "memory"])
    specs = host.backend_specs()
    assert sorted(specs) == ["acme_memory", "edge_sqlite"]
    assert specs["acme_memory"].settings_model.__name__ == "MemorySettings"


def test_the_host_settings_satisfy_the_settings_protocol_of_the_contracts():
    """Plugins are typed against contracts' ``Settings``; the host's model must keep providing it."""
    assert isinstance(load_settings().settings, Settings)


EXECUTOR_PLUGIN = '''
from qinglong.contracts.execution import ExecutorSpec
from qinglong.contracts.hookspecs import hookimpl

CONTEXTS = []


class NullExecutor:
    name = "acme_null"

    def __init__(self, context):
        CONTEXTS.append(context)


@hookimpl
def qinglong_executors():
    yield ExecutorSpec(name="acme_null", create=NullExecutor, description="does nothing")
'''

RIVAL_EXECUTOR_PLUGIN = '''
from qinglong.contracts.execution import ExecutorSpec
from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_executors():
    return [ExecutorSpec(name="acme_null", create=lambda context: None)]
'''


def _add_executor_plugins(site, monkeypatch):
    site.add_distribution("acme-null", {"acme_null.py": EXECUTOR_PLUGIN}, {"null": "acme_null"})
    site.add_distribution("acme-rival", {"acme_rival.py": RIVAL_EXECUTOR_PLUGIN}, {"rival": "acme_rival"})
    monkeypatch.syspath_prepend(str(site.root))
    for module in ("acme_null", "acme_rival"):
        monkeypatch.delitem(importlib.sys.modules, module, raising=False)
    importlib.invalidate_caches()


def test_hook_qinglong_executors_offers_a_third_party_executor_created_with_the_execution_context(
        site, tmp_path, monkeypatch):
    """A third party's executor must be found by name and built with the settings' context: a
    wrong log directory would put Attempt logs where retention never looks, and the control
    plane's own environment (which may hold its secrets) must never become a job's base."""
    from qinglong.host.containers import create_executors, executor_context

    _add_executor_plugins(site, monkeypatch)
    monkeypatch.setenv("QINGLONG_TEST_SECRET", "hunter2")
    settings = tmp_path / "s.toml"
    settings.write_text(f'[plugins]\nenable = ["null"]\n[backend]\npath = "{tmp_path / "q.db"}"\n'
                        '[execution]\nkill_grace_ms = 1500\n')
    loaded = load_settings(settings)
    container = build_container(loaded)
    host = container.plugin_host()
    assert "acme_null" in host.executor_specs()
    context = executor_context(loaded, container.backend_settings())
    executors = create_executors(host, context)
    assert executors["acme_null"].__class__.__name__ == "NullExecutor"
    made = importlib.import_module("acme_null").CONTEXTS[-1]
    assert made.log_dir == str(tmp_path / "q.db") + ".logs"
    assert made.kill_grace_ms == 1500
    assert "QINGLONG_TEST_SECRET" not in made.base_env and set(made.base_env) <= {"PATH", "LANG", "HOME"}


def test_hook_qinglong_executors_refuses_two_plugins_offering_one_name(site, monkeypatch):
    """Two executors of one name would leave it to load order which one runs a task's processes."""
    from qinglong.contracts.errors import PluginLoadError

    _add_executor_plugins(site, monkeypatch)
    host = PluginHost()
    host.load(["null", "rival"])
    with pytest.raises(PluginLoadError) as err:
        host.executor_specs()
    assert "two plugins provide executor 'acme_null'" in str(err.value)
    assert '"null" (acme-null 0.1.0)' in str(err.value) and '"rival" (acme-rival 0.1.0)' in str(err.value)


MISNAMED_EXECUTOR_PLUGIN = '''
from qinglong.contracts.execution import ExecutorSpec
from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_executors():
    return [ExecutorSpec(name="acme gpu pool", create=lambda context: None)]
'''


def test_hook_qinglong_executors_refuses_a_name_no_task_can_state(site, monkeypatch):
    """A task names its executor with an identifier (``--executor NAME`` is refused otherwise):
    an executor offered as ``acme gpu pool`` would be loaded and could never run a task, silently.
    Refused at load, naming the plugin and the name."""
    from qinglong.contracts.errors import PluginLoadError

    site.add_distribution("acme-misnamed", {"acme_misnamed.py": MISNAMED_EXECUTOR_PLUGIN},
                          {"misnamed": "acme_misnamed"})
    monkeypatch.syspath_prepend(str(site.root))
    monkeypatch.delitem(importlib.sys.modules, "acme_misnamed", raising=False)
    importlib.invalidate_caches()
    host = PluginHost()
    host.load(["misnamed"])
    with pytest.raises(PluginLoadError) as err:
        host.executor_specs()
    assert "provides executor 'acme gpu pool', which no task can name" in str(err.value), err.value
    assert '"misnamed" (acme-misnamed 0.1.0)' in str(err.value), err.value


WORKER_PROTOCOL_PLUGIN = '''
from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.worker import WorkerProtocolSpec

CONNECTED = []


async def connect(dsn, application_name, pool_size):
    CONNECTED.append((dsn, application_name, pool_size))
    return "a gateway pool"


@hookimpl
def qinglong_worker_protocols():
    yield WorkerProtocolSpec(name="acme_gateway", create_gateway=connect, description="another store's gateway")
'''

RIVAL_WORKER_PROTOCOL_PLUGIN = '''
from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.worker import WorkerProtocolSpec


@hookimpl
def qinglong_worker_protocols():
    return [WorkerProtocolSpec(name="acme_gateway", create_gateway=lambda dsn, name, size: None)]
'''

BAD_WORKER_PROTOCOL_PLUGIN = '''
from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_worker_protocols():
    return [("acme_gateway", "not a spec")]
'''


def _add_worker_protocol_plugins(site, monkeypatch):
    site.add_distribution("acme-gateway", {"acme_gateway.py": WORKER_PROTOCOL_PLUGIN}, {"gateway": "acme_gateway"})
    site.add_distribution("acme-rival-gateway", {"acme_rival_gateway.py": RIVAL_WORKER_PROTOCOL_PLUGIN},
                          {"rival_gateway": "acme_rival_gateway"})
    site.add_distribution("acme-bad-gateway", {"acme_bad_gateway.py": BAD_WORKER_PROTOCOL_PLUGIN},
                          {"bad_gateway": "acme_bad_gateway"})
    monkeypatch.syspath_prepend(str(site.root))
    for module in ("acme_gateway", "acme_rival_gateway", "acme_bad_gateway"):
        monkeypatch.delitem(importlib.sys.modules, module, raising=False)
    importlib.invalidate_caches()


def test_hook_qinglong_worker_protocols_offers_a_third_party_protocol_by_name(site, monkeypatch):
    """The gateway picks its store's side by name: one offered by a third party's store must be
    found under its name and opened through its own factory, and the cluster profile's own store
    must offer one, or the gateway has nothing to serve workers from."""
    import asyncio

    _add_worker_protocol_plugins(site, monkeypatch)
    host = PluginHost()
    host.load(["gateway", "cluster_postgres"])
    specs = host.worker_protocol_specs()
    assert sorted(specs) == ["acme_gateway", "cluster_postgres"]
    assert asyncio.run(specs["acme_gateway"].create_gateway("dsn-value", "qinglong gateway", 2)) == "a gateway pool"
    assert importlib.import_module("acme_gateway").CONNECTED == [("dsn-value", "qinglong gateway", 2)]


def test_hook_qinglong_worker_protocols_refuses_two_plugins_offering_one_name(site, monkeypatch):
    """Two protocols of one name would leave it to load order which store a worker talks to."""
    from qinglong.contracts.errors import PluginLoadError

    _add_worker_protocol_plugins(site, monkeypatch)
    host = PluginHost()
    host.load(["gateway", "rival_gateway"])
    with pytest.raises(PluginLoadError) as err:
        host.worker_protocol_specs()
    assert "two plugins provide worker protocol 'acme_gateway'" in str(err.value)
    assert '"gateway" (acme-gateway 0.1.0)' in str(err.value)
    assert '"rival_gateway" (acme-rival-gateway 0.1.0)' in str(err.value)


def test_hook_qinglong_worker_protocols_refuses_an_item_that_is_not_a_spec_naming_the_plugin(site, monkeypatch):
    """An item without a name and a factory would fail only when a worker starts, far from the
    plugin that returned it."""
    from qinglong.contracts.errors import PluginLoadError

    _add_worker_protocol_plugins(site, monkeypatch)
    host = PluginHost()
    host.load(["bad_gateway"])
    with pytest.raises(PluginLoadError) as err:
        host.worker_protocol_specs()
    assert "acme-bad-gateway" in str(err.value) and "not a WorkerProtocolSpec" in str(err.value)
