"""COMMIT-response loss: the admission commits on the server, the client never learns it.

Through the real coordinator (``backend.run_round``): the replica reaches PostgreSQL through a
fault proxy armed to discard the server's replies from the admission's final CommandComplete on
(that tag is only sent once the message's transaction is committed). While the replica waits for the reply, the test
sees the Run from a superuser connection and kills the replica's server backend with
``pg_terminate_backend``: the client gets a connection error, not a result. Nothing is simulated
on the server side: it really committed.

Then fresh controls run ``qinglong run`` (startup recovery, then rounds) and the old replica keeps
going: there must still be exactly 1 Run, 1 Attempt, 2 Events, and recovery must leave the
pristine queued Attempt alone. The second variant loses the COMMIT response on a primary and
finishes on its promoted standby.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from tests.support.cluster import seed, set_cursor
from tests.failure.failure_helpers import (
    ADMISSION_COMMITTED,
    PATIENCE_S,
    InProcessReplica,
    audit,
    backend_pids,
    new_cluster_db,
    occurrence_shape,
    parse_diagnostics,
    promote,
    qinglong_command,
    sql,
    start_standby,
    timeline,
    wait_for,
    wait_replayed,
    write_cluster_settings,
)
from devtools.fault_proxy import TO_CLIENT, FaultProxy
from tests.support.pg import start_server

pytestmark = pytest.mark.postgres

ATTEMPT_COLUMNS = ("attempt_id, run_id, attempt_no, state, executor, worker_id, session_id, lease_id, "
                   "lease_expires_at_ms, offer_id, offered_at_ms, callback_token_digest, started_at_ms, "
                   "finished_at_ms, result_json, error_code, error_message, created_at_ms")


async def _lose_commit_response(db, proxy: FaultProxy):
    """Run one real coordinator round whose COMMIT response is lost; returns its report, the
    replica, the database time the backend was killed, and the killed PIDs."""
    rule = proxy.arm(TO_CLIENT, ADMISSION_COMMITTED, "swallow_replies")
    replica = InProcessReplica(db, "replica-a", proxy=proxy, lease_ms=2000)
    await replica.backend.open()
    round_task = asyncio.create_task(replica.backend.run_round())
    await wait_for(rule.fired.is_set, what="the COMMIT's reply")
    # the server sent "COMMIT": the Run is there for everyone but the replica
    await wait_for(lambda: db.count("runs") == 1, what="the committed Run")
    assert not round_task.done(), "the replica must still be waiting for its reply"
    superuser = db.server.superuser_dsn(db.dbname)
    pids = backend_pids(superuser, "replica-a")
    killed_at = db.db_now_ms()
    replica.killed_at = time.monotonic()
    for pid in pids:
        sql(superuser, "SELECT pg_terminate_backend(%s)", (pid,))
    report = await asyncio.wait_for(round_task, PATIENCE_S)
    return report, replica, killed_at, pids


def _run_cli(tmp_path, name: str, dsn: str, seconds: float) -> tuple[list[dict], float]:
    settings = write_cluster_settings(tmp_path / f"{name}.toml", dsn, owner=name, lease_ms=2000,
                                      cadence_ms=200)
    started = time.monotonic()
    proc = subprocess.run(qinglong_command(settings, "--for-seconds", str(seconds)),
                          capture_output=True, text=True, timeout=PATIENCE_S + seconds)
    assert proc.returncode == 0, proc.stderr
    return parse_diagnostics(proc.stderr), time.monotonic() - started


def _first_clean_round_s(replica) -> float:
    return min(at for at, r in replica.reports if r.errors == 0) - replica.killed_at


def _check_after_loss(db_dsn: str, report, replica, diagnostics: list[dict], attempt_before) -> dict:
    recovered = next(e for e in diagnostics if e["code"] == "lifecycle.recovered")
    stopped = next(e for e in diagnostics if e["code"] == "lifecycle.stopped")
    attempt_after = sql(db_dsn, f"SELECT {ATTEMPT_COLUMNS} FROM qinglong.attempts")
    shape = occurrence_shape(db_dsn)
    # the caller saw a connection error, not an admission
    assert report.errors == 1 and report.admitted == 0
    assert any(e.code == "cluster_postgres.round_failed" for e in replica.sink.events)
    # startup recovery of the fresh controls: one pristine queued Attempt, no candidate, untouched
    assert (recovered["pristine_queued"], recovered["candidates"]) == (1, 0)
    assert attempt_after == attempt_before
    assert stopped["admitted"] == 0
    assert (len(shape["runs"]), len(shape["attempts"]), len(shape["events"])) == (1, 1, 2)
    assert shape["runs"][0][:2] == ("queued", "replica-a")
    assert shape["attempts"][0] == ("claimed", "remote_worker", 1)
    assert shape["events"] == ["run.created", "run.queued"]
    assert shape["schedules"][0][0] is None  # claim cleared by the lost commit itself
    return shape


def test_lost_commit_response_after_recovery_leaves_exactly_one_run_and_a_pristine_attempt(failure_db, tmp_path):
    """The admission committed but its reply was lost with the backend. A replica that treated
    the connection error as 'not admitted' and tried again, or a recovery that treated the
    untouched queued Attempt as a failed execution, would duplicate the occurrence."""
    db = failure_db
    seed(db, 1)
    set_cursor(db, "tr000", -500)
    dsn = db.superuser_dsn()

    async def body():
        proxy = FaultProxy((db.server.host, db.server.port), name="lossy").start()
        report, replica, killed_at, pids = await _lose_commit_response(db, proxy)
        attempt_before = sql(dsn, f"SELECT {ATTEMPT_COLUMNS} FROM qinglong.attempts")
        # the old replica goes on (its pool reconnects) beside fresh controls started from scratch
        from qinglong.host.lifecycle import SchedulerLoop

        loop = SchedulerLoop(replica._round, 200, replica.sink)
        loop.start()
        diagnostics, cli_s = await asyncio.to_thread(_run_cli, tmp_path, "fresh-controls",
                                                     db.dsn("qinglong_runtime"), 3.0)
        await loop.stop(3)
        await replica.backend.close()
        proxy.close()
        return report, replica, killed_at, pids, attempt_before, diagnostics, loop.stats

    report, replica, killed_at, pids, attempt_before, diagnostics, old_stats = asyncio.run(body())
    shape = _check_after_loss(dsn, report, replica, diagnostics, attempt_before)
    assert pids and old_stats.rounds > 0 and old_stats.admitted == 0
    recovered_at = next(e for e in diagnostics if e["code"] == "lifecycle.recovered")
    figures = audit(dsn, {"tr000": shape["runs"][0][3]}, "commit_response_lost",
                    killed_backends=len(pids), old_replica_rounds_after=old_stats.rounds,
                    pristine_queued=recovered_at["pristine_queued"],
                    candidates=recovered_at["candidates"])
    figures.recover_s = _first_clean_round_s(replica)  # the old replica's first good round
    figures.show()
    assert (figures.expected, figures.found, figures.duplicates, figures.missing) == (1, 1, 0, 0)


def test_lost_commit_response_then_promotion_leaves_exactly_one_run_on_the_new_primary(tmp_path):
    """The same lost COMMIT response on a primary, replayed to its standby, then the primary is
    fenced and the standby promoted: the new primary must hold the one admitted occurrence, and
    neither the old replica (re-pointed at it) nor fresh controls may admit it again."""
    primary = start_server("pg18")
    standby = None
    try:
        db = new_cluster_db(primary)
        seed(db, 1)
        set_cursor(db, "tr000", -500)
        standby = start_standby(primary)

        async def body():
            proxy = FaultProxy((primary.host, primary.port), name="lossy").start()
            report, replica, killed_at, pids = await _lose_commit_response(db, proxy)
            replay_s = wait_replayed(primary, standby)
            attempt_before = sql(db.superuser_dsn(), f"SELECT {ATTEMPT_COLUMNS} FROM qinglong.attempts")
            fenced = time.monotonic()
            primary.stop("immediate")  # fence the old primary
            promote(standby)
            promoted_s = time.monotonic() - fenced
            # the service address moves: the old replica's pool follows it to the new primary
            proxy.retarget((standby.host, standby.port))
            new_db = type(db)(standby, db.dbname)
            from qinglong.host.lifecycle import SchedulerLoop

            loop = SchedulerLoop(replica._round, 200, replica.sink)
            loop.start()
            diagnostics, _ = await asyncio.to_thread(_run_cli, tmp_path, "fresh-controls",
                                                     new_db.dsn("qinglong_runtime"), 3.0)
            await loop.stop(3)
            await replica.backend.close()
            proxy.close()
            return (report, replica, pids, attempt_before, diagnostics, loop.stats, replay_s,
                    promoted_s, new_db, fenced)

        (report, replica, pids, attempt_before, diagnostics, old_stats, replay_s, promoted_s,
         new_db, fenced) = asyncio.run(body())
        dsn = new_db.superuser_dsn()
        shape = _check_after_loss(dsn, report, replica, diagnostics, attempt_before)
        assert timeline(standby) == 2
        assert old_stats.admitted == 0
        figures = audit(dsn, {"tr000": shape["runs"][0][3]}, "commit_response_lost_then_promotion",
                        replay_wait_s=round(replay_s, 3), promote_s=round(promoted_s, 2),
                        timeline_after=timeline(standby), old_replica_rounds_after=old_stats.rounds)
        figures.recover_s = promoted_s  # fence to a writable new primary
        figures.show()
        assert (figures.expected, figures.found, figures.duplicates, figures.missing) == (1, 1, 0, 0)
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()
