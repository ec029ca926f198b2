"""Dependency-closure checks: what a profile's host imports, and what its environment installs.

``check_closure`` boots the profile's host in a fresh interpreter started with ``-X importtime``
(settings loaded, plugins loaded, container built, backend created, nothing started or connected),
lists ``sys.modules``, and names every forbidden module found with the import chain that pulled it
in, read from the interpreter's own import-time tree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .profiles import ProfileDefinition

_IMPORTTIME = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|(?P<name>.*)$")

_BOOT = """
import json, sys
from qinglong.host.cli import boot_for_closure
modules = boot_for_closure(sys.argv[1], sys.argv[2] or None)
sys.stdout.write("QINGLONG-MODULES " + json.dumps(sorted(modules)) + "\\n")
"""


@dataclass
class Violation:
    """A forbidden module found in ``sys.modules`` and how it got there (outermost first)."""

    module: str
    rule: str
    chain: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"module": self.module, "forbidden_by": self.rule, "import_chain": self.chain}


@dataclass
class ClosureReport:
    """The result of one closure check."""

    profile: str
    modules: int = 0
    violations: list[Violation] = field(default_factory=list)
    installed_violations: list[str] = field(default_factory=list)
    checked_installed: bool = False
    boot_error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the boot worked and nothing forbidden was loaded (or installed, if checked)."""
        return self.boot_error is None and not self.violations and not self.installed_violations

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "profile": self.profile,
            "ok": self.ok,
            "modules_loaded": self.modules,
            "violations": [v.as_json() for v in self.violations],
            "installed_distributions_checked": self.checked_installed,
            "forbidden_distributions_installed": self.installed_violations,
            "boot_error": self.boot_error,
        }


def _matches(module: str, rule: str) -> bool:
    return module == rule or module.startswith(rule + ".")


def parse_import_tree(stderr: str) -> list[tuple[int, str]]:
    """``(depth, module)`` lines of ``-X importtime`` output, in the order printed (children first)."""
    rows = []
    for line in stderr.splitlines():
        match = _IMPORTTIME.match(line)
        if not match or "imported package" in line:
            continue
        raw = match.group("name")
        stripped = raw.lstrip(" ")
        depth = (len(raw) - len(stripped) - 1) // 2
        rows.append((depth, stripped.strip()))
    return rows


def import_chain(rows: list[tuple[int, str]], module: str) -> list[str]:
    """The chain of imports (outermost first) that first imported ``module``.

    ``-X importtime`` prints a module after everything it imported, indented by nesting depth; a
    module's parent is the next line printed at one level less.
    """
    for index, (depth, name) in enumerate(rows):
        if name != module:
            continue
        chain = [name]
        want = depth - 1
        for later_depth, later_name in rows[index + 1:]:
            if want < 0:
                break
            if later_depth == want:
                chain.append(later_name)
                want -= 1
        return list(reversed(chain))
    return [module]


def check_installed(profile: ProfileDefinition) -> list[str]:
    """Forbidden distributions installed in this environment (``name version``)."""
    found = []
    for name in profile.forbidden_distributions:
        try:
            found.append(f"{name} {metadata.distribution(name).version}")
        except metadata.PackageNotFoundError:
            continue
    return found


def check_closure(
    profile: ProfileDefinition, settings_path: str | None = None, *, installed: bool = False
) -> ClosureReport:
    """Boot ``profile`` in a fresh interpreter and compare its modules with the forbidden list."""
    report = ClosureReport(profile.name, checked_installed=installed)
    if installed:
        report.installed_violations = check_installed(profile)
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _BOOT, profile.name, settings_path or ""],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    marker = [line for line in proc.stdout.splitlines() if line.startswith("QINGLONG-MODULES ")]
    if proc.returncode != 0 or not marker:
        tree_free = "\n".join(
            line for line in proc.stderr.splitlines() if not line.startswith("import time:")
        ).strip()
        report.boot_error = tree_free.splitlines()[-1] if tree_free else f"exit code {proc.returncode}"
        return report
    modules = json.loads(marker[-1].split(" ", 1)[1])
    report.modules = len(modules)
    rows = parse_import_tree(proc.stderr)
    for module in modules:
        for rule in profile.forbidden_modules:
            if _matches(module, rule):
                report.violations.append(Violation(module, rule, import_chain(rows, module)))
                break
    return report
