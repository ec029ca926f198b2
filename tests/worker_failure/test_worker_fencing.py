"""A replaced session's calls are refused; a completion is accepted exactly once, late too.

First with real processes: a worker frozen with SIGSTOP while its job runs, the same worker id
started again (a new session: generation + 1), the frozen one continued after that; a frozen
worker killed and restarted. Then through
the store's side of the gateway directly (``PostgresWorkerProtocol`` as the gateway's role), where
the test holds the lease tokens and can replay a completion byte for byte.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from qinglong.contracts.execution import AttemptOutcome, AttemptState
from qinglong.contracts.worker import (
    CompletionResult,
    FenceRefused,
    SESSION_REPLACED,
    LeaseFenced,
    SessionFenced,
    new_lease_token,
)
from tests.worker_failure.harness import (
    audit_runs,
    executions,
    figures,
    overlaps,
    started_keys,
    wait_until,
)

pytestmark = pytest.mark.postgres

RETRY = {"max_attempts": 2, "initial_backoff_ms": 0, "jitter": 0}

#: Session timing of the real-process tests: a lease a loaded machine does not lapse by itself
#: (the harness's 5 s lapsed the replacing session under load, and its retry ended lost too).
#: Replacing a session does not wait on it; only the replaced session's Attempt waits for it.
STEADY_SESSION = {"session_lease_ms": 20_000, "heartbeat_ms": 4000, "self_fence_margin_ms": 4000}


def _one_job_running_on_w(c):
    """Task ``once`` (not idempotent), one replica, worker 'w', one Run whose job runs on 'w':
    the worker, the Run's id and its running Attempt."""
    c.publish_task("once", hold_s=60)
    c.start_replica("replica-1")
    w = c.add_worker("w")
    c.admit("once")
    (run_id,) = c.wait_runs(1)
    first = wait_until(lambda: next((a for a in c.attempts(run_id) if a["state"] == "running"
                                     and f"{run_id}.{a['attempt_id']}" in started_keys(c.markers)), None),
                       "the job to run")
    return w, run_id, first


def test_a_frozen_workers_finished_job_is_recorded_once_after_its_id_opened_a_new_session(cluster):
    """Worker 'w' runs a job, is frozen (SIGSTOP), its id is started again (new generation), the
    job ends while the old process is frozen, and the old process is continued. The job ran to
    exit 0: if that outcome were refused, the Run would be recorded lost and (idempotent) run a
    second time. The new process finds the receipt its id's job left on disk and reports it with
    the Attempt's token (late: no other Attempt had started), the continued process, replaced,
    stops; the outcome is recorded once, and nothing runs twice."""
    c = cluster
    c.publish_task("fence", retry=RETRY, idempotent=True)
    c.start_replica("replica-1")
    w = c.add_worker("w", **STEADY_SESSION)
    c.admit("fence")
    (run_id,) = c.wait_runs(1)
    first = wait_until(lambda: next((a for a in c.attempts(run_id) if a["state"] == "running"
                                     and f"{run_id}.{a['attempt_id']}" in started_keys(c.markers)), None),
                       "the job to run on the first process of 'w'")
    old = w.process
    generation = c.sessions()["w"]["generation"]
    old.signal(signal.SIGSTOP)
    c.release_jobs()  # the job ends while its worker is frozen: a completion waits to be sent
    first_key = f"{run_id}.{first['attempt_id']}"
    wait_until(lambda: first_key in c.watcher.gone_at, "the first job to end")
    w.restart()
    wait_until(lambda: c.sessions()["w"]["generation"] > generation, "the new session of 'w'")
    old.signal(signal.SIGCONT)
    states = c.wait_all_terminal()
    attempts = c.attempts(run_id)
    found, dups = executions(c.markers, c.watcher)
    audit = audit_runs(c, max_attempts=2)
    figures("frozen_worker_late_completion",
            attempts=[(a["attempt_no"], a["state"], a.get("exit_code"), a.get("session_generation"))
                      for a in attempts], run_state=states[run_id],
            completed_late=attempts[0].get("completed_late_at_ms") is not None,
            executions=[(e.attempt_id[:8], e.how) for e in found],
            late_codes=[code for code in w.codes() if code.startswith("worker.late") or code == "worker.completed_late"])
    assert [e.how for e in found if e.attempt_id == first["attempt_id"]] == ["done"]
    assert len(attempts) == 1 and attempts[0]["state"] == "succeeded", attempts
    assert attempts[0]["exit_code"] == 0 and attempts[0]["session_generation"] == generation
    assert attempts[0]["completed_late_at_ms"] is not None
    assert states[run_id] == "succeeded"
    assert len(found) == 1 and not dups and not overlaps(found) and not audit.problems, (found, audit.problems)


