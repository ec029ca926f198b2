"""Shared pieces of the failure tests: in-process replicas behind fault proxies, a streaming
standby made with ``pg_basebackup``, the exactly-once audit and the figures each test prints.

The replicas here are the real thing minus the process boundary: the backend built by the
plugin's own factory, its own runtime pool, driven by the host's :class:`SchedulerLoop` (the loop
``qinglong run`` uses), with a DSN pointing at the replica's own :class:`FaultProxy`. Tests that
need a process boundary (kill -9, network namespaces, the chaos soak) run ``qinglong run``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from tests.support.cluster import ClusterDb, CollectingSink, migrate
from tests.support.pg import ROLE_PASSWORDS, PgServer, create_database, create_roles

from devtools.fault_proxy import FaultProxy

ROOT = Path(__file__).resolve().parents[2]

#: In every admission message, after its SETs: the whole SERIALIZABLE transaction travels as one
#: simple-protocol Query message (the claim is a bare autocommit statement and never sends it).
ADMISSION_MESSAGE = b"EXECUTE qinglong_admit_occurrence("
#: With ADMISSION_MESSAGE: the decision kind literal of an on-time admission, the one kind of
#: admission message that always creates a Run (initialize, skip and release create none).
FIRE_DECISION = b"'fire'"
#: Text of the admission statement itself (sent once per connection, when it is prepared).
ADMISSION_TEXT = b"INSERT INTO qinglong.runs"

#: The admission's final CommandComplete ("SELECT 1"): PostgreSQL ends the message's implicit
#: transaction before it reports the last statement complete, so this tag is only sent once the
#: occurrence committed (the claim's reply says "UPDATE n").
ADMISSION_COMMITTED = b"SELECT 1\x00"

EVERY_SECOND = "* * * * * *"


# ---------------------------------------------------------------------------------- figures


@dataclass
class Figures:
    """What a failure test proves, in numbers: printed so ``pytest -s`` shows them."""

    test: str
    expected: int
    found: int
    duplicates: int
    missing: int
    skipped_recorded: int = 0
    recover_s: float | None = None
    worst_lag_ms: int | None = None
    extra: dict = field(default_factory=dict)

    def show(self) -> "Figures":
        text = (f"[figures] {self.test}: expected={self.expected} found={self.found} "
                f"duplicates={self.duplicates} missing={self.missing}")
        if self.skipped_recorded:
            text += f" skipped_recorded={self.skipped_recorded}"
        if self.recover_s is not None:
            text += f" time_to_recover={self.recover_s:.2f}s"
        if self.worst_lag_ms is not None:
            text += f" worst_lag={self.worst_lag_ms}ms"
        if self.extra:
            text += " " + json.dumps(self.extra, sort_keys=True, default=str)
        print(text, flush=True)
        return self

    def as_json(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------- database


def db_now_ms(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[0]


def sql(dsn: str, statement: str, params=None):
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def proxied_dsn(db: ClusterDb, proxy: FaultProxy, role: str = "qinglong_runtime",
                connect_timeout: int = 3) -> str:
    """``role``'s DSN on ``db`` through ``proxy`` (the replica never sees the real port)."""
    return (f"host={proxy.host} port={proxy.port} user={role} password={ROLE_PASSWORDS[role]} "
            f"dbname={db.dbname} connect_timeout={connect_timeout}")


def start_every_second(db: ClusterDb, lead_ms: int = 1000) -> int:
    """Put every schedule's cursor on the same whole second, ``lead_ms`` or more from now in
    database time, as initialization would; returns that first occurrence."""
    now = db.db_now_ms()
    first = (now + lead_ms) // 1000 * 1000 + 1000
    db.sql("UPDATE qinglong.trigger_schedules SET next_fire_at_ms = %s, claim_owner = NULL, "
           "claim_token = NULL, claim_expires_at_ms = NULL", (first,))
    return first


