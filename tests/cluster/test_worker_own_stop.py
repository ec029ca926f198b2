"""A worker's own stop request (its timeout, its drain's shutdown) stated in its completion: kept
as the Attempt's cancel request only for the Attempt its whole fence names, only where that
completion ends it, never over a request already there, and refused when it is not one a worker
makes. Called as the gateway role, as the gateway calls it for a worker."""

from __future__ import annotations

import os

from tests.cluster.test_worker_functions import (
    CMD,
    Claimed,
    Worker,
    admit,
    events_of,
    publish,
    runtime_call,
    snapshot,
    sqlstate_of,
)


def complete_with_stop(w: Worker, c: Claimed, reason: str | None, age_ms: int | None, *, state: str = "succeeded",
                       exit_code: int | None = 0, log_bytes: int = 0, token: bytes | None = None):
    return w.conn.execute(
        "SELECT * FROM qinglong.worker_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (w.worker_id, w.session_id, w.generation, c.attempt_id, c.lease_version,
         c.token if token is None else token, state, exit_code, None, log_bytes, 0, None, True, 0,
         reason, age_ms)).fetchone()


def cancel_of(db, attempt_id: str) -> tuple:
    return db.sql("SELECT cancel_reason, cancel_requested_at_ms, started_at_ms, finished_at_ms "
                  "FROM qinglong.attempts WHERE attempt_id = %s", (attempt_id,))[0]


def test_a_workers_timeout_is_kept_beside_its_jobs_exit_dated_by_its_age_and_once(cluster):
    """Without it the store never learns that the worker's timeout fired after the job's exit:
    `runs show` on the cluster hides what the local profile shows. A replay of the completion
    must not write a second request or event."""
    publish(cluster, "t", CMD)
    (run_id, _), = admit(cluster, "t")
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    assert complete_with_stop(w, c, "timeout", 300)[:2] == ("accepted", "succeeded")
    reason, requested_at, started_at, finished_at = cancel_of(cluster, c.attempt_id)
    assert reason == "timeout"
    assert started_at <= requested_at <= finished_at - 300 or requested_at == started_at, \
        (started_at, requested_at, finished_at)
    before = snapshot(cluster)
    assert complete_with_stop(w, c, "timeout", 900)[0] == "already_done"
    assert snapshot(cluster) == before
    events = events_of(cluster, run_id)
    assert events.count("run.cancel_requested") == 1 and events[-2:] == ["run.cancel_requested", "run.finished"]


def test_an_age_beyond_the_attempts_start_is_dated_at_the_start(cluster):
    """A request dated before its Attempt began would say the job was asked to stop before it
    ran."""
    publish(cluster, "t", CMD)
    admit(cluster, "t")
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    complete_with_stop(w, c, "shutdown", 10 ** 15, state="cancelled", exit_code=None)
    reason, requested_at, started_at, _ = cancel_of(cluster, c.attempt_id)
    assert (reason, requested_at) == ("shutdown", started_at)


def test_an_operators_request_already_there_stays(cluster):
    """The first request stands, as on the local store: a worker's timeout reported later must
    not rewrite an operator's cancel as a timeout."""
    publish(cluster, "t", CMD)
    (run_id, _), = admit(cluster, "t")
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    runtime_call(cluster, "SELECT qinglong.request_cancel(%s, 'operator')", (run_id,))
    operator = cancel_of(cluster, c.attempt_id)[:2]
    assert complete_with_stop(w, c, "timeout", 0)[0] == "accepted"
    assert cancel_of(cluster, c.attempt_id)[:2] == operator
    assert events_of(cluster, run_id).count("run.cancel_requested") == 1


def test_a_stop_is_stated_only_for_the_callers_own_attempt_and_a_refusal_changes_nothing(cluster):
    """A worker that could state a stop for an Attempt it does not hold could mark another
    worker's job as timed out or stop its retries; a completion refused for its log must not
    leave the request behind either."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 2)
    w, other = Worker(cluster, "w1"), Worker(cluster, "w2")
    (mine,) = w.claim(1)
    (theirs,) = other.claim(1)
    w.started(mine)
    other.started(theirs)
    other.append(theirs, 0, b"abc")
    before = snapshot(cluster)
    refusals = {
        "another worker's attempt, with its token": (
            lambda: complete_with_stop(w, theirs, "timeout", 0, log_bytes=3), "QL002"),
        "wrong token": (lambda: complete_with_stop(w, mine, "timeout", 0, token=os.urandom(32)), "QL002"),
        "a reason the control plane writes": (lambda: complete_with_stop(w, mine, "operator", 0), "QL003"),
        "replaced": (lambda: complete_with_stop(w, mine, "replaced", 0), "QL003"),
        "a reason without its age": (lambda: complete_with_stop(w, mine, "timeout", None), "QL003"),
        "an age without a reason": (lambda: complete_with_stop(w, mine, None, 5), "QL003"),
        "a negative age": (lambda: complete_with_stop(w, mine, "timeout", -1), "QL003"),
        "a bad state": (lambda: complete_with_stop(w, mine, "timeout", 0, state="running"), "QL003"),
    }
    for name, (call, code) in refusals.items():
        assert sqlstate_of(call) == code, name
        assert snapshot(cluster) == before, name
    # the log is short: the completion answers log_incomplete and the request is not kept
    assert complete_with_stop(other, theirs, "timeout", 0, log_bytes=5)[0] == "log_incomplete"
    assert snapshot(cluster) == before
    # neither stop: the form behaves as the earlier one
    assert complete_with_stop(w, mine, None, None)[:2] == ("accepted", "succeeded")
    assert cancel_of(cluster, mine.attempt_id)[0] is None
