"""Startup recovery's pristine-Attempt exclusion, the publisher's all-or-nothing writes, and the
plugin's import weight."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.cluster import ROOT, arun, expire, seed, set_cursor
from qinglong.contracts.errors import AlreadyExists, NotFound, TriggerSpecError
from qinglong.contracts.records import TriggerDefinition
from tests.support.aio import closing


def _admit(db, n: int) -> None:
    seed(db, n)
    set_cursor(db, None, -500)

    async def body():
        backend = db.backend("r1")
        async with closing(backend):
            assert (await backend.run_round()).admitted == n

    arun(body())


def _recover(db):
    async def body():
        backend = db.backend("r1")
        async with closing(backend):
            return await backend.recover(), backend.context.diagnostics.codes()

    return arun(body())


def test_recovery_leaves_pristine_queued_attempts_alone(cluster):
    """Treating admission's own queued Attempts as failed executions would re-run every Run."""
    _admit(cluster, 3)
    report, codes = _recover(cluster)
    assert report.pristine_queued == 3 and report.candidates == ()
    assert "cluster_postgres.recovery_candidates" not in codes


@pytest.mark.parametrize("drift", [
    "UPDATE qinglong.attempts SET worker_id = 'w1' WHERE run_id = %(run)s",
    "UPDATE qinglong.attempts SET lease_expires_at_ms = 1 WHERE run_id = %(run)s",
    "UPDATE qinglong.attempts SET callback_token_digest = 'x' WHERE run_id = %(run)s",
    "UPDATE qinglong.attempts SET error_code = 'E' WHERE run_id = %(run)s",
    "UPDATE qinglong.runs SET state = 'dispatching' WHERE run_id = %(run)s",
    "UPDATE qinglong.runs SET cancelled = true WHERE run_id = %(run)s",
    "UPDATE qinglong.runs SET queued_at_ms = NULL WHERE run_id = %(run)s",
    "UPDATE qinglong.runs SET owned_by = 'operator' WHERE run_id = %(run)s",
    "INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor, created_at_ms) "
    "VALUES (gen_random_uuid(), %(run)s, 2, 'claimed', 'remote_worker', 0)",
    "WITH e AS (DELETE FROM qinglong.run_events WHERE run_id = %(run)s) "
    "DELETE FROM qinglong.attempts WHERE run_id = %(run)s",
    # the Run no longer pins its revision's execution, or was queued or attempted at another time
    "UPDATE qinglong.runs SET execution_digest = 'sha256:' || repeat('0', 64) WHERE run_id = %(run)s",
    "UPDATE qinglong.runs SET queued_at_ms = queued_at_ms + 1 WHERE run_id = %(run)s",
    "UPDATE qinglong.attempts SET created_at_ms = created_at_ms + 1 WHERE run_id = %(run)s",
    # anything but exactly run.created (seq 1) and run.queued (seq 2)
    "INSERT INTO qinglong.run_events (event_id, run_id, seq, event_type, at_ms) "
    "SELECT gen_random_uuid(), %(run)s, 3, 'run.dispatching', at_ms FROM qinglong.run_events "
    "WHERE run_id = %(run)s AND seq = 2",
    "DELETE FROM qinglong.run_events WHERE run_id = %(run)s AND seq = 2",
    "UPDATE qinglong.run_events SET event_type = 'run.dispatching' WHERE run_id = %(run)s AND seq = 2",
    "UPDATE qinglong.run_events SET seq = 3 - seq + 10 WHERE run_id = %(run)s",
])
def test_any_drift_from_admission_makes_a_recovery_candidate(cluster, drift):
    """Failing open here would leave a half-dispatched Run stuck as if it were merely queued, or
    hand a worker a Run whose execution is not the pinned one."""
    _admit(cluster, 2)
    run = cluster.sql("SELECT run_id FROM qinglong.runs ORDER BY run_id LIMIT 1")[0][0]
    cluster.sql(drift, {"run": run})
    report, codes = _recover(cluster)
    assert report.candidates == (str(run),)
    assert report.pristine_queued == 1
    assert "cluster_postgres.recovery_candidates" in codes