@pytest.mark.parametrize("wf_server", ["pg18"], indirect=True)
def test_a_restarted_worker_reports_the_outcome_its_killed_process_left_on_disk(cluster):
    """Worker 'w' is frozen while its job runs, the job ends with exit 0, and the frozen worker
    is killed -9: nothing reported the outcome, and the replica ends the Attempt lost when its
    lease runs out (not idempotent: never retried). If a restarted worker ignored the receipt
    on its disk, a job that ran to its end would stay recorded lost. The restarted worker reports
    it with the token written beside the job, and the Run succeeds, late."""
    c = cluster
    w, run_id, first = _one_job_running_on_w(c)
    w.process.signal(signal.SIGSTOP)
    c.release_jobs()
    wait_until(lambda: f"{run_id}.{first['attempt_id']}" in c.watcher.gone_at, "the job to end")
    w.process.kill9()
    w.restart()
    # the expiry may end the Attempt lost before the new process reports: wait for its report
    wait_until(lambda: {"worker.completed_late", "worker.late_scan_failed"} & set(w.process.codes()),
               "the restarted worker to report the outcome it found")
    states = c.wait_all_terminal()
    (attempt,) = c.attempts(run_id)
    found, dups = executions(c.markers, c.watcher)
    figures("restart_reports_found_receipt", attempt=(attempt["state"], attempt.get("exit_code")),
            completed_late=attempt.get("completed_late_at_ms") is not None, run_state=states[run_id],
            codes=[code for code in w.codes() if "late" in code])
    assert (attempt["state"], attempt["exit_code"]) == ("succeeded", 0), attempt
    assert attempt["completed_late_at_ms"] is not None and states[run_id] == "succeeded"
    assert "worker.completed_late" in w.codes() and len(found) == 1 and not dups


def test_a_frozen_workers_job_stopped_by_its_fence_is_never_recorded_as_the_jobs_own_failure(cluster):
    """Worker 'w' is frozen (SIGSTOP) while its job runs (a task that is not idempotent). Its
    fence keeper stops the job at the self-fence's TERM point (the marker job exits 143: died of
    TERM), the lease runs out and the replica ends the Run ``lost``; then the worker is continued.
    The TERM was the fence's own, so the receipt says nothing about the job: if the woken worker
    reported it (in time or late, as the token allows while nothing else started), the Run would
    be recorded ``failed`` by signal 15 with no reason, a failure of the job invented by the
    fence, and the lease expiry's true account (lost, and why) would be overwritten."""
    c = cluster
    w, run_id, first = _one_job_running_on_w(c)
    w.process.signal(signal.SIGSTOP)
    key = f"{run_id}.{first['attempt_id']}"
    wait_until(lambda: key in c.watcher.gone_at, "the fence keeper to stop the frozen worker's job")
    wait_until(lambda: c.run_states()[run_id] == "lost", "the lease's expiry to end the Run lost")
    w.process.signal(signal.SIGCONT)
    # the woken worker's word on that job: forgotten (not its to report), or reported late
    wait_until(lambda: {"worker.job_forgotten", "worker.completed_late", "worker.late_refused"}
               & set(w.codes()), "the woken worker to settle its stopped job")
    (attempt,) = c.attempts(run_id)
    found, dups = executions(c.markers, c.watcher)
    figures("fence_stopped_job_not_reported", attempt=(attempt["state"], attempt.get("exit_code"),
                                                        attempt.get("signal"), attempt.get("reason")),
            run_state=c.run_states()[run_id], codes=[code for code in w.codes()
                                                      if "late" in code or "fence" in code or "forgot" in code])
    assert [e.how for e in found] == ["term"], found
    assert attempt["state"] == "lost" and attempt["reason"], attempt
    assert attempt["completed_late_at_ms"] is None, attempt
    assert "worker.self_fenced" in w.codes() and "worker.completed_late" not in w.codes()
    assert c.run_states()[run_id] == "lost" and not dups


