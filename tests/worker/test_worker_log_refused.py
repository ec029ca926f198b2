"""A database that refuses log appends (its disk is full) must not hold a finished job's Run.

The refusal is PostgreSQL's own ``disk_full`` (SQLSTATE 53100), raised by the real server from a
trigger this test puts on ``attempt_logs``: every append fails as it would on a full disk, while
every other statement (heartbeats, the completion) goes through.
"""

from __future__ import annotations

import signal

import pytest

from tests.worker.helpers import SHORT_TIMING, admit, attempts, publish_task, py_job, start_worker, wait_run_state

pytestmark = pytest.mark.postgres

FULL_DISK = """
CREATE FUNCTION public.refuse_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
END $$;
CREATE TRIGGER refuse_log BEFORE INSERT ON qinglong.attempt_logs
    FOR EACH ROW EXECUTE FUNCTION public.refuse_log();
"""


def test_a_finished_job_completes_at_once_when_the_database_refuses_its_log(cluster, tmp_path, worker_gateway):
    """The job prints and exits 0 while every log append is refused. If completion waited on the
    log, the Run would stay running (its lease renewed) until the task's timeout, blocking
    forbid/queue for as long; if the worker took the refusal for an unavailable store, its
    diagnostics would flap unavailable/available at every heartbeat. The Attempt succeeds with
    the bytes the store holds (none) and the tail it never got counted as missing, said once."""
    trigger = publish_task(cluster, "chatty", {"command": py_job("print('x' * 5000)"), "timeout_ms": 3_600_000})
    run_id = admit(cluster, trigger)
    token = worker_gateway.register("w-full")  # the CLI refuses a catalog with the test's trigger
    cluster.sql(FULL_DISK)
    worker = start_worker(worker_gateway, tmp_path, "w-full", token=token, **SHORT_TIMING)
    try:
        assert wait_run_state(cluster, run_id) == "succeeded"
        (attempt,) = attempts(cluster, run_id)
        missing = cluster.sql("SELECT log_tail_missing_bytes FROM qinglong.attempts WHERE attempt_id = %s",
                              (attempt["attempt_id"],))[0][0]
        assert (attempt["state"], attempt["exit_code"], attempt["log_bytes"]) == ("succeeded", 0, 0), attempt
        assert missing == 5001
        codes = [e["code"] for e in worker.events()]
        assert codes.count("worker.log_tail_incomplete") == 1, codes
        assert "worker.store_unavailable" not in codes and "worker.store_available" not in codes, codes
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        worker.stop()
