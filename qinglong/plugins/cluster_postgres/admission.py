"""Admission: commit one decision for one claimed schedule, atomically, under the full fence.

One SERIALIZABLE transaction per occurrence, holding one statement (``sql/admission.sql``,
``admit_occurrence``) sent with BEGIN and COMMIT in one pipeline: one round trip. The statement
re-checks everything by primary key and writes the Run, Attempt, the two events, the skip record
and the cursor advance together, or nothing.

Outcomes: the decision committed (a Run admitted, the cursor initialised or skipped forward, or a
claim released), or :class:`~qinglong.contracts.errors.FenceLost` (someone else owns the schedule
now: a takeover after expiry, a republish, a deleted trigger, a deactivated project; never
retried), or :class:`AdmissionRefused` (the inputs do not verify, e.g. a corrupted execution
revision digest; nothing written). Serialization failures are retried a bounded number of times
with jittered backoff; each retry re-checks the fence, so a retry can only end in FenceLost, never
in a second Run.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass

import psycopg
from psycopg import errors as pg_errors

from qinglong.contracts.errors import FenceLost
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.records import Admission, Decision, DecisionKind

from .claim import ClaimedSchedule
from .db import AdmissionRefused
from .sql import query

#: SQLSTATEs worth retrying: the transaction lost a serialization race, nothing was written.
RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)

#: ``kind`` value of a commit that only releases the claim (a decision that changes nothing).
RELEASE = "release"


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    """What one commit did. ``admission`` is set when a Run was created."""

    kind: str
    admission: Admission | None
    serialization_retries: int
    admitted_at_ms: int


class CasMiss(FenceLost):
    """The fence was intact but the schedule changed under it (revision, state or cursor)."""


def _params(claimed: ClaimedSchedule, decision: Decision | None) -> dict:
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
    }


def _refusal(claimed: ClaimedSchedule, row) -> Exception:
    (project_ok, trigger_ok, task_ok, execution_ok, schedule_ok, fence_ok, decision_ok, found,
     _now, _advanced, _runs, _complete) = row
    name = claimed.head.trigger_id
    if not found:
        return FenceLost(f"schedule of trigger {name!r} no longer exists")
    if not fence_ok:
        return FenceLost(f"claim on trigger {name!r} was lost (expired, taken over or reset)")
    if not trigger_ok:
        return FenceLost(f"trigger {name!r} changed revision or was disabled since it was claimed")
    if not project_ok:
        return FenceLost(f"project of trigger {name!r} is no longer active")
    if not schedule_ok:
        return CasMiss(f"schedule of trigger {name!r} changed since it was claimed")
    if not task_ok:
        return AdmissionRefused(
            f"task {claimed.head.task_id!r} of trigger {name!r} changed or its digest does not verify"
        )
    if not execution_ok:
        return AdmissionRefused(
            f"execution revision of task {claimed.head.task_id!r} (trigger {name!r}) is missing "
            "or its digest does not verify"
        )
    if not decision_ok:
        return AdmissionRefused(f"decision for trigger {name!r} is inconsistent with the claim")
    return AdmissionRefused(f"admission of trigger {name!r} wrote nothing")


async def commit_decision(conn: psycopg.AsyncConnection, claimed: ClaimedSchedule,
                          decision: Decision | None, *, retries: int = 5,
                          backoff_ms: float = 5.0) -> AdmissionResult:
    """Commit ``decision`` for ``claimed`` in one SERIALIZABLE transaction (None releases the claim).

    ``conn`` is an autocommit connection whose isolation level is SERIALIZABLE (the pool's
    ``configure`` sets it). Raises FenceLost, AdmissionRefused, or the database error after
    ``retries`` serialization failures.
    """
    attempt = 0
    while True:
        params = _params(claimed, decision)
        # Run identity is allocated here, for this transaction only: a claim never has one.
        params["run_id"] = str(uuid.uuid4())
        params["attempt_id"] = str(uuid.uuid4())
        try:
            async with conn.pipeline():
                async with conn.transaction():
                    cur = await conn.execute(query("admit_occurrence"), params)
            row = await cur.fetchone()
        except RETRYABLE:
            if attempt >= retries:
                raise
            attempt += 1
            # full jitter, exponential, capped: racing admitters spread out instead of colliding again
            await asyncio.sleep(random.uniform(0, min(200.0, backoff_ms * 2 ** attempt)) / 1000)
            continue
        advanced = row[9]
        if advanced != 1:
            raise _refusal(claimed, row)
        admission = None
        if params["scheduled_for_ms"] is not None:
            admission = Admission(
                run_id=params["run_id"], attempt_id=params["attempt_id"],
                idempotency_key=params["idempotency_key"], project_id=claimed.head.project_id,
                trigger_id=claimed.head.trigger_id, trigger_revision=claimed.head.trigger_revision,
                scheduled_for_ms=params["scheduled_for_ms"], admitted_at_ms=row[8],
            )
        return AdmissionResult(params["kind"], admission, attempt, row[8])
