-- name: list_projects
-- Every project by id (deleted ones are not listed).
SELECT project_id, name, active FROM projects WHERE deleted_at_ms IS NULL ORDER BY project_id;

-- name: list_triggers
-- Trigger heads by project and id.
SELECT project_id, trigger_id, task_id, trigger_revision, kind, spec_json, misfire_policy,
       misfire_grace_ms, enabled, content_digest, jitter_ms
  FROM triggers ORDER BY project_id, trigger_id;

-- name: list_triggers_of_project
-- One project's trigger heads by id.
SELECT project_id, trigger_id, task_id, trigger_revision, kind, spec_json, misfire_policy,
       misfire_grace_ms, enabled, content_digest, jitter_ms
  FROM triggers WHERE project_id = ? ORDER BY trigger_id;

-- name: list_triggers_of_kind
-- Trigger heads of one kind (?1), optionally of one project (?2, NULL = all), by project and id.
SELECT project_id, trigger_id, task_id, trigger_revision, kind, spec_json, misfire_policy,
       misfire_grace_ms, enabled, content_digest, jitter_ms
  FROM triggers WHERE kind = ?1 AND (?2 IS NULL OR project_id = ?2) ORDER BY project_id, trigger_id;

-- name: list_schedules_uninitialized
-- Schedules awaiting initialization (NULL cursor: first in the due order), by project and trigger,
-- after the keyset (:after_project, :after_trigger), at most :limit. A range of the due index read
-- in index order from the cursor on: a page costs its own rows, nothing is sorted.
SELECT s.project_id, s.trigger_id, s.trigger_revision, t.kind, t.spec_json, t.enabled,
       t.misfire_policy, s.next_fire_at_ms, s.last_scheduled_at_ms, s.published_at_ms, t.jitter_ms
  FROM trigger_schedules AS s INDEXED BY trigger_schedules_due
 CROSS JOIN triggers AS t ON t.trigger_id = s.trigger_id
 WHERE s.next_fire_at_ms IS NULL
   AND (s.project_id, s.trigger_id) > (:after_project, :after_trigger)
 ORDER BY s.next_fire_at_ms, s.project_id, s.trigger_id
 LIMIT :limit;

-- name: list_schedules_initialized
-- Schedules with a cursor, oldest first, then by project and trigger, after the keyset
-- (:after_next, :after_project, :after_trigger), at most :limit; the second range of the due index.
SELECT s.project_id, s.trigger_id, s.trigger_revision, t.kind, t.spec_json, t.enabled,
       t.misfire_policy, s.next_fire_at_ms, s.last_scheduled_at_ms, s.published_at_ms, t.jitter_ms
  FROM trigger_schedules AS s INDEXED BY trigger_schedules_due
 CROSS JOIN triggers AS t ON t.trigger_id = s.trigger_id
 WHERE s.next_fire_at_ms IS NOT NULL
   AND (s.next_fire_at_ms, s.project_id, s.trigger_id) > (:after_next, :after_project, :after_trigger)
 ORDER BY s.next_fire_at_ms, s.project_id, s.trigger_id
 LIMIT :limit;

-- name: recent_runs
-- The newest Runs first (rowid follows insertion order).
SELECT run_id, project_id, trigger_id, trigger_revision, scheduled_for_ms, admitted_at_ms, state,
       idempotency_key, jitter_ms
  FROM runs ORDER BY rowid DESC LIMIT ?;

-- name: recent_runs_of_trigger
-- One trigger's newest occurrences first.
SELECT run_id, project_id, trigger_id, trigger_revision, scheduled_for_ms, admitted_at_ms, state,
       idempotency_key, jitter_ms
  FROM runs WHERE trigger_id = ? ORDER BY scheduled_for_ms DESC LIMIT ?;

-- name: recent_skips
-- The newest recorded misfires first.
SELECT project_id, trigger_id, trigger_revision, policy, first_skipped_ms, last_skipped_ms, count,
       count_exact, recorded_at_ms
  FROM schedule_skips ORDER BY id DESC LIMIT ?;
