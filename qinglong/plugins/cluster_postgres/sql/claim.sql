-- fragment: claimable_schedules
-- Schedules with no live claim, of enabled triggers at their schedule's revision in active
-- projects, of a kind this replica decides; each range below adds its own cursor condition.
FROM qinglong.trigger_schedules s
JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
JOIN qinglong.projects p ON p.project_id = t.project_id
WHERE (s.claim_expires_at_ms IS NULL OR s.claim_expires_at_ms < (SELECT now_ms FROM clock))
  AND p.active
  AND t.enabled
  AND t.trigger_revision = s.trigger_revision
  AND (%(kinds)s::text[] IS NULL OR t.kind = ANY (%(kinds)s::text[]))

-- fragment: claim_order
-- The claim's due order, within the budget, skipping rows other replicas hold.
ORDER BY s.next_fire_at_ms NULLS FIRST, s.project_id, s.trigger_id
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED

-- name: claim_due_schedules
-- Claims up to %(limit)s due or uninitialized schedules of enabled triggers in active projects
-- with no live claim, of the kinds %(kinds)s (NULL = any), in due order, SKIP LOCKED: owner, a
-- fresh token, claim_version + 1, expiry now + lease, state_version + 1, updated_at_ms = now (the
-- acquisition). Autocommit READ COMMITTED; `now` is clock_timestamp() read once, for every row.
-- Cost: `now` is an init plan and the NULLS FIRST order two ranges of trigger_schedules_due, so
-- the due tests are index conditions and a claim reads only the due rows, whatever the count.
-- The UPDATE re-checks the head's revision on the locked row's latest version: a republish after
-- the snapshot leaves the row to the next round, never a claim of one revision with another head.
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
),
awaiting AS (
    SELECT s.trigger_id
    {{claimable_schedules}}
      AND s.next_fire_at_ms IS NULL
    {{claim_order}}
),
due AS (
    SELECT s.trigger_id
    {{claimable_schedules}}
      AND s.next_fire_at_ms <= (SELECT now_ms FROM clock)
    {{claim_order}}
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
  -- re-checked on the locked row's latest version
  AND t.trigger_revision = s.trigger_revision
  AND t.enabled
RETURNING s.trigger_id, s.project_id, t.task_id, s.trigger_revision, s.next_fire_at_ms,
          s.last_scheduled_at_ms, s.state_version, s.claim_owner, s.claim_token::text,
          s.claim_version, s.claim_expires_at_ms, t.trigger_revision AS head_revision, t.kind,
          t.spec_json, t.misfire_policy, t.misfire_grace_ms, t.enabled, t.content_digest, t.jitter_ms,
          k.task_revision, k.content_digest AS task_digest, clock.now_ms AS observed_at_ms,
          s.published_at_ms, s.ctid::text AS row_tid

-- name: release_claim
-- Gives a claim back under the whole fence and the claimed state when nothing was written
-- (retries exhausted, task republished, decision failed): clears owner, token and expiry and
-- bumps state_version, so the occurrence is claimed next round rather than after the lease.
-- Autocommit: a claim taken over, republished or committed meanwhile is left alone. One row when
-- it released.
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

-- name: release_owner_claims
-- An orderly stop gives back every claim this replica still holds: its owner (distinct per start)
-- is part of each claim's fence, and no round of this replica runs any more. Clears owner, token
-- and expiry and bumps state_version, as release_claim does, so another replica claims the rows
-- at its next round instead of a lease later. A commit of this replica still in flight on the
-- server (a round cut at its bound) either lands first and is kept, or finds its fence gone and
-- writes nothing. One row per claim given back.
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
WHERE s.claim_owner = %(owner)s
  AND s.claim_expires_at_ms > clock.now_ms
RETURNING s.trigger_id
