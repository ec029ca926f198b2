"""Shared pieces of the worker tests: settings files, ``qinglong worker`` processes with their
diagnostics (started on the gateway: :mod:`tests.support.gateway`), tasks published through the
real publisher and Runs admitted through the real admission path (a cron trigger whose cursor is put just behind the database clock: one Run).

Nothing here sleeps a fixed time before asserting: :func:`wait_until` polls a condition within a
generous overall bound (a hang fails, a slow machine only waits longer).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import ClusterDb, set_cursor
from tests.support.pg import ROLE_PASSWORDS
from tests.support.procs import group_members
from tests.support import procs as proc_helpers

PROJECT = "wp"
#: Overall bound on any wait: a hang, never a speed requirement.
PATIENCE_S = 90.0

#: Short leases, accepted by check_worker_timing: 2 x 1000 + 500 + 1000 + 1000 = 4500 <= 5000.
SHORT_TIMING = dict(session_lease_ms=5000, heartbeat_ms=1000, self_fence_margin_ms=1000, kill_grace_ms=500,
                    poll_ms=100)

TERMINAL = ("succeeded", "failed", "timed_out", "cancelled", "lost")


def wait_until(condition, what: str, timeout_s: float = PATIENCE_S, interval_s: float = 0.05):
    """Poll ``condition`` until truthy (its value), or fail naming ``what``, never sooner than
    :data:`PATIENCE_S`."""
    return proc_helpers.wait_until(condition, what, timeout=max(timeout_s, PATIENCE_S), interval=interval_s)

def worker_dsn(db: ClusterDb, host: str | None = None, port: int | None = None) -> str:
    """The gateway's role's DSN on ``db`` (through ``host:port``, a proxy, when given): what
    ``[api] gateway_dsn`` holds; no worker holds a database credential."""
    password = ROLE_PASSWORDS["qinglong_gateway"]
    if host is None:
        return db.dsn("qinglong_gateway")
    return (f"host={host} port={port} user=qinglong_gateway password={password} "
            f"dbname={db.dbname} connect_timeout=2")


def write_worker_settings(path: Path, *, worker_id: str, log_dir: Path, url: str | None = None,
                          token_file: Path | None = None, max_running: int = 2,
                          level: str = "info", extra: str = "", **worker: object) -> Path:
    """A ``profile = "cluster"`` settings file with a ``[worker]`` section (``extra``: raw lines
    appended to it)."""
    values = dict(SHORT_TIMING, max_running=max_running, drain_timeout_ms=60_000)
    values.update(worker)
    lines = ['profile = "cluster"', f'[diagnostics]\nlevel = "{level}"\nformat = "json"', "[worker]",
             f'worker_id = "{worker_id}"', f'log_dir = "{log_dir}"']
    if url is not None:
        lines.append(f'url = "{url}"')
    if token_file is not None:
        lines.append(f'token_file = "{token_file}"')
    lines += [f"{key} = {value}" for key, value in values.items()]
    if extra:
        lines.append(extra)
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


class WorkerProcess:
    """One ``python -m qinglong worker --settings FILE``; its stderr (JSON diagnostics) goes to a
    file the test reads while it runs."""

    def __init__(self, settings: Path, stderr_path: Path) -> None:
        self.settings = settings
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "qinglong", "worker", "--settings", str(settings)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                     start_new_session=True)

    def text(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def events(self, code: str | None = None) -> list[dict]:
        found = []
        for line in self.text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if code is None or event.get("code") == code:
                    found.append(event)
        return found

    def wait_event(self, code: str, count: int = 1, what: str | None = None) -> list[dict]:
        def seen():
            if self.proc.poll() is not None and len(self.events(code)) < count:
                raise AssertionError(f"the worker exited ({self.proc.returncode}) before {code}:\n{self.text()}")
            events = self.events(code)
            return events if len(events) >= count else None
        return wait_until(seen, what or f"{count} x {code} from the worker")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout_s: float = PATIENCE_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self._stderr.close()

    def stop(self) -> None:
        """Make sure nothing is left behind (a test that failed midway): KILL."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._stderr.close()


