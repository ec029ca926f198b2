"""SIGTERM drains a ``qinglong worker``: no new claims, running jobs may finish up to the drain
timeout, then they are stopped and reported ``cancelled``; the session is closed; exit 0. A claim
answered after the signal starts nothing: the session's close puts what it took back in the queue."""

from __future__ import annotations

import signal

from devtools.fault_proxy import TO_SERVER, FaultProxy
from tests.support.gateway import start_gateway_worker
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
    wait_run_state,
    wait_until,
)

def _session_closed(cluster, worker_id: str) -> bool:
    rows = cluster.sql("SELECT closed_at_ms FROM qinglong.worker_sessions WHERE worker_id = %s", (worker_id,))
    return bool(rows) and rows[0][0] is not None


def _events(cluster, run_id: str) -> list[str]:
    return [r[0] for r in cluster.sql("SELECT event_type FROM qinglong.run_events WHERE run_id = %s ORDER BY seq",
                                      (run_id,))]


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


#: Appends its pid to ``sys.argv[1]``: one line per execution of the job.
COUNTED_JOB = "import os, sys\nopen(sys.argv[1], 'a').write('%d\\n' % os.getpid())\n"

CLAIM = b"POST /worker/v1/claim "


def test_a_claim_answered_after_sigterm_starts_nothing_and_its_run_goes_back_to_the_queue(cluster, tmp_path,
                                                                                         worker_gateway):
    """A claim sent before SIGTERM may be answered during the drain, with a Run admitted after the
    stop began. Were that Attempt started, the stopping worker would run a new job its drain then
    waits for (holding the deploy) or cuts at the drain timeout (the Run ends cancelled, not run);
    were it dropped without closing the session, the Run would stay held by a dead session until
    its lease expired. It must start nothing and leave the Attempt to the session's close, which
    puts the Run back in the queue for another worker to run, once."""
    mark, release = tmp_path / "job.pid", tmp_path / "release"
    executions = tmp_path / "later.executions"
    held = admit(cluster, publish_task(cluster, "gated", {"command": py_job(GATED_JOB, str(mark), str(release))}))
    later_trigger = publish_task(cluster, "later", {"command": py_job(COUNTED_JOB, str(executions))})
    with FaultProxy(("127.0.0.1", worker_gateway.api.port), name="worker-link") as proxy:
        # the first claim (which takes the gated Run) is answered only once the next claim, for
        # the slot left free, is armed to be held before it reaches the gateway
        first = proxy.arm(TO_SERVER, CLAIM, "hold_replies")
        token = worker_gateway.register("w-left")
        # a lease long enough that the held claim's own bound (8 s + its wait) is never reached
        worker = start_gateway_worker(f"http://{proxy.host}:{proxy.port}", token, tmp_path, "w-left",
                                      session_lease_ms=30_000, claim_wait_ms=60_000)
        successors: list = []
        try:
            wait_until(first.fired.is_set, "the worker's first claim")
            second = proxy.arm(TO_SERVER, CLAIM, "hold")
            proxy.heal()
            wait_until(mark.exists, "the gated job to start")
            wait_until(second.fired.is_set, "the claim for the free slot, held before the gateway")
            worker.signal(signal.SIGTERM)
            worker.wait_event("worker.draining")
            later = admit(cluster, later_trigger)
            assert run_state(cluster, later) == "queued"
            proxy.heal()  # the claim reaches the gateway now and takes the later Run at once
            wait_until(lambda: worker.events("worker.claim_left") or len(worker.events("worker.claimed")) > 1,
                       "the stopping worker to leave (or adopt) what its claim took")
            taken = [e["run_id"] for e in worker.events("worker.claimed")]
            assert taken == [held], f"the stopping worker adopted run {later} to start it: {taken}"
            (left,) = worker.events("worker.claim_left")
            assert left["attempts"] == 1
            # the claim did take it: leased to this worker's session, never started
            rows = cluster.sql("SELECT state, worker_id, started_at_ms FROM qinglong.attempts WHERE run_id = %s",
                               (later,))
            assert rows == [("dispatching", "w-left", None)]
            release.touch()
            assert worker.wait() == 0
            assert not executions.exists()
            assert run_state(cluster, held) == "succeeded"
            _put_back_then_run_once_by_another(cluster, worker_gateway, tmp_path, later, executions, successors)
        finally:
            release.touch()
            worker.stop()
            for successor in successors:
                successor.stop()


