"""Startup recovery, and the plugin's face: hook, settings model, lazy driver import."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from pydantic import ValidationError

from edge_helpers import cron, open_backend, query, seed
from qinglong.contracts.store import SchedulerBackend
from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, qinglong_scheduler_backends
from qinglong.plugins.edge_sqlite.recovery import recover_in_thread
from tests.support.aio import closing

MINUTE = 60_000


async def _admit_two(backend, clock) -> None:
    await seed(backend)
    await backend.publisher().put_trigger(cron("a", "* * * * *"))
    await backend.run_round()
    clock.advance(2 * MINUTE)
    assert (await backend.run_round()).admitted == 2


async def test_pristine_queued_attempts_are_left_alone(db_path, clock, backends):
    """Treating a queued, never-dispatched Attempt as failed would retry or lose work at every start."""
    backend = backends.track(await open_backend(db_path, clock))
    await _admit_two(backend, clock)
    before = query(db_path, "SELECT * FROM attempts ORDER BY attempt_id")
    report = await backend.recover()
    assert report.pristine_queued == 2 and report.candidates == ()
    assert query(db_path, "SELECT * FROM attempts ORDER BY attempt_id") == before


@pytest.mark.parametrize(
    "drift, reason",
    [
        ("UPDATE attempts SET worker_id = 'w1' WHERE rowid = 1", "dispatch or result fields are set"),
        ("UPDATE runs SET state = 'dispatching' WHERE rowid = 1", "run state 'dispatching'"),
        ("INSERT INTO attempts (attempt_id, run_id, attempt_no, state, executor, execution_digest, "
         "created_at_ms) SELECT 'second', run_id, 2, 'failed', 'remote_worker', 'x', 0 FROM runs "
         "WHERE rowid = 1", "attempt state 'failed'"),
        ("INSERT INTO attempts (attempt_id, run_id, attempt_no, state, executor, execution_digest, "
         "created_at_ms) SELECT 'second', run_id, 2, 'claimed', 'remote_worker', execution_digest, "
         "created_at_ms FROM attempts WHERE rowid = 1", "latest attempt is #2"),
        ("UPDATE attempts SET execution_digest = 'sha256:' || hex(randomblob(32)) WHERE rowid = 1",
         "execution digest does not match its pinned task revision"),
        ("UPDATE runs SET task_digest = 'sha256:0' WHERE rowid = 1",
         "execution digest does not match its pinned task revision"),
        ("UPDATE runs SET queued_at_ms = queued_at_ms + 1 WHERE rowid = 1",
         "queued_at_ms differs from the admission time"),
        ("UPDATE attempts SET created_at_ms = created_at_ms - 1 WHERE rowid = 1",
         "attempt created_at_ms differs from the admission time"),
        ("INSERT INTO run_events (run_id, seq, type, at_ms) SELECT run_id, 3, 'run.dispatching', "
         "at_ms FROM run_events WHERE event_id = 1", "events are not exactly"),
        ("DELETE FROM run_events WHERE event_id = 2", "events are not exactly"),
        ("UPDATE run_events SET type = CASE seq WHEN 1 THEN 'run.queued' ELSE 'run.created' END "
         "WHERE run_id = (SELECT run_id FROM runs WHERE rowid = 1)", "events are not exactly"),
    ],
    ids=["worker-set", "dispatching", "newer-attempt", "newer-pristine-looking-attempt",
         "execution-digest", "pinned-digest", "queued-at", "attempt-created-at", "extra-event",
         "missing-event", "swapped-events"],
)
async def test_drifted_in_flight_work_is_reported_and_not_modified(db_path, clock, drift, reason, backends):
    """Anything in flight that admission did not leave exactly so must reach an operator (fail
    closed) and must not be touched by recovery."""
    backend = backends.track(await open_backend(db_path, clock))
    await _admit_two(backend, clock)
    conn = sqlite3.connect(db_path)
    conn.execute(drift)
    conn.commit()
    conn.close()
    before = {t: query(db_path, f"SELECT * FROM {t} ORDER BY rowid") for t in ("runs", "attempts")}
    report = await backend.recover()
    assert report.pristine_queued == 1
    (candidate,) = report.candidates
    assert reason in candidate
    assert {t: query(db_path, f"SELECT * FROM {t} ORDER BY rowid") for t in ("runs", "attempts")} == before


def test_hook_offers_the_backend_with_a_strict_settings_model():
    """A typo in [backend] must be an error, not a silently ignored key."""
    (spec,) = qinglong_scheduler_backends()
    assert spec.name == "edge_sqlite" and spec.settings_model is EdgeSqliteSettings
    defaults = EdgeSqliteSettings()
    assert (defaults.path, defaults.synchronous, defaults.auto_migrate) == ("qinglong.db", "normal", True)
    with pytest.raises(ValidationError):
        EdgeSqliteSettings(pathh="x.db")
    with pytest.raises(ValidationError):
        EdgeSqliteSettings(synchronous="off")


async def test_backend_satisfies_the_contract_protocols(db_path, clock, backends):
    """The host drives the backend only through the protocols; a missing method fails at run time."""
    backend = backends.track(await open_backend(db_path, clock))
    from qinglong.contracts.store import Publisher, Reader
    assert isinstance(backend, SchedulerBackend)
    assert isinstance(backend.publisher(), Publisher)
    assert isinstance(backend.reader(), Reader)


def test_importing_the_plugin_does_not_import_the_driver():
    """The host imports every profile plugin to list it; importing aiosqlite there would cost
    every process the driver."""
    code = ("import sys, qinglong.plugins.edge_sqlite as p; p.qinglong_scheduler_backends(); "
            "bad = [m for m in ('aiosqlite', 'sqlite3', 'psycopg') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def _recovery_steps(db_path, finished: int) -> int:
    """SQLite virtual-machine steps startup recovery takes with ``finished`` terminal Runs added."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        if finished:
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
                "task_revision, task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state, "
                "idempotency_key) VALUES (?, 'p1', 'old', 1, 't1', 1, 'd', ?, 0, 0, 'succeeded', ?)",
                [(f"done{i}", i, f"ql3:cron:v1:old:1:{i}") for i in range(finished)])
            conn.execute("COMMIT")
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0

        conn.set_progress_handler(count, 100)
        report = recover_in_thread(conn)
        conn.set_progress_handler(None, 0)
        assert report.pristine_queued == 2 and report.candidates == ()
        return steps
    finally:
        conn.close()


async def test_recovery_reads_only_the_runs_still_in_flight(db_path, clock):
    """Recovery that scans every Run delays the first round by seconds on a long-lived file
    (1 M Runs: ~8 s); finished Runs never need recovery and must cost it nothing."""
    backend = await open_backend(db_path, clock)
    async with closing(backend):
        await _admit_two(backend, clock)
    few = _recovery_steps(db_path, 0)
    many = _recovery_steps(db_path, 20_000)
    assert many <= few + 5, (few, many)