def audit(dsn: str, first_fire_ms: int | dict[str, int], test: str, **extra) -> Figures:
    """Every trigger's expected occurrences (from its first fire up to, not including, its cursor)
    against its Runs and recorded skips.

    ``duplicates``: Runs beyond the first for one (trigger, occurrence); ``missing``: expected
    occurrences with neither a Run nor a recorded skip; ``skipped_recorded``: occurrences a
    misfire policy skipped and recorded. Also checks every Run has 1 Attempt and 2 Events.
    """
    from qinglong.plugins.cron.provider import CronProvider

    provider = CronProvider()
    rows = sql(dsn, "SELECT t.trigger_id, t.spec_json, s.next_fire_at_ms FROM qinglong.triggers t "
                    "JOIN qinglong.trigger_schedules s USING (trigger_id) ORDER BY 1")
    runs = sql(dsn, "SELECT trigger_id, scheduled_for_ms, admitted_at_ms FROM qinglong.runs")
    skips = sql(dsn, "SELECT trigger_id, first_skipped_ms, last_skipped_ms, skipped_count "
                     "FROM qinglong.schedule_skips")
    shape = sql(dsn, """
        SELECT count(*) FILTER (WHERE a.n <> 1 OR e.n <> 2 OR a.n IS NULL OR e.n IS NULL)
        FROM qinglong.runs r
        LEFT JOIN (SELECT run_id, count(*) n FROM qinglong.attempts GROUP BY 1) a USING (run_id)
        LEFT JOIN (SELECT run_id, count(*) n FROM qinglong.run_events GROUP BY 1) e USING (run_id)""")[0][0]
    by_trigger: dict[str, list[int]] = {}
    for trigger_id, scheduled, _ in runs:
        by_trigger.setdefault(trigger_id, []).append(scheduled)
    expected_total = found = duplicates = missing = skipped_total = 0
    for trigger_id, spec, cursor in rows:
        first = first_fire_ms[trigger_id] if isinstance(first_fire_ms, dict) else first_fire_ms
        expected: list[int] = []
        occurrence = first
        while cursor is not None and occurrence is not None and occurrence < cursor:
            expected.append(occurrence)
            occurrence = provider.next_after(spec, occurrence)
        admitted = by_trigger.get(trigger_id, [])
        skipped: set[int] = set()
        for t, lo, hi, _count in skips:
            if t == trigger_id:
                skipped.update(o for o in expected if lo <= o <= hi)
        expected_total += len(expected)
        found += len(admitted)
        duplicates += len(admitted) - len(set(admitted))
        missing += len(set(expected) - set(admitted) - skipped)
        skipped_total += len(skipped)
    lags = [admitted_at - scheduled for _, scheduled, admitted_at in runs]
    extra = dict(extra, runs_without_1_attempt_2_events=shape)
    return Figures(test, expected_total, found, duplicates, missing, skipped_total,
                   worst_lag_ms=max(lags) if lags else None, extra=extra)


# ---------------------------------------------------------------------------------- replicas


class InProcessReplica:
    """One replica in this process: the plugin's backend behind its own proxy, run by the host's
    scheduler loop at ``cadence_ms``."""

    def __init__(self, db: ClusterDb, owner: str, *, proxy: FaultProxy | None = None,
                 dsn: str | None = None, lease_ms: int = 2000, cadence_ms: int = 100,
                 claim_budget: int = 16, pool_max_size: int = 2) -> None:
        self.db = db
        self.owner = owner
        self.proxy = proxy
        self.dsn = dsn or (proxied_dsn(db, proxy) if proxy else db.dsn("qinglong_runtime"))
        self.sink = CollectingSink()
        settings = db.settings(runtime_dsn=self.dsn, pool_min_size=1, pool_max_size=pool_max_size,
                               pool_timeout_ms=2000, statement_timeout_ms=5000)
        self.backend = db.backend(owner, claim_budget=claim_budget, lease_ms=lease_ms,
                                  settings=settings, sink=self.sink)
        self.cadence_ms = cadence_ms
        self.loop = None
        self.reports: list = []
        self.rounds_finished = 0

    async def _round(self):
        try:
            report = await self.backend.run_round()
        finally:
            self.rounds_finished += 1  # a round that raised is a finished round too
        self.reports.append((time.monotonic(), report))
        return report

    async def start(self) -> "InProcessReplica":
        from qinglong.host.lifecycle import SchedulerLoop

        await self.backend.open()
        self.loop = SchedulerLoop(self._round, self.cadence_ms, self.sink)
        self.loop.start()
        return self

    async def stop(self, timeout_s: float = 3.0) -> None:
        if self.loop is not None:
            await self.loop.stop(timeout_s)
        try:
            await asyncio.wait_for(self.backend.close(), timeout_s)
        except (asyncio.TimeoutError, Exception):
            pass

    def total(self, name: str) -> int:
        return sum(getattr(r, name) for _, r in self.reports)