def test_publisher_bad_input_writes_nothing(cluster):
    """A half-published trigger (head without schedule, or the reverse) would never fire or fire
    an unvalidated spec."""
    seed(cluster, 1)

    async def body():
        backend = cluster.backend("admin")
        pub = backend.publisher()
        async with closing(backend):
            with pytest.raises(TriggerSpecError):
                await pub.put_trigger(TriggerDefinition("p1", "bad", "task", "cron", {"expression": "61 * * * *"}))
            with pytest.raises(NotFound):
                await pub.put_trigger(TriggerDefinition("p1", "orphan", "nosuchtask", "cron",
                                                        {"expression": "* * * * *"}))
            with pytest.raises(AlreadyExists):
                await pub.create_project("p1")
            await pub.create_project("p2")
            await pub.put_task("p2", "task", {"cmd": "x"})
            with pytest.raises(AlreadyExists):  # trigger ids are unique across projects
                await pub.put_trigger(TriggerDefinition("p2", "tr000", "task", "cron", {"expression": "* * * * *"}))
            same = await pub.put_trigger(TriggerDefinition("p1", "tr000", "task", "cron", {"expression": "0 0 1 1 *"}))
            assert same.trigger_revision == 1  # unchanged definition, no new revision
            off = await pub.set_trigger_enabled("p1", "tr000", False)
            assert off.trigger_revision == 2 and not off.enabled
            await pub.delete_trigger("p1", "tr000")

    arun(body())
    assert cluster.count("triggers") == 0 and cluster.count("trigger_schedules") == 0
    assert cluster.count("tasks") == 2 and cluster.count("execution_revisions") == 2


def test_plugin_package_import_does_not_load_psycopg():
    """The host imports the package to read its hook; psycopg must wait for the factory."""
    code = ("import sys; import qinglong.plugins.cluster_postgres as p; p.qinglong_scheduler_backends(); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_every_sql_block_is_named_and_documented():
    """An undocumented or duplicated block would be loaded by the wrong name or not understood."""
    from qinglong.contracts.errors import PackagingError
    from qinglong.plugins.cluster_postgres import sql

    assert {"claim_due_schedules", "admit_page", "scan_in_flight_runs"} <= set(sql.names())
    with pytest.raises(PackagingError, match="no SQL block named 'nope'"):
        sql.query("nope")


def test_runs_the_worker_protocol_holds_are_counted_apart_not_as_candidates(cluster):
    """With workers, Runs leased to a session, requeued after an expiry or waiting for a retry
    are normal: reporting each as "in-flight work needs recovery" at every replica start would
    bury a real candidate under hundreds of false alarms. A drift of such a Run (a lease that
    lost its token) is still a candidate."""
    from tests.cluster.control_helpers import ProtocolWorker, admit, publish

    tasks = [f"job{i}" for i in range(4)]
    publish(cluster, tasks, ["true"])
    for task in tasks:
        admit(cluster, task)
    worker = ProtocolWorker(cluster, "w-recovery")
    try:
        leased = worker.claim(3)
        worker.started(leased[0])           # running, leased
        requeued = leased[2].run_id         # dispatching, then given back by its lease's expiry
        cluster.sql("UPDATE qinglong.attempts SET lease_expires_at_ms = 0 WHERE attempt_id = %s",
                    (leased[2].attempt_id,))
        expire(cluster, 10)
        assert cluster.sql("SELECT state FROM qinglong.runs WHERE run_id = %s", (requeued,))[0][0] == "queued"
        report, codes = _recover(cluster)
        assert (report.pristine_queued, report.worker_held, report.candidates) == (1, 3, ())
        assert "cluster_postgres.recovery_candidates" not in codes
        cluster.sql("UPDATE qinglong.attempts SET lease_token_hash = NULL, state = 'claimed' "
                    "WHERE attempt_id = %s", (leased[1].attempt_id,))
        report, _ = _recover(cluster)
        assert report.candidates == (leased[1].run_id,) and report.worker_held == 2
    finally:
        worker.close()
