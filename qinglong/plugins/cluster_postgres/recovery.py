"""Startup recovery: tell pristine queued work from work that needs a decision.

A pristine queued Attempt (see ``sql/recovery.sql``) is exactly what admission left and is NOT a
failed execution: it is counted and left alone. A Run the worker protocol holds (leased to a
worker, or waiting again after a requeue or for a retry) is owned by the workers and the replicas'
lease expiry: it is counted apart (``worker_held``). Every other in-flight Run (any drifted field,
a dispatching or running Run without its lease, a missing Attempt, an execution digest that is not
the pinned revision's, queue or Attempt times other than the admission time, events other than
exactly ``run.created``/``run.queued`` with seq 1 and 2 on a first Attempt never leased) is a
recovery candidate.

Choice: recovery never writes and never raises for candidates; it returns them in
:class:`~qinglong.contracts.records.RecoveryReport` (and the backend reports their number to the
diagnostic sink). The scheduler only creates new queued work, which candidates cannot disturb, so
blocking it would only add an outage; the dispatch side, when it exists, owns the candidates.
"""

from __future__ import annotations

from psycopg.rows import dict_row

from qinglong.contracts.records import RecoveryReport

from .sql import query


async def scan(conn) -> RecoveryReport:
    """Classify every in-flight Run; read-only."""
    pristine = held = 0
    candidates: list[str] = []
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("scan_in_flight_runs"))
        for row in await cur.fetchall():
            if row["pristine"]:
                pristine += 1
            elif row["worker_protocol"]:
                held += 1
            else:
                candidates.append(row["run_id"])
    return RecoveryReport(pristine_queued=pristine, candidates=tuple(candidates), worker_held=held)


async def enabled_kinds(conn) -> dict[str, int]:
    """``{kind: number of enabled triggers}``; read-only."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("enabled_trigger_kinds"))
        return {row["kind"]: int(row["triggers"]) for row in await cur.fetchall()}
