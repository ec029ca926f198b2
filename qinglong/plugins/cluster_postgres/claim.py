"""The claim: one READ COMMITTED statement that leases due schedules to this replica.

See ``sql/claim.sql`` (``claim_due_schedules``). There is no leader and no advisory lock: every
replica runs the same statement, ``FOR UPDATE ... SKIP LOCKED`` keeps two replicas off the same
row, and the written fence (owner, fresh token, claim_version + 1, expiry from the database clock)
keeps anyone else off it until the lease expires in database time. No cron maths and no
identifier generation happen here; the statement commits on its own.

A claim is consistent: its schedule row and its trigger head carry the same revision (a republish
racing the statement leaves the row unclaimed until the next round, see ``sql/claim.sql``).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from psycopg.rows import dict_row

from qinglong.contracts.frozen import record
from qinglong.contracts.records import ClaimFence, MisfirePolicy, ScheduleCursor, TriggerHead

from .sql import query

#: The hard cap of one claim, whatever the settings say.
CLAIM_BUDGET_HARD_CAP = 256


@record
class ClaimedSchedule:
    """One schedule this replica now holds, with everything the decision and admission need.

    ``observed_at_ms`` is the claim statement's database clock, also written as the row's
    ``updated_at_ms`` (the claim's acquisition time); the decision is made at this time.
    ``row_tid`` is where the claim left the schedule row (its ``ctid``): the admission looks there
    first, without reading an index (see ``sql/admission.sql``), and by key if the row moved.
    """

    head: TriggerHead
    cursor: ScheduleCursor
    fence: ClaimFence
    task_revision: int
    task_digest: str
    observed_at_ms: int
    row_tid: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "ClaimedSchedule":
        """A claim from one ``claim_due_schedules`` row, read by column name."""
        head = TriggerHead(
            project_id=row["project_id"], trigger_id=row["trigger_id"], task_id=row["task_id"],
            trigger_revision=row["head_revision"], kind=row["kind"], spec=row["spec_json"],
            misfire_policy=MisfirePolicy(row["misfire_policy"]),
            misfire_grace_ms=row["misfire_grace_ms"], enabled=row["enabled"],
            content_digest=row["content_digest"], jitter_ms=row["jitter_ms"],
        )
        cursor = ScheduleCursor(
            trigger_revision=row["trigger_revision"], next_fire_at_ms=row["next_fire_at_ms"],
            last_scheduled_at_ms=row["last_scheduled_at_ms"], state_version=row["state_version"],
            published_at_ms=row["published_at_ms"])
        fence = ClaimFence(owner=row["claim_owner"], token=row["claim_token"],
                           claim_version=row["claim_version"],
                           expires_at_ms=row["claim_expires_at_ms"])
        return cls(head, cursor, fence, row["task_revision"], row["task_digest"],
                   row["observed_at_ms"], row.get("row_tid"))


def effective_budget(requested: int) -> int:
    """The number of rows one claim may take: ``requested`` bounded to [0, 256]."""
    return max(0, min(int(requested), CLAIM_BUDGET_HARD_CAP))


def next_budget(configured: int, used: int, claimed: int, more_due: bool) -> int:
    """The budget of the next round's claim, after a round that claimed ``claimed`` rows with a
    budget of ``used`` and reported ``more_due``.

    A claim that came back full from a round that made progress means a burst or a backlog: the
    next claim takes twice as many rows, up to :data:`CLAIM_BUDGET_HARD_CAP`, so a burst is
    drained in fewer, larger pages (fewer round trips and transactions: a 5,000-row minute in
    about 30 claims per replica instead of about 300). Any other round (a claim that was not
    full: the burst is drained, or shared with other replicas; or no progress) goes back to the
    ``configured`` budget, so an idle or steady replica claims as it is configured and
    the replicas of a cluster start every burst with small claims that spread its rows among
    them."""
    configured = effective_budget(configured)
    if used > 0 and claimed >= used and more_due:
        return max(configured, min(2 * used, CLAIM_BUDGET_HARD_CAP))
    return configured


async def claim_due_schedules(conn, *, owner: str, limit: int, lease_ms: int,
                              kinds: Iterable[str] | None = None) -> list[ClaimedSchedule]:
    """Claim up to ``limit`` (at most 256) due schedules for ``owner`` with a ``lease_ms`` lease.

    ``kinds``: the trigger kinds this replica can decide (its loaded providers); triggers of other
    kinds are left for a replica that can (None: every kind).

    ``conn`` must be in autocommit mode, so the statement is its own READ COMMITTED transaction
    and its row locks are released when it returns. Returns the claims in due order.
    """
    budget = effective_budget(limit)
    if budget == 0:
        return []
    if lease_ms <= 0:
        raise ValueError("lease_ms must be positive")
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            query("claim_due_schedules"),
            {"owner": owner, "limit": budget, "lease_ms": int(lease_ms),
             "kinds": None if kinds is None else sorted(kinds)},
        )
        claims = [ClaimedSchedule.from_row(row) for row in await cur.fetchall()]
    # RETURNING does not keep the CTE's order; restore the due order for the caller.
    claims.sort(key=lambda c: (c.cursor.next_fire_at_ms is not None, c.cursor.next_fire_at_ms or 0,
                               c.head.project_id, c.head.trigger_id))
    return claims


async def release_claim(conn, claimed: ClaimedSchedule) -> bool:
    """Give ``claimed`` back under its whole fence, in its own autocommit statement (see
    ``sql/claim.sql``, ``release_claim``); True when it was still ours and is now released.

    For a claim that could not be decided or committed with nothing written (serialization retries
    exhausted, the task republished since the claim, a decision that failed): the occurrence is
    claimed again next round (here or elsewhere) instead of waiting for the lease to expire.
    """
    fence = claimed.fence
    cur = await conn.execute(query("release_claim"), {
        "trigger_id": claimed.head.trigger_id, "trigger_revision": claimed.cursor.trigger_revision,
        "state_version": claimed.cursor.state_version, "owner": fence.owner, "token": fence.token,
        "claim_version": fence.claim_version,
    })
    return (await cur.fetchone()) is not None
