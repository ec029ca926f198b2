"""The Attempt's end is the job's own exit on the cluster, as on the local side: the worker states
how long before its completion the job exited (on its own clock) and the database dates the end
from its own now, never before the start nor after now; anything but an integer >= 0 is refused
and changes nothing. Called as the gateway role, as the gateway calls it for a worker."""

from __future__ import annotations

import os

from tests.cluster.test_worker_functions import (
    CMD,
    Claimed,
    Worker,
    admit,
    publish,
    snapshot,
    sqlstate_of,
)


def complete_with_age(w: Worker, c: Claimed, exit_age_ms, *, state: str = "succeeded", exit_code: int | None = 0,
                      log_bytes: int = 0, token: bytes | None = None, stop: tuple = (None, None)):
    return w.conn.execute(
        "SELECT * FROM qinglong.worker_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
        "%s::bigint)",
        (w.worker_id, w.session_id, w.generation, c.attempt_id, c.lease_version,
         c.token if token is None else token, state, exit_code, None, log_bytes, 0, None, True, 0,
         *stop, exit_age_ms)).fetchone()


def times_of(db, attempt_id: str) -> tuple:
    return db.sql("SELECT a.started_at_ms, a.finished_at_ms, r.finished_at_ms FROM qinglong.attempts a "
                  "JOIN qinglong.runs r USING (run_id) WHERE a.attempt_id = %s", (attempt_id,))[0]


def shift_start(db, attempt_id: str, ms: int) -> None:
    """Make the Attempt look started ``ms`` earlier: the drain of its output then took that long."""
    db.sql("UPDATE qinglong.attempts SET started_at_ms = started_at_ms - %s WHERE attempt_id = %s",
           (ms, attempt_id))


def outbox_duration(db, run_id: str):
    return db.sql("SELECT duration_ms FROM qinglong.event_outbox WHERE run_id = %s AND kind = 'run.succeeded'",
                  (run_id,))[0][0]


def test_the_end_is_the_jobs_exit_not_the_completions_arrival(cluster):
    """Without the age the cluster recorded the moment the completion arrived, after the drain of
    the job's output: a 4 ms job shown as lasting 5 s on the cluster where the local profile
    shows 4 ms, in `runs show` and in the run.succeeded event's duration."""
    publish(cluster, "t", CMD)
    (run_id, _), = admit(cluster, "t")
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    shift_start(cluster, c.attempt_id, 10_000)  # started 10 s ago, exited 6 s later, drained 4 s
    assert complete_with_age(w, c, 4_000)[:2] == ("accepted", "succeeded")
    started, ended, run_finished = times_of(cluster, c.attempt_id)
    assert 6_000 <= ended - started < 10_000, (started, ended)
    assert run_finished - ended >= 4_000, (ended, run_finished)  # the Run ended when it was reported
    assert outbox_duration(cluster, run_id) == ended - started
    before = snapshot(cluster)
    assert complete_with_age(w, c, 0)[0] == "already_done"  # a replay with another age changes nothing
    assert snapshot(cluster) == before


def test_a_huge_age_is_dated_at_the_start_and_an_age_of_zero_at_now(cluster):
    """An end before the start would show a negative duration; an end after now a job still
    running when it was reported."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 2)
    w = Worker(cluster, "w1")
    first, second = w.claim(2)
    w.started(first)
    w.started(second)
    assert complete_with_age(w, first, 2 ** 63 - 1)[0] == "accepted"
    started, ended, _ = times_of(cluster, first.attempt_id)
    assert ended == started
    assert complete_with_age(w, second, 0)[0] == "accepted"
    started, ended, run_finished = times_of(cluster, second.attempt_id)
    assert started <= ended == run_finished


def test_a_forged_age_is_refused_and_another_workers_attempt_is_fenced(cluster):
    """A negative age would date the end after the completion (a job still running when it was
    reported), a non-integer one is no time at all; a worker that could date another's Attempt
    could rewrite that job's duration. Each is refused and changes nothing."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 2)
    w, other = Worker(cluster, "w1"), Worker(cluster, "w2")
    (mine,) = w.claim(1)
    (theirs,) = other.claim(1)
    w.started(mine)
    other.started(theirs)
    before = snapshot(cluster)
    refusals = {
        "a negative age": (lambda: complete_with_age(w, mine, -1), "QL003"),
        "the most negative age": (lambda: complete_with_age(w, mine, -(2 ** 63)), "QL003"),
        "a fraction": (lambda: complete_with_age(w, mine, "1.5"), "22P02"),
        "beyond a bigint": (lambda: complete_with_age(w, mine, str(2 ** 64)), "22003"),
        "another worker's attempt": (lambda: complete_with_age(w, theirs, 0), "QL002"),
        "wrong token": (lambda: complete_with_age(w, mine, 0, token=os.urandom(32)), "QL002"),
    }
    for name, (call, code) in refusals.items():
        assert sqlstate_of(call) == code, name
        assert snapshot(cluster) == before, name
    # a completion still short of its log writes no end
    assert complete_with_age(w, mine, 0, log_bytes=5)[0] == "log_incomplete"
    assert snapshot(cluster) == before
    # no age: the end is the completion's, as with the earlier forms
    assert complete_with_age(w, mine, None)[:2] == ("accepted", "succeeded")
    started, ended, run_finished = times_of(cluster, mine.attempt_id)
    assert ended == run_finished
