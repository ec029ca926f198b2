"""Shared pieces of the control-plane tests: tasks and one-shot Runs published and admitted
through the real publisher and coordinator, a worker speaking the real protocol (the store's
functions, as the gateway role) without the ``qinglong worker`` process, and
``qinglong run`` replicas and CLI calls as subprocesses.

Nothing here stands in for a real part: the Runs are admitted by a real round, the worker's calls
are the protocol itself, and the control plane under test is ``qinglong run``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.support.cluster import ClusterDb, arun, set_cursor
from tests.support import procs as proc_helpers
from tests.support.aio import closing
from tests.support.cliserver import run_qinglong

REPO = Path(__file__).resolve().parents[2]

#: Overall bound on any wait: a hang, never a speed requirement.
PATIENCE_S = 90.0

#: The shortest session lease the protocol accepts (the tests' leases expire soon).
LEASE_MS = 5000


def wait_for(predicate, what: str, timeout_s: float = PATIENCE_S, interval_s: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; that value."""
    return proc_helpers.wait_until(predicate, what, timeout=timeout_s, interval=interval_s)

# ---------------------------------------------------------------------------------- publishing


def publish(db: ClusterDb, task_id: str | list[str], command: list[str], *, project: str = "ops",
            **spec) -> str:
    """Publish (or republish) a task with an execution spec and a once-a-year trigger of the same
    name, through the real publisher; the trigger id. A list of ids publishes each alike."""
    from qinglong.contracts.errors import AlreadyExists
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    async def body():
        backend = db.backend("publisher")
        async with closing(backend):
            pub = backend.publisher()
            try:
                await pub.create_project(project)
            except AlreadyExists:
                pass
            for one in [task_id] if isinstance(task_id, str) else task_id:
                await pub.put_task(project, one, {"command": command, **spec})
                await pub.put_trigger(TriggerDefinition(
                    project, one, one, "cron", {"expression": "0 0 1 1 *"},
                    misfire_policy=MisfirePolicy.FIRE_ONCE, misfire_grace_ms=600_000))

    arun(body())
    return task_id


def admit(db: ClusterDb, trigger_id: str, offset_ms: int = -1000) -> str:
    """Make one occurrence of the trigger due (database now + ``offset_ms``) and admit it with a
    real round of the coordinator; the new Run's id."""
    before = {r[0] for r in db.sql("SELECT run_id::text FROM qinglong.runs WHERE trigger_id = %s",
                                   (trigger_id,))}
    set_cursor(db, trigger_id, offset_ms)

    async def body():
        backend = db.backend("admitter")
        async with closing(backend):
            return await backend.run_round()

    report = arun(body())
    assert report.admitted >= 1, report
    after = {r[0] for r in db.sql("SELECT run_id::text FROM qinglong.runs WHERE trigger_id = %s",
                                  (trigger_id,))}
    (run_id,) = after - before
    return run_id


def run_row(db: ClusterDb, run_id: str) -> dict:
    cols = ("state", "finished_at_ms", "reason")
    row = db.sql(f"SELECT {', '.join(cols)} FROM qinglong.runs WHERE run_id = %s", (run_id,))[0]
    return dict(zip(cols, row))


def attempts_of(db: ClusterDb, run_id: str) -> list[dict]:
    cols = ("attempt_id", "attempt_no", "state", "lease_version", "started_at_ms", "finished_at_ms",
            "deadline_ms", "reason", "cancel_reason", "worker_id", "not_before_ms", "log_deleted_at_ms")
    rows = db.sql(f"SELECT attempt_id::text, {', '.join(cols[1:])} FROM qinglong.attempts "
                  "WHERE run_id = %s ORDER BY attempt_no", (run_id,))
    return [dict(zip(cols, row)) for row in rows]


# ---------------------------------------------------------------------------------- a worker


@dataclass
class Lease:
    run_id: str
    attempt_id: str
    attempt_no: int
    lease_version: int
    token: bytes = field(repr=False)