#: The overall bound on any wait for a condition: generous, so a loaded machine only makes a test
#: slower, never failing; a condition that is never met still fails (and names what it waited for).
PATIENCE_S = 120.0


async def wait_for(predicate, timeout_s: float = PATIENCE_S, interval_s: float = 0.02,
                   what: str = "condition"):
    """Poll ``predicate`` (sync, may hit the database) until truthy; its value, or AssertionError.

    ``timeout_s`` is an overall bound on a hang, never a speed requirement: callers pass nothing
    (:data:`PATIENCE_S`) or more, and time what must happen quickly from the product's own signals.
    """
    deadline = time.monotonic() + max(timeout_s, PATIENCE_S)
    while True:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {max(timeout_s, PATIENCE_S):.1f}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def wait_rounds(replicas, rounds: int = 2, what: str = "rounds") -> None:
    """Wait until each replica has finished ``rounds`` more scheduler rounds from now.

    A window for something that must NOT happen (a second admission, a takeover under a live
    lease) is measured in the replicas' own rounds, never in seconds: on a slow machine the window
    only grows, and every replica has had its chances to misbehave when it closes.
    """
    marks = {id(r): r.rounds_finished for r in replicas}
    await wait_for(lambda: all(r.rounds_finished >= marks[id(r)] + rounds for r in replicas),
                   what=f"{rounds} {what} of {[r.owner for r in replicas]}")


async def wait_db_time_past(db, instant_ms: int, what: str = "database time") -> None:
    """Wait until the database clock is past ``instant_ms`` (a lease expiry, say)."""
    await wait_for(lambda: db.db_now_ms() > instant_ms, what=f"{what} past {instant_ms}")


# ---------------------------------------------------------------------------------- servers


def new_cluster_db(server: PgServer, dbname: str = "ql_failure") -> ClusterDb:
    """Roles, a fresh database and every migration on ``server``."""
    create_roles(server)
    create_database(server, dbname)
    db = ClusterDb(server, dbname)
    migrate(db)
    return db