# ------------------------------------------------------------------------------- client API


async def _protocol(dsn: str, name: str):
    """The gateway's store side on its own connection (what the gateway calls for a worker)."""
    from qinglong.plugins.cluster_postgres.worker_client import PostgresWorkerProtocol

    protocol = PostgresWorkerProtocol(dsn, name)
    await protocol.connect()
    return protocol


def _outcome(state=AttemptState.SUCCEEDED, exit_code=0) -> AttemptOutcome:
    return AttemptOutcome(state, exit_code=exit_code, signal=None, ended_at_ms=None, log_bytes=0)


def _attempt_row(c, attempt_id: str) -> dict:
    return c.rows("SELECT to_jsonb(a) FROM qinglong.attempts a WHERE attempt_id = %s", (attempt_id,))[0][0]


def _events(c, run_id: str) -> list[str]:
    return [r[0] for r in c.rows("SELECT event_type FROM qinglong.run_events WHERE run_id = %s ORDER BY seq",
                                 (run_id,))]


def test_through_the_client_a_replaced_sessions_completion_is_refused_and_an_accepted_one_replays_as_already_done(cluster):
    """Through the protocol client: session 1 claims and starts an Attempt, the same worker id
    opens session 2, and session 1's completion must be refused with nothing changed (else a
    replaced session decides an outcome). The Attempt then expires lost (idempotent: retried),
    session 2 claims Attempt 2, completes it: accepted once; the exact replay answers
    already_done and changes nothing (else a lost reply would make the worker's repeat a second
    completion, or an error it cannot tell from a refusal); a different outcome is refused."""
    c = cluster
    c.publish_task("api", retry=RETRY, idempotent=True)
    c.start_replica("replica-1")  # admits, and expires the lapsed lease
    c.admit("api")
    (run_id,) = c.wait_runs(1)
    dsn = c.store_dsn  # the store side of the gateway, as the gateway's role

    async def body():
        one = await _protocol(dsn, "test session 1")
        two = await _protocol(dsn, "test session 2")
        try:
            s1 = await one.open_session("api-worker", [], 1, 5000)
            (claimed,) = await one.claim(s1.fence, [new_lease_token()])
            await one.started(s1.fence, claimed.lease)
            s2 = await two.open_session("api-worker", [], 1, 5000)
            before = _attempt_row(c, claimed.attempt_id)
            refusals = []
            for call in (lambda: one.complete(s1.fence, claimed.lease, _outcome()),
                         lambda: one.heartbeat(s1.fence, [claimed.attempt_id]),
                         lambda: one.claim(s1.fence, [new_lease_token()])):
                try:
                    await call()
                    refusals.append(None)
                except FenceRefused as exc:
                    refusals.append((type(exc).__name__, exc.reason))
            unchanged = _attempt_row(c, claimed.attempt_id) == before
            # session 2 keeps its lease alive while session 1's Attempt lapses and is retried
            retry = None
            while retry is None:
                await two.heartbeat(s2.fence, [])
                got = await two.claim(s2.fence, [new_lease_token()])
                retry = got[0] if got else None
                if retry is None:
                    await asyncio.sleep(0.2)
            await two.started(s2.fence, retry.lease)
            accepted = await two.complete(s2.fence, retry.lease, _outcome())
            row_after_accept = _attempt_row(c, retry.attempt_id)
            events_after_accept = _events(c, run_id)
            replay = await two.complete(s2.fence, retry.lease, _outcome())
            unchanged_by_replay = (_attempt_row(c, retry.attempt_id) == row_after_accept
                                   and _events(c, run_id) == events_after_accept)
            try:
                await two.complete(s2.fence, retry.lease, _outcome(AttemptState.FAILED, 1))
                different = None
            except FenceRefused as exc:
                different = type(exc).__name__
            return (claimed, retry, refusals, unchanged, accepted, replay, unchanged_by_replay,
                    different, s1, s2)
        finally:
            await one.close()
            await two.close()

    (claimed, retry, refusals, unchanged, accepted, replay, unchanged_by_replay, different,
     s1, s2) = asyncio.run(body())
    attempts = c.attempts(run_id)
    figures("client_fencing", refusals=refusals, generations=[s1.fence.generation, s2.fence.generation],
            accepted=accepted.result.value, replay=replay.result.value, different_outcome=different,
            attempts=[(a["attempt_no"], a["state"]) for a in attempts], events=_events(c, run_id))
    assert s2.fence.generation == s1.fence.generation + 1
    assert refusals == [(SessionFenced.__name__, SESSION_REPLACED)] * 3 and unchanged, (refusals, unchanged)
    assert retry.run_id == run_id and retry.attempt_no == 2
    assert [a["state"] for a in attempts] == ["lost", "succeeded"], attempts
    assert accepted.result is CompletionResult.ACCEPTED
    assert replay.result is CompletionResult.ALREADY_DONE and unchanged_by_replay
    assert replay.run_state == accepted.run_state
    assert different == LeaseFenced.__name__
    assert c.run_states()[run_id] == "succeeded"


