-- Chained Runs (execution.py, publisher.py): the 'after' triggers a Run's end starts, and the
-- chain graph a publish checks for a loop.

-- name: chain_run
-- The project and task of a Run that just ended.
SELECT project_id, task_id FROM runs WHERE run_id = ?;

-- name: chain_triggers_of
-- The enabled 'after' triggers of an active project that follow a task, in id order.
SELECT t.trigger_id, t.trigger_revision, t.task_id, t.spec_json
  FROM triggers AS t
  JOIN projects AS p ON p.project_id = t.project_id
 WHERE t.project_id = :project AND t.kind = 'after' AND t.enabled = 1
   AND json_extract(t.spec_json, '$.task') = :task
   AND p.active = 1 AND p.deleted_at_ms IS NULL
 ORDER BY t.trigger_id;

-- name: chain_edges
-- Every 'after' trigger of a project as an edge of the chain graph (upstream -> its own task).
SELECT trigger_id, json_extract(spec_json, '$.task') AS upstream, task_id
  FROM triggers WHERE project_id = ? AND kind = 'after';

-- name: chain_insert_run
-- A queued Run of a trigger admitted by an event (an upstream Run's end, an event source),
-- scheduled for :now; a second admission of the same key inserts nothing.
INSERT OR IGNORE INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                            task_revision, task_digest, scheduled_for_ms, admitted_at_ms,
                            queued_at_ms, state, idempotency_key)
VALUES (:run_id, :project_id, :trigger_id, :trigger_revision, :task_id, :revision, :digest, :now,
        :now, :now, 'queued', :key);

-- name: occurrence_trigger
-- A trigger an event source admits for: its kind, revision, whether it may admit (enabled, its
-- project active, its task live) and its task head with the executor its payload names.
SELECT t.kind, t.trigger_revision, t.task_id, t.project_id,
       (t.enabled = 1 AND p.active = 1 AND p.deleted_at_ms IS NULL
        AND k.deleted_at_ms IS NULL) AS admits,
       k.task_revision, k.content_digest,
       CASE WHEN json_type(k.payload_json, '$.executor') = 'text'
            THEN json_extract(k.payload_json, '$.executor') ELSE 'local_process' END AS executor
  FROM triggers AS t
  JOIN projects AS p ON p.project_id = t.project_id
  JOIN tasks AS k ON k.project_id = t.project_id AND k.task_id = t.task_id
 WHERE t.trigger_id = ?;

-- name: insert_event_payload
-- What the event admitted the Run with (canonical JSON), in the admitting transaction.
INSERT INTO run_event_payloads (run_id, payload_json) VALUES (?, ?);

-- name: event_payload
-- The payload a Run was admitted with, if any.
SELECT payload_json FROM run_event_payloads WHERE run_id = ?;
