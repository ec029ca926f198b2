-- name: insert_project
-- Creates an active project, or revives a deleted one (active, renamed, empty); returns nothing
-- when the identifier is taken by a project that is not deleted.
INSERT INTO qinglong.projects AS p (project_id, name, active, created_at_ms, updated_at_ms)
SELECT %(project_id)s, %(name)s, true, c.now_ms, c.now_ms
FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) c
ON CONFLICT (project_id) DO UPDATE
SET name = excluded.name, active = true, deleted_at_ms = NULL, updated_at_ms = excluded.updated_at_ms
WHERE p.deleted_at_ms IS NOT NULL
RETURNING project_id, name, active

-- name: project_exists
-- Whether a project exists (active or not) and is not deleted.
SELECT 1 FROM qinglong.projects WHERE project_id = %(project_id)s AND deleted_at_ms IS NULL

-- name: lock_task_head
-- Reads a task head for update, so two publishers of one task serialise (a deleted task's head
-- has its deletion time).
SELECT task_revision, content_digest, deleted_at_ms FROM qinglong.tasks
WHERE project_id = %(project_id)s AND task_id = %(task_id)s
FOR UPDATE

-- name: upsert_task_head
-- Points a task head at a new revision.
INSERT INTO qinglong.tasks (project_id, task_id, task_revision, content_digest, updated_at_ms)
VALUES (%(project_id)s, %(task_id)s, %(task_revision)s, %(content_digest)s,
        floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (project_id, task_id) DO UPDATE
SET task_revision = excluded.task_revision, content_digest = excluded.content_digest,
    updated_at_ms = excluded.updated_at_ms, deleted_at_ms = NULL

-- name: insert_task_revision
-- Stores a task revision's canonical payload and digest.
INSERT INTO qinglong.task_revisions (project_id, task_id, task_revision, payload_json,
                                     content_digest, created_at_ms)
VALUES (%(project_id)s, %(task_id)s, %(task_revision)s, %(payload_json)s, %(content_digest)s,
        floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)

-- name: insert_execution_revision
-- Pins the remote_worker execution revision of a task revision, with its digest.
INSERT INTO qinglong.execution_revisions (project_id, task_id, task_revision, executor, spec_json,
                                          content_digest, created_at_ms)
VALUES (%(project_id)s, %(task_id)s, %(task_revision)s, 'remote_worker', %(spec_json)s,
        %(content_digest)s, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)

-- name: lock_trigger_head
-- Reads a trigger head for update (trigger ids are unique across projects).
SELECT project_id, task_id, trigger_revision, kind, spec_json, misfire_policy, misfire_grace_ms,
       enabled, content_digest, jitter_ms
FROM qinglong.triggers WHERE trigger_id = %(trigger_id)s
FOR UPDATE

-- name: upsert_trigger_head
-- Writes a trigger head at a new revision.
INSERT INTO qinglong.triggers (trigger_id, project_id, task_id, trigger_revision, kind, spec_json,
                               misfire_policy, misfire_grace_ms, enabled, content_digest,
                               updated_at_ms, jitter_ms)
VALUES (%(trigger_id)s, %(project_id)s, %(task_id)s, %(trigger_revision)s, %(kind)s,
        %(spec_json)s::jsonb, %(misfire_policy)s, %(misfire_grace_ms)s, %(enabled)s,
        %(content_digest)s, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
        %(jitter_ms)s)
ON CONFLICT (trigger_id) DO UPDATE
SET task_id = excluded.task_id, trigger_revision = excluded.trigger_revision,
    kind = excluded.kind, spec_json = excluded.spec_json, misfire_policy = excluded.misfire_policy,
    misfire_grace_ms = excluded.misfire_grace_ms, enabled = excluded.enabled,
    jitter_ms = excluded.jitter_ms,
    content_digest = excluded.content_digest, updated_at_ms = excluded.updated_at_ms

-- name: reset_schedule
-- Creates a trigger's schedule row, or resets it for a new revision: cursor cleared, claim
-- cleared, state_version and claim_version incremented, so every older claim is dead forever.
-- published_at_ms is the database clock of this publish: the first occurrence is counted from it.
INSERT INTO qinglong.trigger_schedules AS s (trigger_id, project_id, trigger_revision,
                                             next_fire_at_ms, last_scheduled_at_ms, state_version,
                                             claim_owner, claim_token, claim_version,
                                             claim_expires_at_ms, updated_at_ms, published_at_ms)
SELECT %(trigger_id)s, %(project_id)s, %(trigger_revision)s, NULL, NULL, 1, NULL, NULL, 0, NULL,
       c.now_ms, c.now_ms
FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) c
ON CONFLICT (trigger_id) DO UPDATE
SET trigger_revision = excluded.trigger_revision,
    published_at_ms = excluded.published_at_ms,
    next_fire_at_ms = NULL,
    last_scheduled_at_ms = NULL,
    state_version = s.state_version + 1,
    claim_owner = NULL,
    claim_token = NULL,
    claim_version = s.claim_version + 1,
    claim_expires_at_ms = NULL,
    updated_at_ms = greatest(s.updated_at_ms, excluded.updated_at_ms)

-- name: next_trigger_revision
-- The revision a new publish of a trigger id takes: one past both its current head and its
-- high-water mark (which survives a delete), so revisions of a trigger id never repeat; records
-- it as the new mark. Run after lock_trigger_head in the same transaction; the mark row's own
-- lock serialises two creators of a deleted id.
INSERT INTO qinglong.trigger_revision_marks AS m (trigger_id, last_revision)
VALUES (%(trigger_id)s, %(head_revision)s::bigint + 1)
ON CONFLICT (trigger_id) DO UPDATE
SET last_revision = greatest(m.last_revision, %(head_revision)s::bigint) + 1
RETURNING last_revision

