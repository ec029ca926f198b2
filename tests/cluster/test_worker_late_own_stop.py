"""A late completion (the worker lost its lease while reporting, or a restarted worker reports an
outcome it found on disk) states what a completion in time states: the worker's own stop request
and how long before the call the job exited. Kept only under the late completion's own fences
(the token of a started lease of this Attempt, by its worker; no other Attempt of the Run
started), only where that call ends the Attempt, and refused when forged. Called as the gateway
role, as the gateway calls it for a worker."""

from __future__ import annotations

import os

from tests.cluster.test_worker_functions import (
    CMD,
    RETRY_LOST,
    Claimed,
    Worker,
    admit,
    age_session,
    events_of,
    publish,
    snapshot,
    sqlstate_of,
)
from tests.support.cluster import expire


def complete_late(w: Worker, c: Claimed, reason, cancel_age_ms, exit_age_ms, *, state: str = "succeeded",
                  exit_code: int | None = 0, token: bytes | None = None, worker_id: str | None = None):
    return w.conn.execute(
        "SELECT * FROM qinglong.worker_complete_late(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::bigint, "
        "%s::bigint)",
        (worker_id or w.worker_id, c.attempt_id, c.lease_version, c.token if token is None else token, state,
         exit_code, None, 0, 0, None, reason, cancel_age_ms, exit_age_ms)).fetchone()


def attempt_of(db, attempt_id: str) -> tuple:
    return db.sql("SELECT state, cancel_reason, cancel_requested_at_ms, started_at_ms, finished_at_ms, "
                  "completed_late_at_ms FROM qinglong.attempts WHERE attempt_id = %s", (attempt_id,))[0]


def shift_start(db, attempt_id: str, ms: int) -> None:
    db.sql("UPDATE qinglong.attempts SET started_at_ms = started_at_ms - %s WHERE attempt_id = %s",
           (ms, attempt_id))


def test_a_late_completion_keeps_the_workers_timeout_and_the_jobs_exit(cluster):
    """Without them a job that exited 0 after the worker's timeout, reported late, showed no
    cancel_reason on the cluster (the local side shows it) and an end dated on the report's
    arrival, long after the job's exit: both facts hidden from the operator."""
    publish(cluster, "t", CMD)
    (run_id, _), = admit(cluster, "t")
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    shift_start(cluster, c.attempt_id, 10_000)  # started 10 s ago; timeout 7 s in; exited 8 s in
    assert complete_late(w, c, "timeout", 3_000, 2_000)[:2] == ("accepted", "succeeded")
    state, reason, requested, started, ended, late = attempt_of(cluster, c.attempt_id)
    assert (state, reason) == ("succeeded", "timeout")
    assert 7_000 <= requested - started < 10_000 and 8_000 <= ended - started < 10_000, (requested, ended)
    assert late is not None and late - ended >= 2_000
    events = events_of(cluster, run_id)
    assert events.count("run.cancel_requested") == 1, events
    assert events.index("run.cancel_requested") < events.index("run.finished"), events
    before = snapshot(cluster)
    assert complete_late(w, c, "timeout", 0, 0)[0] == "already_done"  # a replay changes nothing
    assert snapshot(cluster) == before


def test_a_late_shutdown_after_a_failed_exit_stops_the_retries(cluster):
    """A stop on purpose is never followed by a retry: reported late without it, a job the
    worker's shutdown stopped was run again on another worker after the operator stopped its host."""
    publish(cluster, "t", {"command": ["true"], "retry": {"max_attempts": 3, "initial_backoff_ms": 0,
                                                          "jitter": 0}})
    (run_id, _), = admit(cluster, "t")
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    assert complete_late(w, c, "shutdown", 0, 10 ** 15, state="failed", exit_code=3)[:2] == ("accepted", "failed")
    state, reason, requested, started, ended, _ = attempt_of(cluster, c.attempt_id)
    assert (state, reason, ended) == ("failed", "shutdown", started)  # a huge age: at the start
    assert cluster.sql("SELECT count(*) FROM qinglong.attempts WHERE run_id = %s", (run_id,))[0][0] == 1


def test_a_forged_or_foreign_late_completion_is_refused_and_changes_nothing(cluster):
    """A worker that could state a stop for another worker's Attempt could mark that job timed
    out and withhold its retries; a forged age could date an end after its report; a late
    report after another Attempt of the Run started would rewrite a Run already running again.
    Each is refused and writes no request, no event and no end."""
    publish(cluster, "t", RETRY_LOST)
    (run_id, _), = admit(cluster, "t")
    publish(cluster, "u", CMD)
    admit(cluster, "u")
    w, other = Worker(cluster, "w1"), Worker(cluster, "w2")
    (mine,) = w.claim(1)
    (theirs,) = other.claim(1)
    w.started(mine)
    other.started(theirs)
    before = snapshot(cluster)
    refusals = {
        "another worker's attempt, with its token": (
            lambda: complete_late(w, theirs, "timeout", 0, 0), "QL002"),
        "wrong token": (lambda: complete_late(w, mine, "timeout", 0, 0, token=os.urandom(32)), "QL002"),
        "a reason the control plane writes": (lambda: complete_late(w, mine, "operator", 0, 0), "QL003"),
        "a reason without its age": (lambda: complete_late(w, mine, "timeout", None, 0), "QL003"),
        "an age without a reason": (lambda: complete_late(w, mine, None, 5, 0), "QL003"),
        "a negative stop age": (lambda: complete_late(w, mine, "timeout", -1, 0), "QL003"),
        "a negative exit age": (lambda: complete_late(w, mine, "timeout", 0, -1), "QL003"),
        "a fractional exit age": (lambda: complete_late(w, mine, "timeout", 0, "2.5"), "22P02"),
    }
    for name, (call, code) in refusals.items():
        assert sqlstate_of(call) == code, name
        assert snapshot(cluster) == before, name
    # the lease runs out, the replica ends the Attempt lost and its retry starts on w2
    age_session(cluster, w)
    expire(cluster)
    (retry,) = other.claim(1)
    assert retry.run_id == run_id
    other.started(retry)
    before = snapshot(cluster)
    assert sqlstate_of(lambda: complete_late(w, mine, "shutdown", 0, 0)) == "QL002"
    assert snapshot(cluster) == before
    assert attempt_of(cluster, mine.attempt_id)[:2] == ("lost", None)
