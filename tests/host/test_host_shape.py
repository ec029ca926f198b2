"""The shape contracts <- host <- plugins, and meta-tests that every hook is documented and tested."""

from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from qinglong.contracts import hookspecs

from host_helpers import REPO

PACKAGE = REPO / "qinglong"
HOOKS = [name for name in dir(hookspecs.QinglongHookSpecs) if name.startswith("qinglong_")]


def test_import_linter_contracts_hold():
    """Every import-linter contract in pyproject.toml is checked and none is broken: contracts
    import nothing of ours; the host never imports a plugin and imports the worker only from its
    command; the worker and the supervisor never import the host; plugins stay apart; the plugin
    authors' kit imports no host and nothing shipped imports the kit. A broken one would let a
    profile's closure pull in what it must not load (a store driver, the host into the worker
    program); a contract import-linter skipped would not be counted as kept and fails here too."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(declared)} kept, 0 broken." in result.stdout, result.stdout


def _imports_full(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_each_database_driver_is_imported_by_exactly_one_plugin_and_never_by_its_init():
    """A driver imported outside its plugin would leak into the other profiles' closure."""
    owners = {"aiosqlite": "edge_sqlite", "psycopg": "cluster_postgres", "psycopg_pool": "cluster_postgres"}
    for path in PACKAGE.rglob("*.py"):
        imported = _imports(path)
        for driver, plugin in owners.items():
            if driver in imported:
                rel = path.relative_to(PACKAGE).as_posix()
                assert rel.startswith(f"plugins/{plugin}/"), f"{rel} imports {driver}"
                assert not rel.endswith("__init__.py"), f"{rel} imports {driver} at package import time"


def test_host_never_names_a_plugin_module():
    """The host reaches plugins by entry point only (the group is named qinglong.plugins)."""
    for path in (PACKAGE / "host").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"qinglong\.plugins\.\w", text), path
        assert not any(m.startswith("qinglong") and ".plugins" in m for m in _imports_full(path)), path


def test_every_hook_is_prefixed_and_documented_with_when_it_is_called():
    assert HOOKS == sorted(HOOKS) and len(HOOKS) >= 4
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs.QinglongHookSpecs, name)) or ""
        assert "Called" in doc, f"{name} does not say when it is called"
        assert "Return" in doc, f"{name} does not say what it returns"


def test_every_hook_is_exercised_by_a_test_and_described_in_the_plugin_guide():
    tests = "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py") if p.name != Path(__file__).name)
    guide = (REPO / "docs" / "plugins.md").read_text()
    for name in HOOKS:
        assert f"def {name}" in tests, f"no test implements {name}"
        assert name in guide, f"docs/plugins.md does not describe {name}"
