"""Startup recovery: tell pristine queued work from work that needs a decision.

A pristine queued Attempt (see ``sql/recovery.sql``) is exactly what admission left and is NOT a
failed execution: it is counted and left alone. Every other in-flight Run (any drifted field, a
``dispatching`` or ``running`` state, a newer Attempt, a missing Attempt, an execution digest that
is not the pinned revision's, queue or Attempt times other than the admission time, events other
than exactly ``run.created``/``run.queued`` with seq 1 and 2) is a recovery candidate.

Choice: recovery never writes and never raises for candidates; it returns them in
:class:`~qinglong.contracts.records.RecoveryReport` (and the backend reports their number to the
diagnostic sink). The scheduler only creates new queued work, which candidates cannot disturb, so
blocking it would only add an outage; the dispatch side, when it exists, owns the candidates.
"""

from __future__ import annotations

from qinglong.contracts.records import RecoveryReport

from .sql import query


async def scan(conn) -> RecoveryReport:
    """Classify every in-flight Run; read-only."""
    cur = await conn.execute(query("scan_in_flight_runs"))
    pristine = 0
    candidates: list[str] = []
    for run_id, is_pristine in await cur.fetchall():
        if is_pristine:
            pristine += 1
        else:
            candidates.append(run_id)
    return RecoveryReport(pristine_queued=pristine, candidates=tuple(candidates))


async def enabled_kinds(conn) -> dict[str, int]:
    """``{kind: number of enabled triggers}``; read-only."""
    cur = await conn.execute(query("enabled_trigger_kinds"))
    return {kind: int(n) for kind, n in await cur.fetchall()}
