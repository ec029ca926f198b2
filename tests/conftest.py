"""Suite-wide safety net: no job process outlives the test that started it.

Jobs run in their own sessions (they are meant to survive the control plane), so a test that
fails half-way, or kills ``qinglong run`` on purpose, can leave a job waiting forever for a file
that will never appear. After each test that used ``tmp_path``, every process whose command line
names that directory (a job's wrapper names its Attempt directory) is killed with its group.
"""

from __future__ import annotations

import os
import signal
import warnings

import pytest
from hypothesis import HealthCheck, settings

# No property test depends on the machine's speed: a loaded CI machine may take longer than
# hypothesis's default 200 ms deadline for one example without anything being wrong.
settings.register_profile("qinglong", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("qinglong")

pytest_plugins = ["tests.support.markers", "tests.support.aio", "tests.support.postgres",
                  "tests.support.gateway"]


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's modules once, in the controlling process. Where writing bytecode is
    off (``PYTHONDONTWRITEBYTECODE``, as on some CI machines) nothing else would: every
    ``qinglong`` the suite starts (thousands) would compile its modules from source again, about
    0.15 s of CPU each. Bytecode is still read where it exists; an edited file is compiled again
    because its timestamp no longer matches."""
    if hasattr(config, "workerinput"):
        return
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for package in ("qinglong", "devtools", "tests"):
        compileall.compile_dir(root / package, quiet=2, workers=0)


def _processes_naming(path: str) -> list[tuple[int, int]]:
    found = []
    needle = path.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if needle in cmdline:
                found.append((int(entry), os.getpgid(int(entry))))
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(request):
    if "tmp_path" not in request.fixturenames:
        yield
        return
    path = str(request.getfixturevalue("tmp_path"))  # torn down after this fixture
    yield
    leaked = _processes_naming(path)
    if not leaked:
        return
    for pid, pgid in leaked:
        try:
            if pgid == pid:
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    warnings.warn(f"{request.node.nodeid} left {len(leaked)} process(es) running under {path}; killed")
