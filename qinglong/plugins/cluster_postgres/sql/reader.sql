-- name: list_projects
-- Every project, by identifier.
SELECT project_id, name, active FROM qinglong.projects ORDER BY project_id

-- name: list_triggers
-- Current trigger heads, optionally of one project (NULL = all).
SELECT project_id, trigger_id, task_id, trigger_revision, kind, spec_json, misfire_policy,
       misfire_grace_ms, enabled, content_digest
FROM qinglong.triggers
WHERE %(project_id)s::text IS NULL OR project_id = %(project_id)s::text
ORDER BY project_id, trigger_id

-- name: list_schedules
-- Every trigger's schedule, in the claim's due order.
SELECT t.project_id, t.trigger_id, s.trigger_revision, t.kind, t.spec_json, t.enabled,
       t.misfire_policy, s.next_fire_at_ms, s.last_scheduled_at_ms
FROM qinglong.trigger_schedules s
JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
ORDER BY s.next_fire_at_ms NULLS FIRST, s.project_id, s.trigger_id

-- name: recent_runs
-- The newest Runs first, optionally of one trigger.
SELECT run_id::text, project_id, trigger_id, trigger_revision, scheduled_for_ms, admitted_at_ms,
       state, idempotency_key
FROM qinglong.runs
WHERE %(trigger_id)s::text IS NULL OR trigger_id = %(trigger_id)s::text
ORDER BY admitted_at_ms DESC, run_id
LIMIT %(limit)s

-- name: recent_skips
-- The newest recorded misfires first.
SELECT project_id, trigger_id, trigger_revision, policy, first_skipped_ms, last_skipped_ms,
       skipped_count, count_exact, recorded_at_ms
FROM qinglong.schedule_skips
ORDER BY recorded_at_ms DESC, skip_id
LIMIT %(limit)s

-- name: database_now_ms
-- The database clock, as integer epoch milliseconds.
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
