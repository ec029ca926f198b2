"""Helpers of the execution tests: a workspace (settings, SQLite file, log directory) driven only
through the ``qinglong`` command line, ``qinglong run`` as a real subprocess, and read-only looks at
what it left behind (the SQLite file and the Attempt directories).

Nothing here stands in for a piece of the product: the store, the dispatcher and the executor are
the real ones, in a real ``qinglong run``; the tests only watch the files those write.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from tests.support.procs import group_members  # noqa: F401 (re-exported)
from tests.support import procs as proc_helpers
from tests.support.cliserver import run_qinglong

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

#: Generous bound on any wait: a loaded machine is slow, never this slow.
WAIT_S = 90.0

TERMINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled", "lost"})

#: The event types that end a Run (``run.finished``; a per-state name would count too).
FINISH_EVENTS = ("run.finished", *(f"run.{state}" for state in sorted(TERMINAL)))
#: The event of an ended Attempt that got a successor.
RETRY_EVENT = "run.retry_scheduled"


def finish_events(ws: "Workspace", run_id: str) -> list[str]:
    """The events of ``run_id`` that end it: exactly one for a terminal Run."""
    return [t for t, in ws.sql(f"SELECT type FROM run_events WHERE run_id = ? AND type IN "
                               f"({','.join('?' * len(FINISH_EVENTS))}) ORDER BY seq",
                               (run_id, *FINISH_EVENTS))]


def wait_until(condition: Callable[[], T], what: str, *, timeout: float = WAIT_S, interval: float = 0.05,
               alive: "ControlPlane | None" = None) -> T:
    """Poll ``condition`` until it returns something true; fail naming ``what`` (and the control
    plane's stderr, when one is given and it died) otherwise."""
    def ended() -> str | None:
        if alive is None or alive.process.poll() is None:
            return None
        return f"qinglong run ended (rc {alive.process.returncode}):\n{alive.stderr()}\n"
    return proc_helpers.wait_until(condition, what, timeout=timeout, interval=interval, gone=ended)

class ControlPlane:
    """One ``qinglong run`` subprocess, its stderr in a file (read whole at any time)."""

    def __init__(self, workspace: "Workspace", name: str, *extra: str) -> None:
        self.stderr_path = workspace.root / f"stderr-{name}.txt"
        self._stderr = self.stderr_path.open("wb")
        self.process = subprocess.Popen([sys.executable, "-m", "qinglong", "run", *extra],
                                        cwd=workspace.root, env=workspace.env(), stdin=subprocess.DEVNULL,
                                        stdout=self._stderr, stderr=self._stderr)
        self.pid = self.process.pid

    def stderr(self) -> str:
        return self.full_stderr()[-4000:]

    def full_stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = WAIT_S) -> None:
        """Until the lifecycle says admission is open (everything started, the reconciler done)."""
        wait_until(lambda: "lifecycle.admission_open" in self.full_stderr(), "qinglong run ready",
                   timeout=timeout, alive=self)

    def kill(self) -> None:
        """SIGKILL (works on a stopped process too) and reap it."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=WAIT_S)
        self._stderr.close()

    def terminate(self, timeout: float = WAIT_S) -> int:
        """SIGTERM and wait for the orderly stop; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._stderr.close()

    def stop_now(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def children(self) -> list[int]:
        """Pids whose parent is this process (the job wrappers it spawned and has not reaped)."""
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[1]) == self.pid:
                found.append(int(entry.name))
        return found


class Workspace:
    """A fresh SQLite file, log directory and settings file; the CLI runs against them."""

    def __init__(self, root: Path, *, execution: dict[str, Any] | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.db = root / "q.db"
        self.log_dir = root / "logs"
        self.settings = root / "settings.toml"
        self.markers = root / "markers"
        self.markers.mkdir(exist_ok=True)
        values: dict[str, Any] = {"log_dir": str(self.log_dir), "poll_ms": 100, "kill_grace_ms": 1000}
        values.update(execution or {})
        lines = ['profile = "edge"', "[backend]", f"path = {json.dumps(str(self.db))}", "[execution]"]
        for key, value in values.items():
            lines.append(f"{key} = {json.dumps(value)}")
        lines += ["[diagnostics]", 'level = "info"']
        self.settings.write_text("\n".join(lines) + "\n")
        self._conn: sqlite3.Connection | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = str(REPO)
        env["QINGLONG_SETTINGS"] = str(self.settings)
        return env

    def cli(self, *args: str, check: bool = True, timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
        result = run_qinglong(list(args), cwd=self.root, env=self.env(), timeout=timeout)
        if check:
            assert result.returncode == 0, (f"qinglong {' '.join(args)} -> {result.returncode}\n"
                                            f"{result.stdout}\n{result.stderr}")
        return result

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def start(self, name: str, *extra: str) -> ControlPlane:
        return ControlPlane(self, name, *extra)

    # ------------------------------------------------------------------ read-only looks

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        """Rows of ``statement`` on the SQLite file, through a connection that never writes."""
        if self._conn is None:
            if not self.db.exists():
                return []
            conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30, isolation_level=None)
            conn.execute("PRAGMA query_only = 1")
            self._conn = conn
        return self._conn.execute(statement, params).fetchall()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def attempt_dir(self, attempt_id: str) -> Path:
        return self.log_dir / attempt_id


def lock_is_held(attempt_dir: Path) -> bool:
    """Whether some process (a job's wrapper) still holds the Attempt directory's lock."""
    try:
        fd = os.open(attempt_dir / "lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def process_exists(pid: int) -> bool:
    """Whether ``pid`` names a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"

