"""Startup recovery: leave pristine queued attempts alone, report everything else in flight.

A pristine queued Attempt is exactly what admission wrote: the Run is ``queued`` with
``queued_at_ms`` set, the Attempt is its latest, ``claimed`` for ``remote_worker``, and every
worker, session, lease, offer, callback, start, finish, result and error field is NULL. Such a Run
is waiting for dispatch, not failed. Anything else in flight is a candidate for an operator or a
later recovery step; nothing here modifies it (fail closed).
"""

from __future__ import annotations

import sqlite3

from qinglong.contracts.records import RecoveryReport

from .queries import q

#: How many candidates a report names one by one; the rest are summarised in one line.
CANDIDATE_BOUND = 100


def _describe(row: tuple) -> str:
    run_id, run_state, queued_at, attempt_id, attempt_no, attempt_state, executor, touched = row
    if attempt_id is None:
        return f"run {run_id} ({run_state}) has no attempt"
    reasons = []
    if run_state != "queued":
        reasons.append(f"run state {run_state!r}")
    if queued_at is None:
        reasons.append("queued_at_ms is NULL")
    if attempt_state != "claimed":
        reasons.append(f"attempt state {attempt_state!r}")
    if executor != "remote_worker":
        reasons.append(f"executor {executor!r}")
    if touched:
        reasons.append("dispatch or result fields are set")
    detail = ", ".join(reasons) or "attempt drifted"
    return f"run {run_id} attempt {attempt_id} (#{attempt_no}): {detail}"


def recover_in_thread(conn: sqlite3.Connection) -> RecoveryReport:
    """Count pristine queued attempts and describe the other in-flight Runs, in one read snapshot."""
    conn.execute("BEGIN")
    try:
        pristine = conn.execute(q("count_pristine_queued")).fetchone()[0]
        rows = conn.execute(q("in_flight_not_pristine"), (CANDIDATE_BOUND + 1,)).fetchall()
    finally:
        conn.execute("COMMIT")
    candidates = [_describe(row) for row in rows[:CANDIDATE_BOUND]]
    if len(rows) > CANDIDATE_BOUND:
        candidates.append(f"more than {CANDIDATE_BOUND} in-flight runs need recovery; "
                          "only the first are listed")
    return RecoveryReport(pristine_queued=pristine, candidates=tuple(candidates))
