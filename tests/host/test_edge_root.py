"""The edge profile's composition root: the declarative wiring, without dependency-injector."""

from __future__ import annotations

import subprocess
import sys

from qinglong.host.containers import EdgeContainer, build_container
from qinglong.host.di_containers import HostContainer
from qinglong.host.settings import load_settings


def _loaded(tmp_path):
    settings = tmp_path / "s.toml"
    settings.write_text(f'profile = "edge"\n[scheduler]\ncadence_ms = 700\n[lifecycle]\n'
                        f'stop_timeout_ms = 4321\n[backend]\npath = "{tmp_path / "q.db"}"\n'
                        '[http]\nlisten = "127.0.0.1:0"\n')
    return load_settings(settings)


def _edge_boot_modules(tmp_path) -> list[str]:
    """The modules an edge ``qinglong run`` has loaded once booted (command line, settings,
    plugins, container, backend created, lifecycle), from a fresh interpreter."""
    settings = tmp_path / "s.toml"
    settings.write_text(f'[backend]\npath = "{tmp_path / "q.db"}"\n')
    code = ("import sys\n"
            "from qinglong.host.closure import boot_for_closure\n"
            f"print(repr(sorted(boot_for_closure('edge', {str(settings)!r}))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])  # a printed list of module names


def test_edge_boot_never_imports_dependency_injector(tmp_path):
    """dependency-injector's compiled containers cost a router 2.3 MiB of resident memory at
    every ``qinglong run``; an edge boot must not import any of it."""
    assert [m for m in _edge_boot_modules(tmp_path) if m.startswith("dependency_injector.")] == []


def test_edge_boot_leaves_the_publisher_and_apply_contract_unimported(tmp_path):
    """``qinglong run`` publishes nothing itself: importing the store's publisher (and the apply
    contract it brings) and its tokens module at every start would hold them for nothing."""
    modules = _edge_boot_modules(tmp_path)
    assert "qinglong.plugins.edge_sqlite.backend" in modules
    held = {"qinglong.plugins.edge_sqlite.publisher", "qinglong.plugins.edge_sqlite.tokens",
            "qinglong.contracts.apply"} & set(modules)
    assert held == set()


def test_edge_root_offers_every_provider_of_the_declarative_root(tmp_path):
    """A provider added to the declarative wiring but not to the edge root would be missing on
    a router only (an AttributeError at the first command that asks for it)."""
    root = build_container(_loaded(tmp_path))
    assert isinstance(root, EdgeContainer)
    missing = [name for name in HostContainer.providers if name != "config"
               and not callable(getattr(root, name, None))]
    assert missing == []


def test_edge_root_builds_what_the_declarative_root_builds(tmp_path):
    """The two wirings of one profile must not drift: the same settings reach the same limits,
    owner, backend settings, providers and lifecycle parameters, and each provider is built once."""
    loaded = _loaded(tmp_path)
    edge = EdgeContainer(loaded)
    declarative = HostContainer(loaded=loaded)
    declarative.config.from_pydantic(loaded.settings)
    for name in ("limits", "owner", "backend_settings", "owner_strategy", "clock_ms"):
        assert getattr(edge, name)() == getattr(declarative, name)(), name
    assert sorted(edge.trigger_providers()) == sorted(declarative.trigger_providers())
    assert type(edge.backend()) is type(declarative.backend())
    assert edge.backend_context().limits == declarative.backend_context().limits
    ours, theirs = edge.lifecycle(), declarative.lifecycle()
    for attribute in ("profile", "cadence_ms", "start_step_timeout_ms", "start_wait_ms",
                      "stop_timeout_ms"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert (ours.cadence_ms, ours.stop_timeout_ms) == (700, 4321)
    assert ours.settings is loaded.settings and ours.backend is edge.backend()
    assert ours.admission_factory is not None and theirs.admission_factory is not None
    assert edge.lifecycle() is ours and edge.plugin_host() is edge.plugin_host()