class ProtocolWorker:
    """A worker session driven call by call through the store's worker functions, as the
    gateway role: the protocol a ``qinglong worker`` speaks, without its process (so a
    test decides when a session goes silent)."""

    #: A test about expiry passes ``lease_ms=LEASE_MS``; every other one keeps its session for
    #: ten minutes, so a slow machine (each CLI call a new interpreter) cannot expire it midway.
    def __init__(self, db: ClusterDb, worker_id: str, *, lease_ms: int = 600_000, capacity: int = 4,
                 labels: tuple[str, ...] = ()) -> None:
        self.conn = psycopg.connect(db.dsn("qinglong_gateway"), autocommit=True)
        self.worker_id = worker_id
        row = self.conn.execute(
            "SELECT session_id::text, generation FROM qinglong.worker_open_session(%s, %s::text[], %s, %s)",
            (worker_id, list(labels), capacity, lease_ms)).fetchone()
        self.session_id, self.generation = row

    def _fence(self) -> tuple:
        return (self.worker_id, self.session_id, self.generation)

    def heartbeat(self, running: list[str]) -> dict[str, str]:
        """Renew; the stop list as ``{attempt_id: reason}``."""
        row = self.conn.execute(
            "SELECT stop_attempt_ids::text[], stop_reasons FROM qinglong.worker_heartbeat(%s, %s, %s, %s::uuid[])",
            (*self._fence(), running)).fetchone()
        return dict(zip(row[0] or [], row[1] or []))

    def claim(self, n: int = 1) -> list[Lease]:
        tokens = [os.urandom(32) for _ in range(n)]
        rows = self.conn.execute(
            "SELECT run_id::text, attempt_id::text, attempt_no, lease_version, token_index "
            "FROM qinglong.worker_claim(%s, %s, %s, %s::bytea[])", (*self._fence(), tokens)).fetchall()
        return [Lease(r[0], r[1], r[2], r[3], tokens[r[4] - 1]) for r in rows]

    def _lease(self, lease: Lease) -> tuple:
        return (*self._fence(), lease.attempt_id, lease.lease_version, lease.token)

    def started(self, lease: Lease) -> int:
        return self.conn.execute("SELECT deadline_ms FROM qinglong.worker_started(%s, %s, %s, %s, %s, %s)",
                                 self._lease(lease)).fetchone()[0]

    def append_log(self, lease: Lease, offset: int, data: bytes) -> int:
        return self.conn.execute("SELECT qinglong.worker_append_log(%s, %s, %s, %s, %s, %s, %s, %s)",
                                 (*self._lease(lease), offset, data)).fetchone()[0]

    def ship(self, lease: Lease, data: bytes, offset: int = 0, chunk: int = 256 * 1024) -> int:
        """Ship ``data`` from ``offset`` in chunks of at most ``chunk`` bytes; bytes stored."""
        stored = offset
        for i in range(0, len(data), chunk):
            stored = self.append_log(lease, offset + i, data[i:i + chunk])
        return stored

    def complete(self, lease: Lease, state: str, *, exit_code: int | None = None, log_bytes: int = 0,
                 dropped: int = 0, reason: str | None = None, started: bool = True) -> tuple:
        return self.conn.execute(
            "SELECT result, run_state FROM qinglong.worker_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s, %s)",
            (*self._lease(lease), state, exit_code, None, log_bytes, dropped, reason, started)).fetchone()

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------------------------- processes


def clean_env(settings: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env["QINGLONG_SETTINGS"] = str(settings)
    return env


def write_settings(path: Path, db: ClusterDb, *, owner: str = "cli", retention_days: float | None = None) -> Path:
    """A ``profile = "cluster"`` settings file of the runtime role (private: it holds a DSN)."""
    lines = ['profile = "cluster"', "[scheduler]", "lease_ms = 5000", "cadence_ms = 500", f'owner = "{owner}"',
             "[lifecycle]", "stop_timeout_ms = 5000",
             "[diagnostics]", 'level = "info"', 'format = "json"']
    if retention_days is not None:
        lines += ["[execution]", f"log_retention_days = {retention_days!r}"]
    lines += ["[backend]", f'runtime_dsn = "{db.dsn("qinglong_runtime")}"', "pool_min_size = 1",
              "pool_max_size = 3", "pool_timeout_ms = 3000"]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def cli(settings: Path, *args: str, timeout: float = PATIENCE_S) -> subprocess.CompletedProcess:
    """``qinglong ARGS`` as a subprocess; stdout as bytes (a log may hold any bytes)."""
    return run_qinglong(list(args), cwd=settings.parent, env=clean_env(settings), timeout=timeout,
                        text=False)


def cli_json(settings: Path, *args: str):
    result = cli(settings, *args, "--json")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return json.loads(result.stdout)


class Replica:
    """One ``qinglong run`` process; its stderr (JSON diagnostics) goes to a file read at the end."""

    def __init__(self, settings: Path) -> None:
        self._err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "qinglong", "run"], cwd=settings.parent,
                                     env=clean_env(settings), stdout=subprocess.DEVNULL,
                                     stderr=self._err, text=True)
        self.stderr = ""

    def events(self) -> list[dict]:
        self._err.flush()
        self._err.seek(0)
        text = self._err.read()
        events = []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
        return events

    def wait_ready(self) -> None:
        def ready():
            assert self.proc.poll() is None, f"qinglong run exited {self.proc.returncode}: {self.text()}"
            return any(e.get("code") == "lifecycle.admission_open" for e in self.events())

        wait_for(ready, "qinglong run to open admission")

    def text(self) -> str:
        self._err.seek(0)
        return self._err.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=PATIENCE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr = self.text()
        return self.proc.returncode


def expired_events(replicas: list[Replica]) -> list[dict]:
    """Every ``cluster_postgres.attempt_expired`` diagnostic of the replicas."""
    return [e for r in replicas for e in r.events() if e.get("code") == "cluster_postgres.attempt_expired"]
