-- name: list_projects
-- Projects by identifier, at most %(limit)s of them.
SELECT project_id, name, active FROM qinglong.projects WHERE deleted_at_ms IS NULL ORDER BY project_id
LIMIT %(limit)s::bigint

-- name: list_triggers
-- Current trigger heads, optionally of one project and of one kind (NULL = all), at most
-- %(limit)s (NULL = all).
SELECT project_id, trigger_id, task_id, trigger_revision, kind, spec_json, misfire_policy,
       misfire_grace_ms, enabled, content_digest, jitter_ms
FROM qinglong.triggers
WHERE (%(project_id)s::text IS NULL OR project_id = %(project_id)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY project_id, trigger_id
LIMIT %(limit)s::bigint

-- name: list_schedules
-- Every trigger's schedule with its revision's publish time, in the claim's due order
-- (next_fire_at_ms NULLS FIRST, project_id, trigger_id), at most %(limit)s rows, starting after
-- the keyset cursor (%(after_next)s, %(after_project)s, %(after_trigger)s) when
-- %(after_trigger)s is not NULL (a NULL %(after_next)s: the cursor is in the rows awaiting
-- initialization). The two ranges of the due index (IS NULL, then NOT NULL) are read apart, each
-- from the cursor on through an index condition and in index order, so a page costs its own
-- rows whatever the number of schedules, and nothing is sorted.
(SELECT t.project_id, t.trigger_id, s.trigger_revision, t.kind, t.spec_json, t.enabled,
        t.misfire_policy, s.next_fire_at_ms, s.last_scheduled_at_ms, s.published_at_ms, t.jitter_ms
 FROM qinglong.trigger_schedules s
 JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
 WHERE s.next_fire_at_ms IS NULL
   AND %(after_next)s::bigint IS NULL
   AND (%(after_trigger)s::text IS NULL
        OR (s.project_id, s.trigger_id) > (%(after_project)s::text, %(after_trigger)s::text))
 ORDER BY s.next_fire_at_ms NULLS FIRST, s.project_id, s.trigger_id
 LIMIT %(limit)s::bigint)
UNION ALL
(SELECT t.project_id, t.trigger_id, s.trigger_revision, t.kind, t.spec_json, t.enabled,
        t.misfire_policy, s.next_fire_at_ms, s.last_scheduled_at_ms, s.published_at_ms, t.jitter_ms
 FROM qinglong.trigger_schedules s
 JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
 WHERE s.next_fire_at_ms IS NOT NULL
   AND (%(after_next)s::bigint IS NULL
        OR (s.next_fire_at_ms, s.project_id, s.trigger_id)
           > (%(after_next)s::bigint, %(after_project)s::text, %(after_trigger)s::text))
 ORDER BY s.next_fire_at_ms NULLS FIRST, s.project_id, s.trigger_id
 LIMIT %(limit)s::bigint)
LIMIT %(limit)s::bigint

-- name: scheduler_status
-- How many replicas completed a round within the last %(window_ms)s ms (database clock), and
-- when the newest round of any replica completed.
SELECT count(*) FILTER (WHERE r.last_round_at_ms
                              >= floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
                                 - %(window_ms)s::bigint) AS live,
       max(r.last_round_at_ms) AS last_round_at_ms
FROM qinglong.scheduler_replicas r

-- name: record_replica_round
-- Records that replica %(owner)s completed a round now (database clock), and prunes the rows of
-- replicas silent for a week (a replica's owner name is new at every start).
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
),
pruned AS (
    DELETE FROM qinglong.scheduler_replicas r
    USING clock
    WHERE r.last_round_at_ms < clock.now_ms - 604800000 AND r.owner <> %(owner)s
)
INSERT INTO qinglong.scheduler_replicas AS r (owner, first_round_at_ms, last_round_at_ms, rounds)
SELECT %(owner)s, clock.now_ms, clock.now_ms, 1 FROM clock
ON CONFLICT (owner) DO UPDATE
SET last_round_at_ms = greatest(r.last_round_at_ms, excluded.last_round_at_ms),
    rounds = r.rounds + 1

-- name: recent_runs
-- The newest Runs first, optionally of one trigger.
SELECT run_id::text, project_id, trigger_id, trigger_revision, scheduled_for_ms, admitted_at_ms,
       state, idempotency_key, jitter_ms
FROM qinglong.runs
WHERE %(trigger_id)s::text IS NULL OR trigger_id = %(trigger_id)s::text
ORDER BY admitted_at_ms DESC, run_id
LIMIT %(limit)s

-- name: recent_skips
-- The newest recorded misfires first.
SELECT project_id, trigger_id, trigger_revision, policy, first_skipped_ms, last_skipped_ms,
       skipped_count AS count, count_exact, recorded_at_ms
FROM qinglong.schedule_skips
ORDER BY recorded_at_ms DESC, skip_id
LIMIT %(limit)s
