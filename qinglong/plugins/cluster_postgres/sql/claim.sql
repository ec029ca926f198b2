-- name: claim_due_schedules
-- Claims up to %(limit)s schedules of enabled triggers in active projects that are due or awaiting
-- initialisation and hold no live claim, in due order, skipping rows other replicas hold locked
-- and triggers of a kind this replica cannot decide (%(kinds)s; NULL = any kind). Writes owner, a
-- fresh token, claim_version + 1, expiry = now + lease, state_version + 1 and updated_at_ms = now
-- (the claim's acquisition time), and returns each row with what the decision needs and the
-- observation. Run alone in autocommit (READ COMMITTED): the row locks last one statement. `now`
-- is clock_timestamp() read once (MATERIALIZED): the time this statement ran, not the start of
-- some earlier transaction, and the same value for every row.
-- Cost: the due test is an index condition, so the scan reads only the due part of
-- trigger_schedules_due and stops where the future begins, whatever the number of schedules. The
-- scans read `now` through an uncorrelated scalar subquery of the clock (an init plan, computed
-- once: a value, not a join), which the planner can compare with the index; joined as a row, the
-- due and lease tests would be a join filter above a walk of the whole index. The NULLS FIRST
-- order is read as two ranges of the same index, the rows awaiting initialisation (IS NULL) and
-- then the due ones (<= now), each its own index condition; their concatenation is the index
-- order, and the outer LIMIT pulls the due range only as far as the budget left by the first
-- (a CTE is read on demand, so its locks are taken only for rows actually claimed).
-- Consistency with the trigger head: the schedule row is locked, so a republish that committed
-- after this statement's snapshot is seen on it (its latest version) while the joined trigger
-- head still comes from the snapshot. Both the lock and the update re-check that the two carry
-- the same revision, so such a row is simply not claimed (the next round claims it whole), and a
-- claim is never handed out with a schedule of one revision and a head of another.
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
),
awaiting AS (
    SELECT s.trigger_id
    FROM qinglong.trigger_schedules s
    JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
    JOIN qinglong.projects p ON p.project_id = t.project_id
    WHERE s.next_fire_at_ms IS NULL
      AND (s.claim_expires_at_ms IS NULL OR s.claim_expires_at_ms < (SELECT now_ms FROM clock))
      AND p.active
      AND t.enabled
      AND t.trigger_revision = s.trigger_revision
      AND (%(kinds)s::text[] IS NULL OR t.kind = ANY (%(kinds)s::text[]))
    ORDER BY s.next_fire_at_ms NULLS FIRST, s.project_id, s.trigger_id
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
),
due AS (
    SELECT s.trigger_id
    FROM qinglong.trigger_schedules s
    JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
    JOIN qinglong.projects p ON p.project_id = t.project_id
    WHERE s.next_fire_at_ms <= (SELECT now_ms FROM clock)
      AND (s.claim_expires_at_ms IS NULL OR s.claim_expires_at_ms < (SELECT now_ms FROM clock))
      AND p.active
      AND t.enabled
      AND t.trigger_revision = s.trigger_revision
      AND (%(kinds)s::text[] IS NULL OR t.kind = ANY (%(kinds)s::text[]))
    ORDER BY s.next_fire_at_ms NULLS FIRST, s.project_id, s.trigger_id
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
),
picked AS (
    SELECT trigger_id FROM awaiting UNION ALL SELECT trigger_id FROM due
    LIMIT %(limit)s
)
UPDATE qinglong.trigger_schedules s
SET claim_owner = %(owner)s,
    claim_token = gen_random_uuid(),
    claim_version = s.claim_version + 1,
    claim_expires_at_ms = clock.now_ms + %(lease_ms)s,
    state_version = s.state_version + 1,
    updated_at_ms = clock.now_ms
FROM picked, clock, qinglong.triggers t, qinglong.tasks k
WHERE s.trigger_id = picked.trigger_id
  AND t.trigger_id = s.trigger_id
  AND k.project_id = t.project_id AND k.task_id = t.task_id
  -- re-checked on the locked row's latest version (see above)
  AND t.trigger_revision = s.trigger_revision
  AND t.enabled
RETURNING s.trigger_id, s.project_id, t.task_id, s.trigger_revision, s.next_fire_at_ms,
          s.last_scheduled_at_ms, s.state_version, s.claim_owner, s.claim_token::text,
          s.claim_version, s.claim_expires_at_ms, t.trigger_revision AS head_revision, t.kind,
          t.spec_json, t.misfire_policy, t.misfire_grace_ms, t.enabled, t.content_digest,
          k.task_revision, k.content_digest AS task_digest, clock.now_ms AS observed_at_ms,
          s.published_at_ms, s.ctid::text AS row_tid

-- name: release_claim
-- Gives a claim back, under the whole fence (owner, token, claim_version, expiry > now) and the
-- claimed schedule state, when it cannot be decided or committed now and nothing was written
-- (serialization retries exhausted, the task republished since the claim, a decision that
-- failed): clears owner, token and expiry and bumps state_version, so the occurrence is
-- claimed again next round instead of waiting for the lease. Run alone in autocommit (READ
-- COMMITTED): the WHERE is re-checked on the row's latest version, so a claim taken over,
-- republished or already committed is left alone. Returns one row when it released.
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE qinglong.trigger_schedules s
SET claim_owner = NULL,
    claim_token = NULL,
    claim_expires_at_ms = NULL,
    state_version = s.state_version + 1,
    updated_at_ms = clock.now_ms
FROM clock
WHERE s.trigger_id = %(trigger_id)s
  AND s.trigger_revision = %(trigger_revision)s
  AND s.state_version = %(state_version)s
  AND s.claim_owner = %(owner)s
  AND s.claim_token = %(token)s::uuid
  AND s.claim_version = %(claim_version)s
  AND s.claim_expires_at_ms > clock.now_ms
RETURNING s.trigger_id