def _runuser(server: PgServer, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(["runuser", "-u", server.os_user, "--", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=str(server.base))
    if proc.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
    return proc


def start_standby(primary: PgServer) -> PgServer:
    """A streaming standby of ``primary``: ``pg_basebackup -R -X stream`` with the primary's own
    binaries into a new private directory, started on its own port (hot standby, read-only)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix=f"ql-{primary.label}-standby-", dir="/tmp"))
    base.chmod(0o755)
    shutil.chown(base, primary.os_user, primary.os_user)
    standby = PgServer(label=primary.label + "-standby", bin_dir=primary.bin_dir,
                       os_user=primary.os_user, base=base)
    _runuser(standby, str(primary.bin_dir / "pg_basebackup"), "-h", primary.host,
             "-p", str(primary.port), "-U", "postgres", "-D", str(standby.datadir),
             "-R", "-X", "stream", "-c", "fast", "--no-sync")
    with (standby.datadir / "postgresql.conf").open("a") as conf:
        conf.write("\n# standby\nwal_receiver_status_interval = 1s\nhot_standby_feedback = on\n")
    standby.start()
    return standby


def promote(standby: PgServer) -> None:
    """``pg_ctl promote -w``: the standby ends recovery and becomes a primary on a new timeline."""
    _runuser(standby, str(standby.bin_dir / "pg_ctl"), "-D", str(standby.datadir), "-w",
             "-t", "60", "promote")


def timeline(server: PgServer) -> int:
    """The server's current WAL timeline (after a CHECKPOINT on a primary, so it is current)."""
    with psycopg.connect(server.superuser_dsn(), autocommit=True) as conn:
        if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
            conn.execute("CHECKPOINT")
        return int(conn.execute("SELECT timeline_id FROM pg_control_checkpoint()").fetchone()[0])


def wait_replayed(primary: PgServer, standby: PgServer, timeout_s: float = PATIENCE_S) -> float:
    """Wait until the standby has replayed everything the primary has written; seconds waited."""
    started = time.monotonic()
    with psycopg.connect(primary.superuser_dsn(), autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with psycopg.connect(standby.superuser_dsn(), autocommit=True) as conn:
        while True:
            done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]
            if done:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise AssertionError("the standby did not replay the primary's WAL in time")
            time.sleep(0.02)


def backend_pids(dsn: str, owner: str) -> list[int]:
    """PIDs of the runtime backends a replica (by owner) holds, from pg_stat_activity."""
    rows = sql(dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
               (f"qinglong runtime {owner}"[:63],))
    return [r[0] for r in rows]


def occurrence_shape(db_dsn: str) -> dict:
    """Counts of the one-occurrence tests: Runs, Attempts, Events, and the schedule's fence."""
    runs = sql(db_dsn, "SELECT state, admitted_by, admitted_at_ms, scheduled_for_ms FROM qinglong.runs")
    attempts = sql(db_dsn, "SELECT state, executor, attempt_no FROM qinglong.attempts")
    events = sql(db_dsn, "SELECT event_type FROM qinglong.run_events ORDER BY seq")
    sched = sql(db_dsn, "SELECT claim_owner, claim_token, claim_expires_at_ms, claim_version, "
                        "next_fire_at_ms, last_scheduled_at_ms FROM qinglong.trigger_schedules")
    return {"runs": runs, "attempts": attempts, "events": [e[0] for e in events], "schedules": sched}


def env_full() -> bool:
    """True when the full (soak) forms were asked for with QINGLONG_SOAK=full."""
    return os.environ.get("QINGLONG_SOAK", "").lower() == "full"


# ---------------------------------------------------------------------------------- the CLI


def write_cluster_settings(path: Path, runtime_dsn: str, *, owner: str, lease_ms: int = 2000,
                           cadence_ms: int = 200, claim_budget: int = 16,
                           pool_timeout_ms: int = 2000) -> Path:
    """A ``profile = "cluster"`` settings file for ``qinglong run`` (the DSN is a secret: the file
    is private to its owner)."""
    path.write_text(
        'profile = "cluster"\n'
        "[scheduler]\n"
        f"cadence_ms = {cadence_ms}\nclaim_budget = {claim_budget}\nlease_ms = {lease_ms}\n"
        f'owner = "{owner}"\n'
        "[lifecycle]\nstop_timeout_ms = 3000\n"
        '[diagnostics]\nlevel = "info"\nformat = "json"\n'
        "[backend]\n"
        f'runtime_dsn = "{runtime_dsn}"\n'
        f"pool_min_size = 1\npool_max_size = 2\npool_timeout_ms = {pool_timeout_ms}\n"
    )
    path.chmod(0o600)
    return path


def qinglong_command(settings: Path, *extra: str) -> list[str]:
    """``qinglong run --settings FILE`` through this interpreter."""
    import sys

    return [sys.executable, "-m", "qinglong", "run", "--settings", str(settings), *extra]


def parse_diagnostics(stderr: str) -> list[dict]:
    """The JSON diagnostic lines of a ``qinglong run`` (other lines are ignored)."""
    events = []
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return events
