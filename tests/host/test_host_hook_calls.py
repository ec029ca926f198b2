"""pluggy calls the hooks: third-party plugins get ``tryfirst``, ``trylast`` and hook wrappers.

Each plugin here is a real distribution (a ``.dist-info`` with an entry point on ``sys.path``),
discovered and imported by the host exactly as a pip-installed one would be.
"""

from __future__ import annotations

import importlib

import pytest

from qinglong.contracts.errors import PluginLoadError
from qinglong.host.plugins import PluginHost

SINK = '''
from qinglong.contracts.hookspecs import hookimpl


class Sink:
    def __init__(self, label):
        self.label = label

    def emit(self, event):
        pass


@hookimpl{options}
def qinglong_diagnostic_sinks(settings):
    return [Sink("{label}")]
'''

PROVIDER = '''
from qinglong.contracts.hookspecs import hookimpl


class Provider:
    def __init__(self, kind):
        self.kind = kind

    def validate(self, spec):
        return dict(spec)

    def next_after(self, spec, after_ms):
        return after_ms + 1000

    def latest_at_or_before(self, spec, at_ms):
        return at_ms

    def describe(self, spec):
        return self.kind


@hookimpl
def qinglong_trigger_providers():
    return [Provider("{kind}")]
'''

WRAPPER = '''
from qinglong.contracts.hookspecs import hookimpl

SEEN = []


@hookimpl(wrapper=True)
def qinglong_trigger_providers():
    results = yield
    SEEN.extend(sorted(p.kind for items in results for p in items))
    kept = [[p for p in items if p.kind != "{drop}"] for items in results]
    template = next(p for items in results for p in items if p.kind == "{drop}")
    alias = type(template)("{add}")
    return kept + [[alias]]
'''


@pytest.fixture
def installed(site, monkeypatch):
    """``installed(dist, module, source, entry_point)``: a distribution the host can discover."""
    monkeypatch.syspath_prepend(str(site.root))

    def install(dist: str, module: str, source: str, entry_point: str) -> None:
        site.add_distribution(dist, {f"{module}.py": source}, {entry_point: module})
        monkeypatch.delitem(importlib.sys.modules, module, raising=False)
        importlib.invalidate_caches()

    return install


def test_hook_order_follows_tryfirst_and_trylast_of_third_party_plugins(installed):
    """Calling implementations in registration order put a ``tryfirst`` sink last and a ``trylast``
    one first: a plugin that must see every event first (an audit sink) would see it after others,
    and components would start in an order no plugin asked for."""
    installed("acme-late", "acme_order_late", SINK.format(options="(trylast=True)", label="late"), "late")
    installed("acme-early", "acme_order_early", SINK.format(options="(tryfirst=True)", label="early"), "early")
    installed("acme-plain", "acme_order_plain", SINK.format(options="", label="plain"), "plain")
    host = PluginHost()
    host.load(["late", "early", "plain"])
    assert [sink.label for sink in host.diagnostic_sinks(None)] == ["early", "plain", "late"]


def test_hook_wrapper_of_a_third_party_plugin_sees_and_changes_the_results(installed):
    """A ``wrapper=True`` implementation was called like a plain one (its generator became an
    item), so a plugin that filters or decorates other plugins' providers broke the host."""
    installed("acme-tick", "acme_wrap_tick", PROVIDER.format(kind="tick"), "tick")
    installed("acme-wrap", "acme_wrap_wrapper", WRAPPER.format(drop="tick", add="tock"), "wrap")
    host = PluginHost()
    host.load(["cron", "tick", "wrap"])
    providers = host.trigger_providers()
    assert sorted(providers) == ["cron", "tock"]
    assert importlib.import_module("acme_wrap_wrapper").SEEN == ["cron", "tick"]


def test_an_item_a_hook_wrapper_adds_is_attributed_to_the_wrapper_plugin(installed):
    """A duplicate kind must name who really offered it, or the operator disables the wrong plugin."""
    installed("acme-tick", "acme_attr_tick", PROVIDER.format(kind="tick"), "tick")
    installed("acme-wrap", "acme_attr_wrapper", WRAPPER.format(drop="none", add="tick").replace(
        'if p.kind == "none"', 'if p.kind == "tick"'), "wrap")
    host = PluginHost()
    host.load(["cron", "tick", "wrap"])
    with pytest.raises(PluginLoadError) as raised:
        host.trigger_providers()
    assert ('two plugins provide trigger kind \'tick\': "tick" (acme-tick 0.1.0) and '
            '"wrap" (acme-wrap 0.1.0)') in str(raised.value)


RAISES_MIDWAY = '''
from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_trigger_providers():
    yield from ()
    raise RuntimeError("no luck today")
'''


def test_a_plugin_failing_in_a_generator_hook_is_named(cli, site, tmp_path):
    """A hook written as a generator failed outside the host's guard: the user got a traceback
    (exit 1, 'a bug') instead of the plugin's name and its error."""
    site.add_distribution("acme-boom", {"acme_boom.py": RAISES_MIDWAY}, {"boom": "acme_boom"}, version="1.2.0")
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["boom"]\n')
    result = cli("--settings", str(settings), "trigger", "list", env=site.env())
    assert result.returncode == 3, result.stderr
    assert 'plugin "boom" failed in qinglong_trigger_providers: RuntimeError: no luck today' in result.stderr
    assert "Traceback" not in result.stderr


NOT_ITERABLE = '''
from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_diagnostic_sinks(settings):
    return 42
'''


def test_a_hook_returning_a_single_value_instead_of_an_iterable_is_named(installed):
    """A bare value must be refused naming the plugin, not end in a TypeError from the host."""
    installed("acme-bare", "acme_bare", NOT_ITERABLE, "bare")
    host = PluginHost()
    host.load(["bare"])
    with pytest.raises(PluginLoadError, match=r'plugin "bare" returned 42 from qinglong_diagnostic_sinks, '
                                              r"not an iterable of items"):
        host.diagnostic_sinks(None)


FAILING_WRAPPER = '''
from qinglong.contracts.hookspecs import hookimpl


@hookimpl(wrapper=True)
def qinglong_trigger_providers():
    yield
    raise RuntimeError("wrapper gave up")
'''


def test_a_failing_hook_wrapper_is_named(installed):
    """A wrapper's exception left the guard of every implementation: a traceback (exit 1, 'a bug')
    instead of the plugin to disable."""
    installed("acme-giveup", "acme_giveup", FAILING_WRAPPER, "giveup")
    host = PluginHost()
    host.load(["cron", "giveup"])
    with pytest.raises(PluginLoadError, match=r'the hook wrapper of plugin "giveup" failed in '
                                              r"qinglong_trigger_providers: RuntimeError: wrapper gave up"):
        host.trigger_providers()