-- name: delete_schedule
-- Deletes a trigger's schedule row (its Runs stay).
DELETE FROM qinglong.trigger_schedules WHERE trigger_id = %(trigger_id)s

-- name: delete_trigger_head
-- Deletes a trigger head of a project; returns the deleted id.
DELETE FROM qinglong.triggers WHERE trigger_id = %(trigger_id)s AND project_id = %(project_id)s
RETURNING trigger_id

-- name: lock_project
-- Reads a project row for update: an apply or a deletion of one project serialises with every
-- other publisher of it.
SELECT name, deleted_at_ms FROM qinglong.projects WHERE project_id = %(project_id)s
FOR UPDATE

-- name: read_project
-- Reads a project row without a lock (a dry run's read-only transaction).
SELECT name, deleted_at_ms FROM qinglong.projects WHERE project_id = %(project_id)s

-- name: rename_project
-- Changes a project's display name.
UPDATE qinglong.projects
SET name = %(name)s, updated_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE project_id = %(project_id)s AND deleted_at_ms IS NULL

-- name: delete_project_row
-- Marks a project deleted and inactive; its row stays for the Runs that name it.
UPDATE qinglong.projects
SET active = false, deleted_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    updated_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE project_id = %(project_id)s AND deleted_at_ms IS NULL

-- name: project_task_heads
-- A project's task heads that are not deleted, with their payloads, by id.
SELECT k.task_id, k.task_revision, k.content_digest, r.payload_json
FROM qinglong.tasks k
JOIN qinglong.task_revisions r
  ON r.project_id = k.project_id AND r.task_id = k.task_id AND r.task_revision = k.task_revision
WHERE k.project_id = %(project_id)s AND k.deleted_at_ms IS NULL
ORDER BY k.task_id

-- name: project_trigger_heads
-- A project's trigger heads, by id.
SELECT trigger_id, project_id, task_id, trigger_revision, kind, spec_json, misfire_policy,
       misfire_grace_ms, enabled, content_digest, jitter_ms
FROM qinglong.triggers WHERE project_id = %(project_id)s ORDER BY trigger_id

-- name: triggers_of_task
-- The triggers that run a task, by id.
SELECT trigger_id FROM qinglong.triggers
WHERE project_id = %(project_id)s AND task_id = %(task_id)s ORDER BY trigger_id

-- name: delete_task_head
-- Marks a task deleted; its head and every revision stay for the Runs that pinned them.
UPDATE qinglong.tasks
SET deleted_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE project_id = %(project_id)s AND task_id = %(task_id)s AND deleted_at_ms IS NULL

-- name: chain_edges
-- Every 'after' trigger of a project as an edge of the chain graph (upstream -> its own task).
SELECT trigger_id, spec_json ->> 'task' AS upstream, task_id
FROM qinglong.triggers
WHERE project_id = %(project_id)s AND kind = 'after'

-- name: secrets_key_ids
-- The key ids the stored sealed values name (task and execution revisions, trigger secrets):
-- the start check.
SELECT DISTINCT s.m[1] AS key_id
FROM (SELECT regexp_matches(payload_json, '"ql-sealed:v1:([A-Za-z0-9]+):', 'g') AS m
        FROM qinglong.task_revisions
      UNION ALL
      SELECT regexp_matches(spec_json, '"ql-sealed:v1:([A-Za-z0-9]+):', 'g')
        FROM qinglong.execution_revisions
      UNION ALL
      SELECT regexp_matches(spec_json::text, '"ql-sealed:v1:([A-Za-z0-9]+):', 'g')
        FROM qinglong.triggers) s;

-- name: secrets_lock_revisions
-- A rotation holds off publishing (which inserts revisions and writes trigger heads) until it
-- commits.
LOCK TABLE qinglong.task_revisions, qinglong.execution_revisions, qinglong.triggers
  IN SHARE ROW EXCLUSIVE MODE;

-- name: secrets_task_payloads
-- Every task revision whose payload has an env table, and every execution revision whose spec
-- has one: what a rotation seals again.
SELECT 'task' AS kind, project_id, task_id, task_revision, payload_json AS text
  FROM qinglong.task_revisions
 WHERE jsonb_typeof(payload_json::jsonb -> 'env') = 'object'
UNION ALL
SELECT 'execution' AS kind, project_id, task_id, task_revision, spec_json AS text
  FROM qinglong.execution_revisions
 WHERE jsonb_typeof(spec_json::jsonb -> 'execution' -> 'env') = 'object';

-- name: secrets_update_task
-- A task revision's payload with its env values sealed again (its digest is of the values in clear).
UPDATE qinglong.task_revisions SET payload_json = %(text)s
 WHERE project_id = %(project_id)s AND task_id = %(task_id)s AND task_revision = %(task_revision)s;

-- name: secrets_update_execution
-- An execution revision's spec with its env values sealed again.
UPDATE qinglong.execution_revisions SET spec_json = %(text)s
 WHERE project_id = %(project_id)s AND task_id = %(task_id)s AND task_revision = %(task_revision)s
   AND executor = 'remote_worker';

-- name: secrets_trigger_specs
-- Every trigger head's spec: a hook trigger's secret is sealed like an env value.
SELECT project_id, trigger_id, spec_json::text AS text FROM qinglong.triggers;

-- name: secrets_update_trigger
-- A trigger head's spec with its secret sealed again (the digest is of the spec in clear).
UPDATE qinglong.triggers SET spec_json = %(text)s::jsonb WHERE trigger_id = %(trigger_id)s;