COMPLETE_AND_CLAIM = b"POST /worker/v1/complete_and_claim "


def test_a_completion_that_claims_answered_after_sigterm_starts_nothing_it_claimed(cluster, tmp_path,
                                                                                    worker_gateway):
    """A job's end claims for the slot it frees in the same request; sent before SIGTERM and
    answered during the drain, that claim must start nothing either. Were its Attempt started, the
    stopping worker would run a new job its drain waits for (holding the deploy) or cuts at the
    drain timeout (the Run ends cancelled, never run). It is left to the session's close, which
    puts the Run back in the queue for another worker to run, once."""
    mark, release = tmp_path / "job.pid", tmp_path / "release"
    executions = tmp_path / "later.executions"
    held = admit(cluster, publish_task(cluster, "gated", {"command": py_job(GATED_JOB, str(mark), str(release))}))
    later_trigger = publish_task(cluster, "later", {"command": py_job(COUNTED_JOB, str(executions))})
    with FaultProxy(("127.0.0.1", worker_gateway.api.port), name="worker-link") as proxy:
        token = worker_gateway.register("w-left", capacity=1)
        worker = start_gateway_worker(f"http://{proxy.host}:{proxy.port}", token, tmp_path, "w-left",
                                      max_running=1, session_lease_ms=30_000)
        successors: list = []
        try:
            wait_until(mark.exists, "the gated job to start")
            completion = proxy.arm(TO_SERVER, COMPLETE_AND_CLAIM, "hold")
            # queued while the worker's one slot is taken: only the held completion can claim it
            later = admit(cluster, later_trigger)
            release.touch()
            wait_until(completion.fired.is_set, "the gated job's completion, held before the gateway")
            worker.signal(signal.SIGTERM)
            worker.wait_event("worker.draining")
            proxy.heal()  # the completion reaches the gateway now and claims the later Run with it
            wait_until(lambda: worker.events("worker.claim_left") or len(worker.events("worker.claimed")) > 1,
                       "the stopping worker to leave (or adopt) what its completion claimed")
            taken = [e["run_id"] for e in worker.events("worker.claimed")]
            assert taken == [held], f"the stopping worker adopted run {later} to start it: {taken}"
            (left,) = worker.events("worker.claim_left")
            assert left["attempts"] == 1
            assert worker.wait() == 0
            assert not executions.exists()
            assert run_state(cluster, held) == "succeeded"
            _put_back_then_run_once_by_another(cluster, worker_gateway, tmp_path, later, executions, successors)
        finally:
            release.touch()
            worker.stop()
            for successor in successors:
                successor.stop()


def _put_back_then_run_once_by_another(cluster, worker_gateway, tmp_path, later, executions, successors) -> None:
    """What a stopping worker's close left of the Attempt its late claim took: its session
    closed, the Run queued, the Attempt unleased and never started; then another worker runs
    it exactly once (started into ``successors``, for the caller to stop)."""
    assert _session_closed(cluster, "w-left")
    assert run_state(cluster, later) == "queued"
    rows = cluster.sql("SELECT state, worker_id, started_at_ms FROM qinglong.attempts WHERE run_id = %s",
                       (later,))
    assert rows == [("claimed", None, None)]
    assert _events(cluster, later).count("run.started") == 0
    successors.append(start_worker(worker_gateway, tmp_path, "w-next"))
    assert wait_run_state(cluster, later) == "succeeded"
    assert len(executions.read_text().split()) == 1
    assert [(a["attempt_no"], a["state"]) for a in attempts(cluster, later)] == [(1, "succeeded")]
    assert _events(cluster, later).count("run.started") == 1
    assert [e["run_id"] for e in successors[-1].events("worker.claimed")] == [later]
