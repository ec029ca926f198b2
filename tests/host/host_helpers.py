"""Helpers for host tests: throwaway plugin distributions and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from tests.support import procs as proc_helpers
from tests.support.cliserver import run_qinglong

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]


class SitePath:
    """A folder put on PYTHONPATH that holds plugin modules and their ``.dist-info`` metadata.

    ``importlib.metadata`` finds a ``<name>-<version>.dist-info`` folder on ``sys.path`` exactly as it
    finds a pip-installed distribution, so a plugin written here is discovered through its entry
    point like any third party's, without touching the real environment.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add_distribution(
        self,
        name: str,
        modules: dict[str, str],
        entry_points: dict[str, str],
        version: str = "0.1.0",
        requires: list[str] | None = None,
    ) -> None:
        """Write ``modules`` (file name -> source) and a dist-info registering ``entry_points``."""
        for filename, source in modules.items():
            path = self.root / filename
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        lines = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in requires or []]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
        eps = "[qinglong.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
        (info / "entry_points.txt").write_text(eps)
        (info / "RECORD").write_text("")

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose PYTHONPATH starts with this folder (and the repository)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), str(REPO)])
        env.update(extra)
        return env




def run_cli(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
            python: str = sys.executable, module_args: list[str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m qinglong ARGS`` (or ``python MODULE_ARGS``) in ``cwd``, capturing output."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = str(REPO)
    if module_args is None:
        return run_qinglong(args, cwd=cwd, env=env, timeout=timeout, python=python)
    return subprocess.run([python, *module_args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


class StderrLines:
    """Reads a child's stderr on a thread, so a wait on it never blocks past its own deadline.

    ``readline`` on the pipe blocks until the child writes; reading on a thread and waiting on the
    collected lines with a timeout keeps every wait bounded, and drains the pipe so a chatty child
    never stalls on a full pipe buffer.
    """

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def text(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def wait_for(self, marker: str, timeout: float = 120) -> str:
        """Return stderr so far once a line holds ``marker``; fail with what was seen otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if any(marker in line for line in self.lines):
                    return "".join(self.lines)
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise AssertionError(f"{marker!r} not seen within {timeout:.0f} s "
                                         f"(stderr {'closed' if self._closed else 'open'}); stderr so far:\n"
                                         f"{''.join(self.lines)}")
                self._cond.wait(min(left, 1.0))

    def finish(self, timeout: float = 120) -> str:
        """Wait until the child closes stderr and return all of it."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"stderr still open after {timeout:.0f} s:\n{self.text()}"
        return self.text()


def wait_until(condition: Callable[[], T | None], what: str, timeout: float = 120, every: float = 0.2,
               alive: subprocess.Popen | None = None) -> T:
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` after ``timeout``.

    With ``alive``, fail at once if that child exits first (it will not bring the condition about).
    """
    gone = None
    if alive is not None:
        gone = lambda: f"the child exited ({alive.returncode})" if alive.poll() is not None else None  # noqa: E731
    return proc_helpers.wait_until(condition, what, timeout=timeout, interval=every, gone=gone)

def assert_exactly_once_grid(runs: list[dict], key_prefix: str, step_ms: int = 1000,
                             grace_ms: int = 60_000) -> None:
    """Runs of one every-``step_ms`` trigger: one per occurrence, no gap, none twice, none early.

    ``lag_ms`` is at least 0 (never admitted before its time) and at most the misfire grace (an
    older occurrence is a misfire, not a Run); how late within that depends on the machine, so it is
    not bounded tighter.
    """
    keys = [r["idempotency_key"] for r in runs]
    assert len(set(keys)) == len(keys), keys
    assert all(k == f"{key_prefix}{r['scheduled_for_ms']}" for k, r in zip(keys, runs)), keys
    slots = sorted(r["scheduled_for_ms"] for r in runs)
    assert slots == list(range(slots[0], slots[-1] + 1, step_ms)), slots
    assert all(0 <= r["lag_ms"] <= grace_ms for r in runs), [r["lag_ms"] for r in runs]
