"""Startup recovery: leave pristine queued attempts and executing Runs alone, report everything
else in flight.

A pristine queued Attempt is exactly what admission wrote: the Run is ``queued`` with
``queued_at_ms`` equal to its admission time and no finish; the Attempt is its latest and its
first, ``claimed`` for the executor its pinned task revision names (``executor`` in the payload,
default ``local_process``), created at the admission time, with every worker, session, lease,
offer, callback, dispatch, process, cancel, start, finish, result, log and error field unset and
the execution digest of that revision and executor (the revision stored with the digest the Run
recorded); and the Run has exactly the events
``run.created`` (seq 1) and ``run.queued`` (seq 2). Such a Run is waiting for dispatch, not failed.
A Run that is executing is not a candidate either: dispatching or running with its current
Attempt in the same state, or waiting in ``retry_wait`` for a later Attempt's backoff. The
dispatcher's reconciler inspects every one of those at start (re-adopt the process, take its
receipt, or end it ``lost``). Anything else in flight is a candidate for an operator or a later
recovery step; nothing here modifies it (fail closed).

Only Runs still in flight are read, through the partial index ``runs_in_flight``: finished Runs,
most of a long-lived file, cost recovery nothing.
"""

from __future__ import annotations

import sqlite3

from qinglong.contracts.records import RecoveryReport

from .queries import query
from .scheduler_read import pinned_execution_digest
from .store import named_rows

#: How many candidates a report names one by one; the rest are summarised in one line.
CANDIDATE_BOUND = 100


def _describe(row: sqlite3.Row) -> str:
    run_id, run_state, attempt_id = row["run_id"], row["run_state"], row["attempt_id"]
    queued_at, admitted_at = row["queued_at_ms"], row["admitted_at_ms"]
    attempt_no, attempt_state = row["attempt_no"], row["attempt_state"]
    attempt_created, touched, events_ok = (row["attempt_created_at_ms"], row["touched"],
                                           row["events_ok"])
    if attempt_id is None:
        return f"run {run_id} ({run_state}) has no attempt"
    reasons = []
    if run_state != "queued":
        reasons.append(f"run state {run_state!r}")
    if queued_at is None:
        reasons.append("queued_at_ms is NULL")
    elif queued_at != admitted_at:
        reasons.append("queued_at_ms differs from the admission time")
    if attempt_no != 1:
        reasons.append(f"latest attempt is #{attempt_no}, admission makes only #1")
    if attempt_state != "claimed":
        reasons.append(f"attempt state {attempt_state!r}")
    if attempt_created != admitted_at:
        reasons.append("attempt created_at_ms differs from the admission time")
    if touched:
        reasons.append("dispatch or result fields are set")
    if not events_ok:
        reasons.append("events are not exactly run.created (seq 1) and run.queued (seq 2) at the "
                       "admission time")
    detail = ", ".join(reasons) or "attempt drifted"
    return f"run {run_id} attempt {attempt_id} (#{attempt_no}): {detail}"


def recover_in_thread(conn: sqlite3.Connection) -> RecoveryReport:
    """Count pristine queued attempts and describe the other in-flight Runs, in one read snapshot.

    One pass over the in-flight Runs summarises them per pin; the Runs of a drifted shape or a
    wrong digest are read again (bounded) only when there are some.
    """
    conn.execute("BEGIN")
    try:
        pristine = 0
        drifted = False
        candidates: list[str] = []
        overflow = False
        for pin in named_rows(conn, query("in_flight_summary")):
            project_id, task_id, revision = pin["project_id"], pin["task_id"], pin["task_revision"]
            task_digest, digest = pin["task_digest"], pin["execution_digest"]
            executor = pin["executor"]
            if pin["executing"]:
                continue  # the dispatcher's reconciler inspects it (re-adopt, receipt or lost)
            if not pin["pristine"]:
                drifted = True
                continue
            problem = None
            named = conn.execute(query("task_revision_executor"),
                                 (project_id, task_id, revision, task_digest)).fetchone()
            if digest != pinned_execution_digest(project_id, task_id, revision, task_digest,
                                                 executor):
                problem = "execution digest does not match its pinned task revision"
            elif named is None:
                problem = (f"pinned task revision {task_id!r} #{revision} is not stored with the "
                           "digest the run recorded")
            elif named[0] != executor:
                problem = (f"executor {executor!r} is not the one its pinned task revision names "
                           f"({named[0]!r})")
            if problem is None:
                pristine += pin["runs"]
                continue
            room = CANDIDATE_BOUND + 1 - len(candidates)
            if room <= 0:
                overflow = True
                continue
            for run in named_rows(conn, query("in_flight_of_pin"),
                              (project_id, task_id, revision, task_digest, executor, digest,
                               room)):
                candidates.append(f"run {run['run_id']} attempt {run['attempt_id']} "
                                  f"(#{run['attempt_no']}): {problem}")
        if drifted:
            room = CANDIDATE_BOUND + 1 - len(candidates)
            if room > 0:
                candidates += [_describe(row) for row in
                               named_rows(conn, query("in_flight_not_pristine"), (room,))]
            else:
                overflow = True
    finally:
        conn.execute("COMMIT")
    if len(candidates) > CANDIDATE_BOUND or overflow:
        candidates = candidates[:CANDIDATE_BOUND]
        candidates.append(f"more than {CANDIDATE_BOUND} in-flight runs need recovery; "
                          "only the first are listed")
    return RecoveryReport(pristine_queued=pristine, candidates=tuple(candidates))