def start_worker(gateway, tmp_path: Path, name: str, **settings) -> WorkerProcess:
    """A ``qinglong worker`` whose id is ``name``, registered on ``gateway`` (a
    :class:`tests.support.gateway.GatewayPlane`) with its labels and ``max_running`` as capacity,
    speaking to it with its token; settings, log folder and stderr file under ``tmp_path``."""
    return gateway.start_worker(tmp_path, name, **settings)


def publish_task(db: ClusterDb, task_id: str, payload: dict, *, trigger_id: str | None = None,
                 sealer=None, project: str = PROJECT) -> str:
    """Put task ``task_id`` of ``project`` (``payload`` holds its execution spec) and a yearly
    cron trigger on it, through the real publisher; the trigger id."""
    from qinglong.contracts.errors import AlreadyExists
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    trigger_id = trigger_id or f"tr-{task_id}"

    async def body():
        backend = db.backend("publisher", sealer=sealer)
        try:
            pub = backend.publisher()
            try:
                await pub.create_project(project)
            except AlreadyExists:
                pass
            await pub.put_task(project, task_id, payload)
            await pub.put_trigger(TriggerDefinition(project, trigger_id, task_id, "cron", {"expression": "0 0 1 1 *"},
                                                    misfire_policy=MisfirePolicy("fire_once"),
                                                    misfire_grace_ms=3_600_000))
        finally:
            await backend.close()

    asyncio.run(body())
    return trigger_id


def admit(db: ClusterDb, trigger_id: str) -> str:
    """Admit one Run of the trigger through the replicas' own round (cursor just behind the
    database clock); its run id."""
    before = {r[0] for r in db.sql("SELECT run_id::text FROM qinglong.runs WHERE trigger_id = %s", (trigger_id,))}
    set_cursor(db, trigger_id, -500)

    async def body():
        backend = db.backend(f"admitter-{trigger_id}")
        try:
            await backend.open()
            for _ in range(50):
                report = await backend.run_round()
                if report.admitted:
                    return
            raise AssertionError(f"trigger {trigger_id} admitted nothing")
        finally:
            await backend.close()

    asyncio.run(body())
    after = {r[0] for r in db.sql("SELECT run_id::text FROM qinglong.runs WHERE trigger_id = %s", (trigger_id,))}
    (run_id,) = after - before
    return run_id


def run_state(db: ClusterDb, run_id: str) -> str:
    return db.sql("SELECT state FROM qinglong.runs WHERE run_id = %s", (run_id,))[0][0]


def wait_run_state(db: ClusterDb, run_id: str, states=TERMINAL) -> str:
    return wait_until(lambda: (s := run_state(db, run_id)) in states and s,
                      f"run {run_id} to reach one of {states}")


def attempts(db: ClusterDb, run_id: str) -> list[dict]:
    rows = db.sql("SELECT attempt_no, state, exit_code, signal, log_bytes, reason, attempt_id::text "
                  "FROM qinglong.attempts WHERE run_id = %s ORDER BY attempt_no", (run_id,))
    keys = ("attempt_no", "state", "exit_code", "signal", "log_bytes", "reason", "attempt_id")
    return [dict(zip(keys, row)) for row in rows]


def stored_log(db: ClusterDb, attempt_id: str) -> bytes:
    rows = db.sql("SELECT offset_bytes, data FROM qinglong.attempt_logs WHERE attempt_id = %s "
                  "ORDER BY offset_bytes", (attempt_id,))
    data = b""
    for offset, chunk in rows:
        assert offset == len(data), f"the stored log has a gap or overlap at {offset}"
        data += bytes(chunk)
    return data


def py_job(source: str, *args: str) -> list[str]:
    """A job command running ``source`` with this interpreter (its absolute path: the job's PATH
    is the minimal one)."""
    return [sys.executable, "-c", source, *args]


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is alive (zombies do not count). A group killed by a
    signal is gone only once the kernel has reaped each member: wait for it to be gone, never
    assert it at once."""
    return bool(group_members(pgid))


def keeper_pid(worker_pid: int) -> int | None:
    """The pid of the fence keeper the worker ``worker_pid`` started (its child running keeper.py)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        ppid = int(raw[raw.rindex(b")") + 2:].split()[1])
        if ppid == worker_pid and any(arg.endswith(b"keeper.py") for arg in argv):
            return int(name)
    return None
