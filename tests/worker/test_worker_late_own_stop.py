"""A ``qinglong worker`` killed while it drained the output of a job that had already exited, after
its own timeout fired: the worker started again on the same log folder reports the outcome it
finds on disk, late, with the timeout it had taken up and the job's own end, so the cluster
records what the first process would have."""

from __future__ import annotations

from tests.support.gateway import start_gateway_worker
from tests.worker.helpers import admit, publish_task


def test_a_restarted_worker_reports_its_timeout_and_the_jobs_exit_with_the_outcome_it_found(
        cluster, tmp_path, worker_gateway):
    """The job exited 0 at once, its helper held its output open, the worker's 1 s timeout fired
    during the drain, and the worker was killed -9. Its restart reported the exit late without
    the timeout (cancel_reason empty: `runs show` hid what the local profile shows) and dated the
    end at the report's arrival, long after the job's exit and after the first worker's death."""
    command = ["sh", "-c", "echo out; sleep 300 & exit 0"]
    run_id = admit(cluster, publish_task(cluster, "killed", {"command": command, "timeout_ms": 1_000}))
    token = worker_gateway.register("w-killed", capacity=2)
    settings = {"max_running": 2, "orphan_drain_ms": 600_000}
    first = start_gateway_worker(worker_gateway.url, token, tmp_path, "w-killed", **settings)
    try:
        first.wait_event("worker.timeout", what="the timeout to land during the drain")
        killed_at = cluster.db_now_ms()
        first.proc.kill()
        first.proc.wait(timeout=30)
    finally:
        first.stop()
    # the same id, settings and log folder: what a supervisor restarting it does
    second = start_gateway_worker(worker_gateway.url, token, tmp_path, "w-killed", **settings)
    try:
        second.wait_event("worker.completed_late", what="the restarted worker to report the outcome it found")
    finally:
        second.stop()
    ((state, exit_code, cancel_reason, started, ended, late, run_state),) = cluster.sql(
        "SELECT a.state, a.exit_code, a.cancel_reason, a.started_at_ms, a.finished_at_ms, a.completed_late_at_ms, "
        "r.state FROM qinglong.attempts a JOIN qinglong.runs r USING (run_id) WHERE a.run_id = %s", (run_id,))
    assert (state, exit_code, run_state) == ("succeeded", 0, "succeeded")
    assert cancel_reason == "timeout"
    assert late is not None and started <= ended < killed_at < late, (started, ended, killed_at, late)
