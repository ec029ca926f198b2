"""SIGTERM drains a ``qinglong worker``: no new claims, running jobs may finish up to the drain
timeout, then they are stopped and reported ``cancelled``; the session is closed; exit 0."""

from __future__ import annotations

import signal

from tests.worker.drain_jobs import GATED_JOB
from tests.support.procs import process_alive
from tests.worker.helpers import (
    start_worker,
    keeper_pid,
    admit,
    attempts,
    group_alive,
    py_job,
    publish_task,
    run_state,
    wait_until,
)

def _session_closed(cluster, worker_id: str) -> bool:
    rows = cluster.sql("SELECT closed_at_ms FROM qinglong.worker_sessions WHERE worker_id = %s", (worker_id,))
    return bool(rows) and rows[0][0] is not None


def test_sigterm_lets_the_running_job_finish_reports_it_claims_nothing_more_and_closes_the_session(cluster, tmp_path, worker_gateway):
    """Without the drain a deploy's SIGTERM would kill every running job (or leave it running with
    no session fencing it); a worker that kept claiming while draining would start Runs it is
    about to abandon; an unclosed session would hold its Runs until the lease expires."""
    mark, release = tmp_path / "job.pid", tmp_path / "release"
    trigger = publish_task(cluster, "gated", {"command": py_job(GATED_JOB, str(mark), str(release))})
    run_id = admit(cluster, trigger)
    worker = start_worker(worker_gateway, tmp_path, "w-drain", level="debug")
    try:
        wait_until(mark.exists, "the job to start")
        assert run_state(cluster, run_id) == "running"
        keeper = wait_until(lambda: keeper_pid(worker.proc.pid), "the worker's fence keeper")
        worker.signal(signal.SIGTERM)
        worker.wait_event("worker.draining")
        later = admit(cluster, publish_task(cluster, "later", {"command": py_job("print('later')")}))
        # the worker keeps its session alive while it drains: heartbeats go on, and each one moves
        # the fences (its keeper's, the executor's) on: the job lives past a whole session lease
        heartbeats = len(worker.events("worker.heartbeat"))
        worker.wait_event("worker.heartbeat", heartbeats + 6)
        assert worker.proc.poll() is None and run_state(cluster, run_id) == "running"
        assert group_alive(int(mark.read_text().split()[1]))
        release.touch()
        assert worker.wait() == 0
        (attempt,) = attempts(cluster, run_id)
        assert (attempt["state"], attempt["exit_code"]) == ("succeeded", 0)
        assert run_state(cluster, run_id) == "succeeded"
        assert _session_closed(cluster, "w-drain")
        # a clean stop leaves no keeper behind (it was told to exit, and signalled nothing)
        wait_until(lambda: not process_alive(keeper), "the fence keeper to exit")
        # the Run admitted during the drain was never claimed
        assert run_state(cluster, later) == "queued"
        assert [a["state"] for a in attempts(cluster, later)] == ["claimed"]
        assert len(worker.events("worker.claimed")) == 1
        worker.wait_event("worker.stopped")
    finally:
        release.touch()
        worker.stop()


def test_the_drain_timeout_stops_the_job_and_reports_it_cancelled(cluster, tmp_path, worker_gateway):
    """A job that outlives the drain timeout must be stopped (TERM to its group) and reported
    cancelled before the worker exits; otherwise it would run on with no session fencing it, or
    its Run would end lost and maybe run twice."""
    mark, release = tmp_path / "job.pid", tmp_path / "release"
    trigger = publish_task(cluster, "stuck", {"command": py_job(GATED_JOB, str(mark), str(release))})
    run_id = admit(cluster, trigger)
    worker = start_worker(worker_gateway, tmp_path, "w-stuck", drain_timeout_ms=500)
    try:
        wait_until(mark.exists, "the job to start")
        pid, pgid = map(int, mark.read_text().split())
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        wait_until(lambda: not group_alive(pgid), "the job's process group to be gone")
        (attempt,) = attempts(cluster, run_id)
        assert attempt["state"] == "cancelled"
        assert attempt["signal"] == signal.SIGTERM
        assert run_state(cluster, run_id) == "cancelled"
        assert _session_closed(cluster, "w-stuck")
        worker.wait_event("worker.drain_timeout")
    finally:
        release.touch()
        worker.stop()


def test_a_second_signal_kills_the_jobs_before_the_worker_exits(cluster, tmp_path, worker_gateway):
    """A forced exit that left its job running would leave a process that no session fences: once
    the lease expired another worker could run the same Run beside it."""
    mark, release = tmp_path / "job.pid", tmp_path / "release"
    trigger = publish_task(cluster, "forced", {"command": py_job(GATED_JOB, str(mark), str(release))})
    admit(cluster, trigger)
    worker = start_worker(worker_gateway, tmp_path, "w-forced")
    try:
        wait_until(mark.exists, "the job to start")
        pid, pgid = map(int, mark.read_text().split())
        worker.signal(signal.SIGTERM)
        worker.wait_event("worker.draining")
        worker.signal(signal.SIGINT)
        assert worker.wait() == 130
        wait_until(lambda: not group_alive(pgid), "the job's process group to be gone")
        assert "second signal" in worker.text()
    finally:
        release.touch()
        worker.stop()
