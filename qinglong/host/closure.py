"""Dependency-closure checks: what a profile's host imports, and what its environment installs.

``check_closure`` boots the profile's host in a fresh interpreter (settings loaded, plugins loaded,
container built, backend created, nothing started or connected), lists ``sys.modules``, and names
every forbidden module found with the import chain that pulled it in. The chain comes from a
meta-path finder installed first in that interpreter: it records, for each module's first import,
which module's code asked for it (``-X importtime`` cannot do this: it does not see modules loaded
through ``importlib.import_module``, which is how entry points are loaded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .profiles import ProfileDefinition

_BOOT = """
import json, sys

class ImporterTracker:
    # Records who first asked for each module; finds nothing itself.
    def __init__(self):
        self.importer = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.importer:
            frame = sys._getframe(1)
            while frame is not None:
                name = frame.f_globals.get("__name__") or ""
                if not frame.f_code.co_filename.startswith("<frozen") and name.split(".")[0] != "importlib":
                    break
                frame = frame.f_back
            self.importer[fullname] = name if frame is not None else ""
        return None

tracker = ImporterTracker()
sys.meta_path.insert(0, tracker)
from qinglong.host.closure import boot_for_closure
modules = boot_for_closure(sys.argv[1], sys.argv[2] or None)
sys.stdout.write("QINGLONG-MODULES " + json.dumps({"modules": sorted(modules), "importer": tracker.importer}) + "\\n")
"""


#: ``check closure --profile worker``: the worker program speaking to the API tier's gateway
#: (``pip install 'qinglong[worker]'``); what it must never load is the cluster profile's [worker].
WORKER_CLOSURE = "worker"


def worker_closure_profile() -> ProfileDefinition:
    """What ``check closure --profile worker`` checks: the cluster profile's worker, through the
    gateway, with the forbidden lists of the cluster profile's [worker] table."""
    import dataclasses

    from .profiles import load_profile

    cluster = load_profile("cluster")
    return dataclasses.replace(cluster, name=WORKER_CLOSURE,
                               forbidden_modules=cluster.worker_forbidden_modules,
                               forbidden_distributions=cluster.worker_forbidden_distributions)


def boot_for_closure(profile: str, settings_path: str | None) -> list[str]:
    """Boot ``profile`` as ``qinglong run`` would, without starting or connecting; list modules.

    The command line is loaded and its parser built as ``qinglong run`` builds it, then the
    settings, plugins and container, and the backend is created but not opened. Used by ``check
    closure`` in a fresh interpreter.
    """
    if profile == WORKER_CLOSURE:
        from .cli.worker import boot_worker_for_closure

        return boot_worker_for_closure(settings_path)
    from .cli.main import build_parser, command_groups_for
    from .containers import build_container
    from .settings import load_settings

    build_parser(groups=command_groups_for(["run"]))
    container = build_container(load_settings(settings_path, profile=profile))
    container.lifecycle()  # resolves plugins, providers, diagnostics, backend (created, not opened)
    return list(sys.modules)


@dataclass
class Violation:
    """A forbidden module found in ``sys.modules`` and how it got there (outermost first)."""

    module: str
    rule: str
    chain: list[str] = field(default_factory=list)
    submodules: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"module": self.module, "forbidden_by": self.rule, "import_chain": self.chain,
                "submodules_loaded": self.submodules}


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


def import_chain(importer: dict[str, str], module: str) -> list[str]:
    """The chain of imports (outermost first) that first imported ``module``."""
    chain = [module]
    seen = {module}
    current = importer.get(module, "")
    while current and current != "__main__" and current not in seen:
        chain.append(current)
        seen.add(current)
        current = importer.get(current, "")
    return list(reversed(chain))


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
        [sys.executable, "-c", _BOOT, profile.name, settings_path or ""],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    marker = [line for line in proc.stdout.splitlines() if line.startswith("QINGLONG-MODULES ")]
    if proc.returncode != 0 or not marker:
        lines = proc.stderr.strip().splitlines()
        report.boot_error = lines[-1] if lines else f"exit code {proc.returncode}"
        return report
    booted = json.loads(marker[-1].split(" ", 1)[1])
    report.modules = len(booted["modules"])
    # One violation per forbidden package: the first of its modules loaded (sorted, so the package
    # itself when it was loaded), with the chain that pulled it in; its submodules are listed.
    by_rule: dict[str, Violation] = {}
    for module in booted["modules"]:
        for rule in profile.forbidden_modules:
            if _matches(module, rule):
                if rule in by_rule:
                    by_rule[rule].submodules.append(module)
                else:
                    by_rule[rule] = Violation(module, rule, import_chain(booted["importer"], module))
                break
    report.violations = list(by_rule.values())
    return report