def test_a_replaced_process_does_not_take_its_worker_id_back_from_the_process_that_replaced_it(cluster):
    """The same worker id started again while the first process is frozen (SIGSTOP), then the
    first one continued. If the replaced process opened a session again on being refused, the two
    would fence each other at every heartbeat (each new generation fences the other) and every
    job either of them starts would be stopped within a heartbeat: a Run of 3 s would never
    finish in its first Attempt and the generation would climb without end."""
    c = cluster
    c.publish_task("steady", hold_s=3, retry={"max_attempts": 5, "initial_backoff_ms": 0, "jitter": 0},
                   idempotent=True)
    c.start_replica("replica-1")
    w = c.add_worker("w", **STEADY_SESSION)
    wait_until(lambda: "w" in c.sessions(), "the first session of 'w'")
    old = w.process
    # frozen only once it has said so: a process stopped between its session's commit and its
    # own line about it would write that line after SIGCONT, as if it had opened a session again
    wait_until(lambda: any(e.get("code") == "worker.session_opened" for e in old.diagnostics()),
               "the first process to report its session")
    old.signal(signal.SIGSTOP)
    generation = c.sessions()["w"]["generation"]
    w.restart()
    wait_until(lambda: c.sessions()["w"]["generation"] > generation, "the new session of 'w'")
    replaced_by = c.sessions()["w"]["generation"]
    opened_before = [e for e in old.diagnostics() if e.get("code") == "worker.session_opened"]
    old.signal(signal.SIGCONT)
    c.admit("steady")
    (run_id,) = c.wait_runs(1)
    states = c.wait_all_terminal()
    # poll() is 0 for a clean exit: wait for an exit status, not for a truthy one
    wait_until(lambda: old.popen.poll() is not None, "the replaced process to exit")
    old_exit = old.popen.returncode
    attempts = c.attempts(run_id)
    final_generation = c.sessions()["w"]["generation"]
    found, dups = executions(c.markers, c.watcher)
    old_codes = [e.get("code") for e in old.diagnostics()]
    opened_after = [e for e in old.diagnostics() if e.get("code") == "worker.session_opened"][len(opened_before):]
    figures("replaced_process_keeps_off_its_id", generation_replaced_by=replaced_by,
            generation_at_end=final_generation, old_process_exit=old_exit,
            old_process_sessions_after_continue=len(opened_after),
            attempts=[(a["attempt_no"], a["state"], a.get("session_generation")) for a in attempts],
            how_jobs_ended=[e.how for e in found], run_state=states[run_id])
    assert not dups and not overlaps(found), (dups, found)
    # the replaced process opened no session again: it stepped aside (and said why)
    assert not opened_after and "worker.replaced" in old_codes, old_codes[-5:]
    # so the new process kept its session (on a loaded machine it may lapse and reopen once
    # by itself; each generation after it belongs to the new process's own log)
    new_sessions = [e for e in w.process.diagnostics() if e.get("code") == "worker.session_opened"]
    assert final_generation == new_sessions[-1]["generation"], (final_generation, new_sessions)
    assert states[run_id] == "succeeded", attempts


