-- name: project_by_id
-- A project's row, to check it exists before writing anything that belongs to it (a deleted
-- project's row has its deletion time).
SELECT project_id, name, active, deleted_at_ms FROM projects WHERE project_id = ?;

-- name: insert_project
-- A new active project; the primary key refuses a duplicate.
INSERT INTO projects (project_id, name, active, created_at_ms) VALUES (?, ?, 1, ?);

-- name: task_head
-- A task's head revision (a deleted task's head has its deletion time).
SELECT project_id, task_id, task_revision, payload_json, content_digest, deleted_at_ms
  FROM tasks WHERE project_id = ? AND task_id = ?;

-- name: upsert_task_head
-- Point the task at its newest revision.
INSERT INTO tasks (project_id, task_id, task_revision, payload_json, content_digest, updated_at_ms)
VALUES (:project_id, :task_id, :revision, :payload, :digest, :now)
ON CONFLICT (project_id, task_id) DO UPDATE
   SET task_revision = excluded.task_revision,
       payload_json = excluded.payload_json,
       content_digest = excluded.content_digest,
       updated_at_ms = excluded.updated_at_ms,
       deleted_at_ms = NULL;

-- name: insert_task_revision
-- Keep every published task revision.
INSERT INTO task_revisions (project_id, task_id, task_revision, payload_json, content_digest,
                            created_at_ms)
VALUES (:project_id, :task_id, :revision, :payload, :digest, :now);

-- name: trigger_by_id
-- A trigger's head row (trigger ids are global).
SELECT project_id, trigger_id, task_id, trigger_revision, kind, spec_json, misfire_policy,
       misfire_grace_ms, enabled, content_digest, jitter_ms
  FROM triggers WHERE trigger_id = ?;

-- name: upsert_trigger_head
-- Write a trigger's new head revision.
INSERT INTO triggers (trigger_id, project_id, task_id, trigger_revision, kind, spec_json,
                      misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms,
                      jitter_ms)
VALUES (:trigger_id, :project_id, :task_id, :revision, :kind, :spec, :policy, :grace, :enabled,
        :digest, :now, :jitter)
ON CONFLICT (trigger_id) DO UPDATE
   SET task_id = excluded.task_id,
       trigger_revision = excluded.trigger_revision,
       kind = excluded.kind,
       spec_json = excluded.spec_json,
       misfire_policy = excluded.misfire_policy,
       misfire_grace_ms = excluded.misfire_grace_ms,
       jitter_ms = excluded.jitter_ms,
       enabled = excluded.enabled,
       content_digest = excluded.content_digest,
       updated_at_ms = excluded.updated_at_ms;

-- name: reset_schedule_for_revision
-- A new revision's cursor awaits initialization; state_version moves so every older decision misses.
-- published_at_ms is this revision's publish time: initialization counts its first occurrence
-- from there, so an occurrence between the publish and the first round is still owed.
INSERT INTO trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms,
                               last_scheduled_at_ms, state_version, updated_at_ms, published_at_ms)
VALUES (:trigger_id, :project_id, :revision, NULL, NULL, 1, :now, :now)
ON CONFLICT (trigger_id) DO UPDATE
   SET trigger_revision = excluded.trigger_revision,
       next_fire_at_ms = NULL,
       last_scheduled_at_ms = NULL,
       state_version = trigger_schedules.state_version + 1,
       updated_at_ms = excluded.updated_at_ms,
       published_at_ms = excluded.published_at_ms;

-- name: trigger_revision_mark
-- The highest revision ever published under a trigger id (it outlives a deleted head).
SELECT high_revision FROM trigger_revision_marks WHERE trigger_id = ?;

-- name: raise_trigger_revision_mark
-- Record a published revision as the trigger id's high-water mark; it never moves down.
INSERT INTO trigger_revision_marks (trigger_id, high_revision) VALUES (:trigger_id, :revision)
ON CONFLICT (trigger_id) DO UPDATE
   SET high_revision = max(high_revision, excluded.high_revision);

-- name: delete_schedule
-- Remove a trigger's cursor.
DELETE FROM trigger_schedules WHERE trigger_id = ?;

-- name: delete_trigger_head
-- Remove a trigger head; its Runs stay.
DELETE FROM triggers WHERE trigger_id = ?;

-- name: revive_project
-- A deleted project published again: active, under its new name, with nothing in it.
UPDATE projects SET name = :name, active = 1, deleted_at_ms = NULL
 WHERE project_id = :project_id AND deleted_at_ms IS NOT NULL;

-- name: rename_project
-- A project's display name.
UPDATE projects SET name = :name WHERE project_id = :project_id AND deleted_at_ms IS NULL;

-- name: delete_project_row
-- Mark a project deleted (and inactive); its row stays for the Runs that name it.
UPDATE projects SET active = 0, deleted_at_ms = :now
 WHERE project_id = :project_id AND deleted_at_ms IS NULL;

-- name: project_task_heads
-- A project's task heads that are not deleted, by id.
SELECT project_id, task_id, task_revision, payload_json, content_digest
  FROM tasks WHERE project_id = ? AND deleted_at_ms IS NULL ORDER BY task_id;

-- name: triggers_of_task
-- The triggers that run a task, by id.
SELECT trigger_id FROM triggers WHERE project_id = ? AND task_id = ? ORDER BY trigger_id;

-- name: delete_task_head
-- Mark a task deleted; its head and every revision stay for the Runs that pinned them.
UPDATE tasks SET deleted_at_ms = :now
 WHERE project_id = :project_id AND task_id = :task_id AND deleted_at_ms IS NULL;

-- name: secrets_task_payloads
-- Every stored task payload that has an env table (heads and revisions): what the secrets check
-- reads and a rotation seals again.
SELECT 'head' AS kind, project_id, task_id, task_revision, payload_json FROM tasks
 WHERE json_valid(payload_json) AND json_type(payload_json, '$.env') = 'object'
UNION ALL
SELECT 'revision' AS kind, project_id, task_id, task_revision, payload_json FROM task_revisions
 WHERE json_valid(payload_json) AND json_type(payload_json, '$.env') = 'object';

-- name: secrets_update_head
-- A task head's payload with its env values sealed again (the digest is of the values in clear).
UPDATE tasks SET payload_json = :payload
 WHERE project_id = :project_id AND task_id = :task_id AND task_revision = :task_revision;

-- name: secrets_update_revision
-- A task revision's payload with its env values sealed again.
UPDATE task_revisions SET payload_json = :payload
 WHERE project_id = :project_id AND task_id = :task_id AND task_revision = :task_revision;

-- name: secrets_trigger_specs
-- Every trigger head's spec: a hook trigger's secret is sealed like an env value.
SELECT project_id, trigger_id, spec_json FROM triggers WHERE json_valid(spec_json);

-- name: secrets_update_trigger
-- A trigger head's spec with its secret sealed again (the digest is of the spec in clear).
UPDATE triggers SET spec_json = :spec WHERE trigger_id = :trigger_id;
