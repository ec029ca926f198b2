"""Admission: commit one decision for one claimed schedule, atomically, under the full fence.

One SERIALIZABLE transaction per occurrence, holding one statement (``sql/admission.sql``,
``admit_occurrence``). The statement re-checks everything by primary key and writes the Run,
Attempt, the two events, the skip record and the cursor advance together, or nothing.

Wire-atomic: the whole transaction travels as ONE simple-protocol Query message,
``SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET LOCAL enable_seqscan = off;
EXECUTE qinglong_admit_occurrence(<literals>)``,
on an autocommit connection. PostgreSQL runs such a message as one implicit transaction that
commits at the end of the message and rolls back by itself on any error, leaving the session
idle. The server executes nothing until the whole message has arrived, so a link cut at any
point either commits the whole occurrence (the client may not learn it: the same case as a lost
COMMIT reply) or nothing, and never leaves a transaction open with the schedule row locked.
(Sending BEGIN, the statement and COMMIT as separate messages could strand the transaction
between statement and COMMIT, with the row locked and SKIP LOCKED keeping every takeover off.)

The statement is a server-side prepared statement, made once per connection (a new connection
after a reconnect prepares it again) by a message of its own, so the large CTE is parsed and
planned once per session instead of once per occurrence; its arguments are bound client-side as
literals into the single message.

Outcomes: the decision committed (a Run admitted, the cursor initialised or skipped forward, or a
claim released), or :class:`~qinglong.contracts.errors.FenceLost` (someone else owns the schedule
now: a takeover after expiry, a republish, a deleted trigger, a deactivated project; never
retried), or :class:`AdmissionRefused` (the inputs do not verify, e.g. a corrupted execution
revision digest; nothing written), or its subclass :class:`TaskChanged` (the task was republished
between claim and commit: a legitimate race, not an error; the coordinator gives the claim back
and the occurrence is decided again next round). Serialization failures are retried a bounded number of times
with small full-jitter backoff; each retry re-checks the fence, so a retry can only end in
FenceLost, never in a second Run. When the retries run out the coordinator gives the claim back
(``claim.release_claim``) so the occurrence is claimed again next round.

A ``fire`` or ``initialize`` may ask to keep the claim (``keep_claim``): when the new cursor is
already due at the commit's clock, the claim stays this claimer's, the row's acquisition time
becomes the commit's, and :meth:`ClaimedSchedule.after` gives the claim to decide again at once.
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
import weakref
from dataclasses import dataclass, replace
from functools import lru_cache

import psycopg
from psycopg import AsyncClientCursor, pq
from psycopg import errors as pg_errors

from qinglong.contracts.errors import FenceLost
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.records import Admission, Decision, DecisionKind, ScheduleCursor

from .claim import ClaimedSchedule
from .db import AdmissionRefused
from .sql import query

#: SQLSTATEs worth retrying: the transaction lost a serialization race, nothing was written.
RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)

#: ``kind`` value of a commit that only releases the claim (a decision that changes nothing).
RELEASE = "release"

#: Name of the per-session prepared admission statement.
PREPARED_NAME = "qinglong_admit_occurrence"

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

#: Connections whose session holds the prepared statement. A reconnect is a new connection
#: object, so it is prepared again; weak, so a discarded connection is simply forgotten.
_prepared: "weakref.WeakSet[psycopg.AsyncConnection]" = weakref.WeakSet()


@lru_cache(maxsize=1)
def _prepared_statement() -> tuple[str, str]:
    """``(PREPARE text, admission message template)`` built from the ``admit_occurrence`` block.

    The block's named placeholders become positional parameters in order of first appearance
    (their types are inferred by the server from the statement); the template is the single
    message, with the same names as client-side placeholders in the same order.
    """
    names: list[str] = []

    def positional(match: re.Match) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    body = _PLACEHOLDER.sub(positional, query("admit_occurrence"))
    arguments = ", ".join(f"%({name})s" for name in names)
    # enable_seqscan off, for this transaction only: under SERIALIZABLE a sequential scan takes a
    # relation-level SIRead lock, which conflicts with every concurrent admission's insert. The
    # admission touches rows by key only, but the foreign-key checks of attempts and run_events
    # against runs are planned per session, and a small (or empty, analysed) runs table gets a
    # sequential scan: measured, that lock caused more than half of the serialization failures
    # of four replicas draining a backlog. PostgreSQL's documentation advises steering
    # serializable transactions towards index scans for this reason.
    message = (f"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET LOCAL enable_seqscan = off; "
               f"EXECUTE {PREPARED_NAME}({arguments})")
    return f"PREPARE {PREPARED_NAME} AS {body}", message


async def _prepare(conn: psycopg.AsyncConnection) -> None:
    # A message of its own, in autocommit: it takes no row lock, so a cut here leaves nothing.
    await AsyncClientCursor(conn).execute(_prepared_statement()[0])
    _prepared.add(conn)


async def _send_admission(conn: psycopg.AsyncConnection, params: dict) -> dict:
    """Send the admission as one Query message and return its result row by column name.

    The row is the third result of the message (after the two SETs'), reached by ``nextset``; it
    is keyed by the names ``cur.description`` gives for that result, on the client only (the
    message sent is unchanged)."""
    if conn not in _prepared:
        await _prepare(conn)
    cur = AsyncClientCursor(conn)
    try:
        await cur.execute(_prepared_statement()[1], params)
    except pg_errors.InvalidSqlStatementName:
        # the session lost the statement (DEALLOCATE, DISCARD): nothing ran; prepare and resend
        await _prepare(conn)
        await cur.execute(_prepared_statement()[1], params)
    cur.nextset()  # the first two results are the SETs'
    cur.nextset()
    names = [column.name for column in cur.description]
    return dict(zip(names, await cur.fetchone()))


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    """What one commit did. ``admission`` is set when a Run was created."""

    kind: str
    admission: Admission | None
    serialization_retries: int
    admitted_at_ms: int
    #: the claim is still ours (``keep_claim`` and the new cursor was due at ``admitted_at_ms``)
    claim_kept: bool = False


def after(claimed: ClaimedSchedule, decision: Decision, result: AdmissionResult) -> ClaimedSchedule:
    """The claim as it stands after ``result`` kept it: the decided cursor, one state version on,
    observed at the commit's clock (the row's new acquisition time), same fence."""
    cursor = claimed.cursor
    last = decision.scheduled_for_ms if decision.scheduled_for_ms is not None else cursor.last_scheduled_at_ms
    return replace(
        claimed,
        cursor=ScheduleCursor(cursor.trigger_revision, decision.next_fire_at_ms, last,
                              cursor.state_version + 1, cursor.published_at_ms),
        observed_at_ms=result.admitted_at_ms,
    )


class CasMiss(FenceLost):
    """The fence was intact but the schedule changed under it (revision, state or cursor)."""


class TaskChanged(AdmissionRefused):
    """The task was republished (a new revision) between the claim and the commit; nothing was
    written and the fence is still ours: give the claim back and decide again next round."""


def _params(claimed: ClaimedSchedule, decision: Decision | None, keep_claim: bool = False) -> dict:
    head, fence = claimed.head, claimed.fence
    if decision is None or decision.kind is DecisionKind.NOT_DUE:
        kind, next_ms, scheduled, skipped = RELEASE, claimed.cursor.next_fire_at_ms, None, None
    else:
        kind, next_ms, scheduled, skipped = (decision.kind.value, decision.next_fire_at_ms,
                                             decision.scheduled_for_ms, decision.skipped)
    key = idempotency_key(head.trigger_id, head.trigger_revision, scheduled, head.kind) if scheduled is not None else None
    return {
        "trigger_id": head.trigger_id,
        "task_id": head.task_id,
        "trigger_revision": head.trigger_revision,
        "trigger_digest": head.content_digest,
        "task_revision": claimed.task_revision,
        "task_digest": claimed.task_digest,
        "state_version": claimed.cursor.state_version,
        "expected_next_ms": claimed.cursor.next_fire_at_ms,
        "owner": fence.owner,
        "token": fence.token,
        "claim_version": fence.claim_version,
        "observed_at_ms": claimed.observed_at_ms,
        "kind": kind,
        "next_fire_at_ms": next_ms,
        "scheduled_for_ms": scheduled,
        "idempotency_key": key,
        "policy": head.misfire_policy.value,
        "skip_first_ms": skipped.first_ms if skipped else None,
        "skip_last_ms": skipped.last_ms if skipped else None,
        "skip_count": skipped.count if skipped else None,
        "skip_count_exact": skipped.count_exact if skipped else None,
        "keep_claim": bool(keep_claim) and kind in ("fire", "initialize"),
    }


def _refusal(claimed: ClaimedSchedule, row: dict) -> Exception:
    """Why an admission that advanced nothing refused: from its result row, by column name."""
    name = claimed.head.trigger_id
    if not row["schedule_found"]:
        return FenceLost(f"schedule of trigger {name!r} no longer exists")
    if not row["trigger_ok"]:
        # a republish (or a disable, which is one) since the claim: it also reset the claim, but
        # the cause is the schedule changing under the decision, a compare-and-set miss as on edge
        return CasMiss(f"trigger {name!r} changed revision or was disabled since it was claimed")
    if not row["fence_ok"]:
        return FenceLost(f"claim on trigger {name!r} was lost (expired, taken over or reset)")
    if not row["project_ok"]:
        return FenceLost(f"project of trigger {name!r} is no longer active")
    if not row["schedule_ok"]:
        return CasMiss(f"schedule of trigger {name!r} changed since it was claimed")
    if not row["task_ok"] and row["task_moved"]:
        return TaskChanged(
            f"task {claimed.head.task_id!r} of trigger {name!r} was republished since the claim"
        )
    if not row["task_ok"] and not row["task_revision_found"]:
        return AdmissionRefused(
            f"task {claimed.head.task_id!r} of trigger {name!r} points at revision "
            f"{claimed.task_revision}, which does not exist"
        )
    if not row["task_ok"]:
        return AdmissionRefused(
            f"task {claimed.head.task_id!r} of trigger {name!r} changed or its digest does not verify"
        )
    if not row["execution_ok"]:
        return AdmissionRefused(
            f"execution revision of task {claimed.head.task_id!r} (trigger {name!r}) is missing "
            "or its digest does not verify"
        )
    if not row["decision_ok"]:
        return AdmissionRefused(f"decision for trigger {name!r} is inconsistent with the claim")
    return AdmissionRefused(f"admission of trigger {name!r} wrote nothing")


#: Full-jitter backoff between serialization retries: uniform in [0, min(cap, base * 2**n)] ms.
#: Small, because a retry is cheap and always safe (it re-checks the whole fence) and the
#: conflicting admission usually commits within a millisecond or two.
BACKOFF_BASE_MS = 2.0
BACKOFF_CAP_MS = 50.0


async def commit_decision(conn: psycopg.AsyncConnection, claimed: ClaimedSchedule,
                          decision: Decision | None, *, retries: int = 10,
                          backoff_ms: float = BACKOFF_BASE_MS,
                          keep_claim: bool = False) -> AdmissionResult:
    """Commit ``decision`` for ``claimed`` in one SERIALIZABLE transaction (None releases the claim).

    ``keep_claim`` (fire and initialize only): keep the claim when the new cursor is already due
    at the commit's clock (``AdmissionResult.claim_kept``; see the module docstring).

    ``conn`` must be an autocommit connection outside pipeline mode: otherwise psycopg would send
    a BEGIN of its own ahead of the message, and the transaction would no longer be one message.
    Raises FenceLost, AdmissionRefused, or the database error after ``retries`` serialization
    failures.
    """
    if not conn.autocommit or conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        raise psycopg.ProgrammingError(
            "admission needs an autocommit connection outside pipeline mode (one message per transaction)")
    attempt = 0
    while True:
        params = _params(claimed, decision, keep_claim)
        # Run identity is allocated here, for this transaction only: a claim never has one.
        params["run_id"] = str(uuid.uuid4())
        params["attempt_id"] = str(uuid.uuid4())
        try:
            row = await _send_admission(conn, params)
        except RETRYABLE:
            if attempt >= retries:
                raise
            attempt += 1
            # full jitter, exponential, capped: racing admitters spread out instead of colliding again
            await asyncio.sleep(random.uniform(0, min(BACKOFF_CAP_MS, backoff_ms * 2 ** attempt)) / 1000)
            continue
        if row["advanced_rows"] != 1:
            raise _refusal(claimed, row)
        admission = None
        if params["scheduled_for_ms"] is not None:
            admission = Admission(
                run_id=params["run_id"], attempt_id=params["attempt_id"],
                idempotency_key=params["idempotency_key"], project_id=claimed.head.project_id,
                trigger_id=claimed.head.trigger_id, trigger_revision=claimed.head.trigger_revision,
                scheduled_for_ms=params["scheduled_for_ms"], admitted_at_ms=row["now_ms"],
            )
        return AdmissionResult(params["kind"], admission, attempt, row["now_ms"],
                               bool(row["claim_kept"]))
