"""The suite's shape: one support package, reached the pytest way."""

from __future__ import annotations

import ast

from suite_helpers import ROOT


def _imports(path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_benchmarks_import_no_test_module():
    """A benchmark importing the suite's modules breaks whenever a test helper moves, and pulls
    fixtures' import side effects into a measurement; they share devtools/ instead."""
    offenders = {p.name: sorted(m for m in _imports(p) if m == "tests" or m.startswith("tests."))
                 for p in sorted((ROOT / "bench").glob("*.py"))}
    assert not {k: v for k, v in offenders.items() if v}


def test_no_test_module_imports_a_conftest_or_edits_sys_path():
    """A conftest imported as a module registers its fixtures twice and resolves to whichever
    conftest was loaded first; a sys.path edit makes the import depend on which file ran first.
    The support package is loaded through pytest_plugins and found through pyproject's pythonpath."""
    conftest_imports, path_edits = [], []
    edit = "sys.path." + "insert("  # spelled apart, so this file does not find itself
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if any(m == "conftest" or m.endswith(".conftest") for m in _imports(path)):
            conftest_imports.append(str(path.relative_to(ROOT)))
        if edit in path.read_text() and path.name != "regenerate_fingerprint.py":
            path_edits.append(str(path.relative_to(ROOT)))
    assert not conftest_imports, conftest_imports
    assert not path_edits, path_edits