@pytest.mark.parametrize("wf_server", ["pg18", "pg15"], indirect=True)
@pytest.mark.parametrize("idempotent", [False, True])
def test_a_late_completion_proven_by_the_token_is_recorded_while_no_other_attempt_started(cluster, idempotent):
    """A worker started an Attempt, lost its session (its lease expired: the expiry ended the
    Attempt lost, and for an idempotent task scheduled Attempt 2), and then reports the exit 0
    its job really had, proven by the lease token. If the store refused it, a job that ran to its
    end would stay recorded ``lost`` (and, idempotent, run a second time). It is accepted and
    recorded as late, the retry that was never leased is withdrawn, and the Run succeeds. Once
    another Attempt of a Run has been leased, a late completion of the earlier one is refused
    (else a Run would get two outcomes), and a wrong token proves nothing."""
    c = cluster
    retry = {"max_attempts": 2, "initial_backoff_ms": 600_000, "jitter": 0}
    c.publish_task("late", retry=retry, idempotent=idempotent)
    c.start_replica("replica-1")  # admits, and expires the lapsed lease
    c.admit("late", 2)
    run_ids = c.wait_runs(2)
    dsn = c.store_dsn  # the store side of the gateway, as the gateway's role

    async def body():
        proto = await _protocol(dsn, "late worker")
        try:
            s1 = await proto.open_session("late-worker", [], 2, 5000)
            claimed = list(await proto.claim(s1.fence, [new_lease_token(), new_lease_token()]))
            for one in claimed:
                await proto.started(s1.fence, one.lease)
            # the session lapses: the replica ends both Attempts lost
            while any(a["state"] != "lost" for a in c.attempts() if a["attempt_no"] == 1):
                await asyncio.sleep(0.1)
            first, second = claimed
            # the second Run's retry (idempotent) or a fresh Run: another Attempt is leased first
            other = None
            if idempotent:
                s2 = await proto.open_session("other-worker", [], 1, 5000)
                c.rows("UPDATE qinglong.attempts SET not_before_ms = 0 WHERE run_id = %s AND attempt_no = 2",
                       (second.run_id,))
                while other is None:
                    got = await proto.claim(s2.fence, [new_lease_token()])
                    other = got[0] if got else None
            wrong = None
            try:
                await proto.complete_late("late-worker", type(first.lease)(first.attempt_id, first.lease.lease_version,
                                                                           new_lease_token()), _outcome())
            except FenceRefused as exc:
                wrong = type(exc).__name__
            accepted = await proto.complete_late("late-worker", first.lease, _outcome())
            replay = await proto.complete_late("late-worker", first.lease, _outcome())
            refused = None
            try:
                await proto.complete_late("late-worker", second.lease, _outcome())
            except FenceRefused as exc:
                refused = type(exc).__name__
            return first, second, other, wrong, accepted, replay, refused
        finally:
            await proto.close()

    first, second, other, wrong, accepted, replay, refused = asyncio.run(body())
    a1 = c.attempts(first.run_id)
    a2 = c.attempts(second.run_id)
    figures(f"late_completion_idempotent_{idempotent}", first=[(a["attempt_no"], a["state"]) for a in a1],
            second=[(a["attempt_no"], a["state"]) for a in a2], accepted=accepted.result.value,
            replay=replay.result.value, refused=refused, wrong_token=wrong)
    assert wrong == LeaseFenced.__name__
    assert accepted.result is CompletionResult.ACCEPTED and accepted.run_state.value == "succeeded"
    assert replay.result is CompletionResult.ALREADY_DONE
    assert [(a["attempt_no"], a["state"], a["exit_code"]) for a in a1] == [(1, "succeeded", 0)], a1
    assert a1[0]["completed_late_at_ms"] is not None
    assert c.run_states()[first.run_id] == "succeeded"
    assert "run.completed_late" in _events(c, first.run_id)
    if idempotent:
        # Attempt 2 of the second Run was leased before the late report: the lost Attempt stands
        assert refused == LeaseFenced.__name__ and other.run_id == second.run_id
        assert [a["state"] for a in a2] == ["lost", "dispatching"], a2
    else:
        assert refused is None and [a["state"] for a in a2] == ["succeeded"], a2


