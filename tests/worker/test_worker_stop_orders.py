"""What the store orders and what the clock says, acted on by a running ``qinglong worker``: an
operator's cancel request stops the job (``cancelled``), the task's timeout is enforced locally
(``timed_out``), and the log reaches the store while the job still runs."""

from __future__ import annotations

import signal

from tests.worker.drain_jobs import GATED_JOB
from tests.worker.helpers import (
    start_worker,
    admit,
    attempts,
    group_alive,
    py_job,
    publish_task,
    run_state,
    stored_log,
    wait_run_state,
    wait_until,
)


def test_a_cancel_request_stops_the_running_job_and_it_ends_cancelled(cluster, tmp_path, worker_gateway):
    """`qinglong runs cancel` only writes a durable request; if the worker did not act on the
    heartbeat's stop order the job would run on and end as if nobody had asked. Its log shipped
    while it ran is what `logs --follow` shows from any machine."""
    mark, release = tmp_path / "job.pid", tmp_path / "release"
    run_id = admit(cluster, publish_task(cluster, "cancel-me", {"command": py_job(GATED_JOB, str(mark), str(release))}))
    worker = start_worker(worker_gateway, tmp_path, "w-cancel")
    try:
        wait_until(mark.exists, "the job to start")
        _, pgid = map(int, mark.read_text().split())
        # shipped while it runs, before any completion
        wait_until(lambda: stored_log(cluster, attempts(cluster, run_id)[0]["attempt_id"]) == b"started\n",
                   "the running job's first line in the store")
        assert run_state(cluster, run_id) == "running"
        assert cluster.sql("SELECT qinglong.request_cancel(%s, 'operator')", (run_id,),
                           role="qinglong_runtime")[0][0] == "running"
        assert wait_run_state(cluster, run_id) == "cancelled"
        (attempt,) = attempts(cluster, run_id)
        assert (attempt["state"], attempt["signal"]) == ("cancelled", signal.SIGTERM)
        local = (tmp_path / "w-cancel-logs" / attempt["attempt_id"] / "log").read_bytes()
        assert local.startswith(b"started\n") and stored_log(cluster, attempt["attempt_id"]) == local
        wait_until(lambda: not group_alive(pgid), "the job's process group to be gone")
        worker.wait_event("worker.cancel_requested")
    finally:
        release.touch()
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()


def test_the_tasks_timeout_is_enforced_by_the_worker_and_the_attempt_ends_timed_out(cluster, tmp_path, worker_gateway):
    """A job past its timeout must be stopped by the worker that runs it; the control plane's
    double check only ends the Attempt a session lease later and cannot signal the process."""
    mark, release = tmp_path / "job.pid", tmp_path / "release"
    run_id = admit(cluster, publish_task(cluster, "slow", {"command": py_job(GATED_JOB, str(mark), str(release)),
                                                           "timeout_ms": 1000}))
    worker = start_worker(worker_gateway, tmp_path, "w-timeout")
    try:
        wait_until(mark.exists, "the job to start")
        _, pgid = map(int, mark.read_text().split())
        assert wait_run_state(cluster, run_id) == "timed_out"
        (attempt,) = attempts(cluster, run_id)
        assert (attempt["state"], attempt["signal"]) == ("timed_out", signal.SIGTERM)
        wait_until(lambda: not group_alive(pgid), "the job's process group to be gone")
        worker.wait_event("worker.timeout")
    finally:
        release.touch()
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()
