"""What the worker program and the job supervisor pull in when imported, seen from a fresh
interpreter (as psycopg's lazy-import tests do): import-linter checks our own packages' imports,
this checks the whole closure, third-party libraries included."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = ("import json, sys\nimport {module}\n"
         "print(json.dumps(sorted(m for m in sys.modules)))\n")

#: What neither may load: the host (and with it settings, plugin loading, the CLI), any plugin,
#: the store drivers, and the host's libraries.
FORBIDDEN_PREFIXES = ("qinglong.host", "qinglong.plugins", "psycopg", "psycopg_pool", "aiosqlite",
                      "pluggy", "dependency_injector", "pydantic", "pydantic_settings", "prometheus_client")


def _loaded(module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def _forbidden(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in FORBIDDEN_PREFIXES)]


def test_the_worker_program_loads_neither_the_host_nor_a_store_driver():
    """The worker talks to its store through the worker protocol a plugin hands in; if importing
    it loaded the host or a driver, a worker machine could not be installed without the control
    plane's libraries and PostgreSQL's client, and the worker would carry code it must not reach."""
    loaded = _loaded("qinglong.worker")
    assert "qinglong.worker.runtime" in loaded and "qinglong.supervisor" in loaded
    assert _forbidden(loaded) == []


def test_the_job_supervisor_loads_contracts_only():
    """The supervisor is shared by the host and the worker; anything more than the contracts in
    its closure would be forced on both programs (and on a router's memory budget)."""
    loaded = _loaded("qinglong.supervisor")
    ours = sorted({m.split(".")[1] for m in loaded if m.startswith("qinglong.")})
    assert ours == ["contracts", "supervisor"]
    assert _forbidden(loaded) == []