@pytest.mark.parametrize("wf_server", ["pg18", "pg15"], indirect=True)
def test_a_late_failure_of_a_run_ended_lost_is_retried_by_its_policy_and_the_run_is_open_again(cluster):
    """A non-idempotent Run whose lease lapsed ended ``lost`` (finished: no retry for a lost
    execution that may have run); its worker then proves the job really ran and failed with exit
    3. That outcome is recorded, and a failure is retried by the task's policy, so the Run is
    open again, waiting for Attempt 2. Were the Run left marked finished while it waits, the
    store would refuse the late report on every try (a check violation, answered as the store
    being down): the worker would retry it forever, its heartbeats starved until it fenced itself
    and forgot its other jobs, and the real outcome would never be recorded."""
    c = cluster
    c.publish_task("late-failure", retry={"max_attempts": 2, "initial_backoff_ms": 600_000, "jitter": 0},
                   idempotent=False)
    c.start_replica("replica-1")  # admits, and expires the lapsed lease
    c.admit("late-failure", 1)
    (run_id,) = c.wait_runs(1)
    dsn = c.store_dsn

    async def body():
        proto = await _protocol(dsn, "late worker")
        try:
            session = await proto.open_session("late-worker", [], 1, 5000)
            (claimed,) = await proto.claim(session.fence, [new_lease_token()])
            await proto.started(session.fence, claimed.lease)
            while c.run_states()[run_id] != "lost":  # the session lapses; the replica ends it
                await asyncio.sleep(0.1)
            finished_lost = c.rows("SELECT finished_at_ms FROM qinglong.runs WHERE run_id = %s", (run_id,))[0][0]
            accepted = await proto.complete_late("late-worker", claimed.lease,
                                                 _outcome(AttemptState.FAILED, exit_code=3))
            replay = await proto.complete_late("late-worker", claimed.lease,
                                               _outcome(AttemptState.FAILED, exit_code=3))
            return finished_lost, accepted, replay
        finally:
            await proto.close()

    finished_lost, accepted, replay = asyncio.run(body())
    attempts = c.attempts(run_id)
    run_row = c.rows("SELECT state, finished_at_ms FROM qinglong.runs WHERE run_id = %s", (run_id,))[0]
    figures("late_failure_of_a_lost_run", attempts=[(a["attempt_no"], a["state"]) for a in attempts],
            run=run_row, accepted=accepted.result.value)
    assert finished_lost is not None  # it had ended lost, finished
    assert accepted.result is CompletionResult.ACCEPTED and accepted.run_state.value == "retry_wait"
    assert replay.result is CompletionResult.ALREADY_DONE
    assert [(a["attempt_no"], a["state"], a["exit_code"]) for a in attempts] == [(1, "failed", 3), (2, "claimed", None)]
    assert attempts[0]["completed_late_at_ms"] is not None
    # waiting for its retry, the Run is not finished
    assert tuple(run_row) == ("retry_wait", None)
    assert _events(c, run_id)[-2:] == ["run.retry_scheduled", "run.completed_late"]
