-- name: claim_uninitialized_page
-- Schedules awaiting initialization (NULL cursor sorts first), by project and trigger, after the
-- keyset (:after_project, :after_trigger) and not held as undecidable by this process.
-- executor: the one the task head's payload names (a string), else the default, local_process.
-- CROSS JOIN pins the schedule index as the driving loop, so the scan stops after one page.
SELECT s.trigger_id, s.project_id, s.trigger_revision, s.next_fire_at_ms,
       s.last_scheduled_at_ms, s.state_version, s.published_at_ms,
       t.task_id, t.kind, t.spec_json, t.misfire_policy, t.misfire_grace_ms, t.jitter_ms,
       t.content_digest AS trigger_digest, k.task_revision, k.content_digest AS task_digest,
       CASE WHEN json_type(k.payload_json, '$.executor') = 'text'
            THEN json_extract(k.payload_json, '$.executor') ELSE 'local_process' END AS executor
  FROM trigger_schedules AS s
 CROSS JOIN triggers AS t ON t.trigger_id = s.trigger_id AND t.trigger_revision = s.trigger_revision
 CROSS JOIN projects AS p ON p.project_id = s.project_id
 CROSS JOIN tasks AS k ON k.project_id = t.project_id AND k.task_id = t.task_id
 WHERE s.next_fire_at_ms IS NULL
   AND (s.project_id, s.trigger_id) > (:after_project, :after_trigger)
   AND NOT EXISTS (SELECT 1 FROM temp.scheduler_held AS h
                    WHERE h.trigger_id = s.trigger_id AND h.trigger_revision = s.trigger_revision)
   AND t.enabled = 1
   AND p.active = 1
 ORDER BY s.project_id, s.trigger_id
 LIMIT :page;

-- name: claim_due_page
-- Due schedules of enabled triggers of active projects, oldest cursor first, one page at most,
-- after the keyset (:after_next, :after_project, :after_trigger) and not held as undecidable.
SELECT s.trigger_id, s.project_id, s.trigger_revision, s.next_fire_at_ms,
       s.last_scheduled_at_ms, s.state_version, s.published_at_ms,
       t.task_id, t.kind, t.spec_json, t.misfire_policy, t.misfire_grace_ms, t.jitter_ms,
       t.content_digest AS trigger_digest, k.task_revision, k.content_digest AS task_digest,
       CASE WHEN json_type(k.payload_json, '$.executor') = 'text'
            THEN json_extract(k.payload_json, '$.executor') ELSE 'local_process' END AS executor
  FROM trigger_schedules AS s
 CROSS JOIN triggers AS t ON t.trigger_id = s.trigger_id AND t.trigger_revision = s.trigger_revision
 CROSS JOIN projects AS p ON p.project_id = s.project_id
 CROSS JOIN tasks AS k ON k.project_id = t.project_id AND k.task_id = t.task_id
 WHERE s.next_fire_at_ms <= :now
   AND (s.next_fire_at_ms, s.project_id, s.trigger_id) > (:after_next, :after_project, :after_trigger)
   AND NOT EXISTS (SELECT 1 FROM temp.scheduler_held AS h
                    WHERE h.trigger_id = s.trigger_id AND h.trigger_revision = s.trigger_revision)
   AND t.enabled = 1
   AND p.active = 1
 ORDER BY s.next_fire_at_ms, s.project_id, s.trigger_id
 LIMIT :page;

-- name: task_head_revision
-- The head revision of a task, read inside the page transaction: an admission pins it.
SELECT task_revision FROM tasks WHERE project_id = ? AND task_id = ?;

-- name: advance_schedule
-- Compare-and-set the cursor: only if revision, state version and cursor are what we decided from.
UPDATE trigger_schedules
   SET next_fire_at_ms = :next,
       last_scheduled_at_ms = COALESCE(:scheduled, last_scheduled_at_ms),
       state_version = state_version + 1,
       updated_at_ms = :now
 WHERE trigger_id = :trigger_id
   AND trigger_revision = :revision
   AND state_version = :state_version
   AND next_fire_at_ms IS :expected;

-- name: insert_run
-- A queued Run for one admitted occurrence; the UNIQUE idempotency key refuses a second one.
INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                  task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state,
                  idempotency_key, jitter_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?);

-- name: insert_attempt
-- The Run's first Attempt, claimed for the executor its task names; every dispatch field is NULL.
INSERT INTO attempts (attempt_id, run_id, attempt_no, state, executor, execution_digest,
                      created_at_ms)
VALUES (:attempt_id, :run_id, 1, 'claimed', :executor, :digest, :now);

-- name: insert_run_events
-- The two events of an admission, in one statement.
INSERT INTO run_events (run_id, seq, type, at_ms)
VALUES (?1, 1, 'run.created', ?2), (?1, 2, 'run.queued', ?2);

-- name: insert_schedule_skip
-- Record occurrences a misfire decision deliberately did not admit.
INSERT INTO schedule_skips (project_id, trigger_id, trigger_revision, policy, first_skipped_ms,
                            last_skipped_ms, count, count_exact, recorded_at_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: create_held_table
-- This process's memory of undecidable (trigger, revision) pairs, so the due scan steps past them.
-- A TEMP table lives in memory with the connection (temp_store = MEMORY) and never touches the file.
CREATE TEMP TABLE IF NOT EXISTS scheduler_held (
    trigger_id       TEXT NOT NULL,
    trigger_revision INTEGER NOT NULL,
    PRIMARY KEY (trigger_id, trigger_revision)
) WITHOUT ROWID;

-- name: held_table_exists
-- Whether this connection already has the held table (a new connection starts with an empty memory).
SELECT 1 FROM temp.sqlite_master WHERE type = 'table' AND name = 'scheduler_held';

-- name: insert_held
-- Hold one undecidable pair.
INSERT OR IGNORE INTO temp.scheduler_held (trigger_id, trigger_revision) VALUES (?, ?);

-- name: delete_held
-- Release one pair whose hold expired.
DELETE FROM temp.scheduler_held WHERE trigger_id = ? AND trigger_revision = ?;
