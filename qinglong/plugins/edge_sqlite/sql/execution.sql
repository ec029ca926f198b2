-- The execution side (execution.py): the local dispatcher's reads and compare-and-set writes.
-- Each write names the state it expects, so a caller that lost a race changes nothing. The scans
-- read partial indexes whose size is what waits or runs (runs_dispatchable, attempts_active,
-- runs_in_flight) or what is old enough to delete (runs_finished, attempts_log_kept), never the
-- whole history.

-- name: exec_dispatch_candidates
-- Runs waiting for a start whose claimed Attempt is due, in dispatch order (scheduled time, then
-- admission, then run id), with the payload of the pinned task revision (the execution spec).
-- CROSS JOIN keeps the dispatchable index as the driving loop, so the scan stops after :limit.
SELECT r.run_id, a.attempt_id, a.attempt_no, r.project_id, r.task_id, r.task_revision,
       r.task_digest, r.scheduled_for_ms, r.admitted_at_ms, r.state AS run_state, v.payload_json
  FROM runs AS r INDEXED BY runs_dispatchable
 CROSS JOIN attempts AS a ON a.run_id = r.run_id AND a.state = 'claimed'
  LEFT JOIN task_revisions AS v
    ON v.project_id = r.project_id AND v.task_id = r.task_id AND v.task_revision = r.task_revision
   AND v.content_digest = r.task_digest
 WHERE r.state IN ('queued', 'retry_wait')
   AND (a.not_before_ms IS NULL OR a.not_before_ms <= :now)
 ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id
 LIMIT :limit;

-- name: exec_active_attempts
-- Every dispatching or running Attempt with its Run and the payload of its pinned task revision.
SELECT a.run_id, a.attempt_id, a.attempt_no, r.project_id, r.task_id, r.task_revision,
       r.task_digest, r.scheduled_for_ms, a.state, a.executor, a.attempt_dir, a.handle_json,
       a.started_at_ms, a.deadline_ms, a.cancel_reason, a.cancel_requested_at_ms, v.payload_json
  FROM attempts AS a INDEXED BY attempts_active
 CROSS JOIN runs AS r ON r.run_id = a.run_id
  LEFT JOIN task_revisions AS v
    ON v.project_id = r.project_id AND v.task_id = r.task_id AND v.task_revision = r.task_revision
   AND v.content_digest = r.task_digest
 WHERE a.state IN ('dispatching', 'running')
 ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id;

-- name: exec_attempt
-- One Attempt with its Run's state and the payload of the Run's pinned task revision.
SELECT a.attempt_id, a.run_id, a.attempt_no, a.state, a.executor, a.execution_digest,
       a.not_before_ms, a.started_at_ms, a.cancel_reason, r.state AS run_state, r.project_id,
       r.task_id, r.task_revision, r.task_digest,
       (SELECT max(attempt_no) FROM attempts WHERE run_id = a.run_id) AS latest_no,
       v.payload_json
  FROM attempts AS a
 CROSS JOIN runs AS r ON r.run_id = a.run_id
  LEFT JOIN task_revisions AS v
    ON v.project_id = r.project_id AND v.task_id = r.task_id AND v.task_revision = r.task_revision
   AND v.content_digest = r.task_digest
 WHERE a.attempt_id = ?;

-- name: exec_latest_attempt_of_run
-- A Run's state and its latest (current) Attempt.
SELECT r.run_id, r.state AS run_state, a.attempt_id, a.attempt_no, a.state, a.cancel_reason
  FROM runs AS r
  LEFT JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.run_id = ?;

-- name: exec_move_run
-- Compare-and-set a Run's state (and, for a terminal state, its finish), from the state the
-- caller read. The reason is replaced when :set_reason (a terminal state always sets its own,
-- None for a success), else kept (a retry's reason stays while the next Attempt runs).
UPDATE runs
   SET state = :target,
       finished_at_ms = :finished,
       reason = CASE WHEN :set_reason THEN :reason ELSE reason END
 WHERE run_id = :run_id AND state = :current;

-- name: exec_begin_dispatch
-- claimed -> dispatching, only while the Attempt is claimed and due; records where its process
-- will live and when its timeout expires.
UPDATE attempts
   SET state = 'dispatching', attempt_dir = :attempt_dir, deadline_ms = :deadline,
       dispatched_at_ms = :now
 WHERE attempt_id = :attempt_id AND state = 'claimed'
   AND (not_before_ms IS NULL OR not_before_ms <= :now);

-- name: exec_record_started
-- dispatching -> running with the process's durable handle.
UPDATE attempts
   SET state = 'running', handle_json = :handle, started_at_ms = :started
 WHERE attempt_id = :attempt_id AND state = 'dispatching';

-- name: exec_return_to_queue
-- dispatching -> claimed for a start that provably never happened: nothing of the dispatch stays.
UPDATE attempts
   SET state = 'claimed', attempt_dir = NULL, handle_json = NULL, deadline_ms = NULL,
       dispatched_at_ms = NULL
 WHERE attempt_id = :attempt_id AND state = 'dispatching';

-- name: exec_end_attempt
-- End an Attempt once, from the state the caller read, with its outcome. The end never precedes
-- the recorded start: a receipt's time comes from the kernel's coarse file clock, which may lag
-- the process clock that stamped the start by a tick.
UPDATE attempts
   SET state = :state, finished_at_ms = max(:finished, COALESCE(started_at_ms, :finished)), exit_code = :exit_code, signal = :signal,
       log_bytes = :log_bytes, log_dropped_bytes = :dropped, reason = :reason,
       cancel_reason = COALESCE(cancel_reason, :cancel_reason),
       cancel_requested_at_ms = COALESCE(cancel_requested_at_ms, :cancel_at)
 WHERE attempt_id = :attempt_id AND state = :current;

-- name: exec_insert_retry
-- The next Attempt of a Run, claimed for the same executor and execution, held back until its
-- backoff has passed.
INSERT INTO attempts (attempt_id, run_id, attempt_no, state, executor, execution_digest,
                      not_before_ms, created_at_ms)
VALUES (:attempt_id, :run_id, :attempt_no, 'claimed', :executor, :digest, :not_before, :now);

-- name: exec_request_cancel
-- A durable cancel request on an active Attempt; the first request's reason stays.
UPDATE attempts
   SET cancel_reason = :reason, cancel_requested_at_ms = :now
 WHERE attempt_id = :attempt_id AND state IN ('dispatching', 'running') AND cancel_reason IS NULL;

-- name: exec_append_event
-- Append a Run's next event (seq follows the Run's last one).
INSERT INTO run_events (run_id, seq, type, at_ms)
SELECT :run_id, COALESCE(max(seq), 0) + 1, :type, :now FROM run_events WHERE run_id = :run_id;

-- name: exec_manual_key
-- The Run a manual idempotency key admitted, if any (the key outlives a pruned Run), and its task.
SELECT run_id, project_id, task_id FROM manual_run_keys WHERE idempotency_key = ?;

-- name: exec_run_by_key
-- The Run holding an idempotency key, if any, and its task.
SELECT run_id, project_id, task_id FROM runs WHERE idempotency_key = ?;

-- name: exec_insert_manual_key
-- Remember a manual Run's idempotency key beyond the Run's own life.
INSERT INTO manual_run_keys (idempotency_key, run_id, project_id, task_id, created_at_ms)
VALUES (?, ?, ?, ?, ?);

-- name: exec_task_for_manual_run
-- A task head and the executor its payload names (a string, else the default), for a manual
-- Run; a deleted task has none.
SELECT k.task_revision, k.content_digest,
       CASE WHEN json_type(k.payload_json, '$.executor') = 'text'
            THEN json_extract(k.payload_json, '$.executor') ELSE 'local_process' END AS executor
  FROM tasks AS k WHERE k.project_id = ? AND k.task_id = ? AND k.deleted_at_ms IS NULL;

-- name: exec_insert_manual_run
-- A queued manual Run: no trigger (trigger_id '' and trigger_revision 0), scheduled for now.
INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                  task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state,
                  idempotency_key)
VALUES (:run_id, :project_id, '', 0, :task_id, :revision, :digest, :now, :now, :now, 'queued',
        :key);

-- name: exec_list_runs
-- Runs newest first (scheduled time, then admission), optionally of one state and project.
SELECT r.run_id, r.project_id, r.task_id, r.trigger_id, r.scheduled_for_ms, r.admitted_at_ms,
       r.state, r.finished_at_ms, r.reason,
       (SELECT count(*) FROM attempts WHERE run_id = r.run_id) AS attempts,
       (SELECT exit_code FROM attempts WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS exit_code,
       (SELECT finished_at_ms - started_at_ms FROM attempts
         WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS duration_ms
  FROM runs AS r INDEXED BY runs_by_time
 WHERE (:state IS NULL OR r.state = :state) AND (:project IS NULL OR r.project_id = :project)
   AND (:task IS NULL OR r.task_id = :task)
 ORDER BY r.scheduled_for_ms DESC, r.admitted_at_ms DESC, r.rowid DESC
 LIMIT :limit;

-- name: exec_list_runs_of_task
-- One task's Runs newest first, optionally of one state.
SELECT r.run_id, r.project_id, r.task_id, r.trigger_id, r.scheduled_for_ms, r.admitted_at_ms,
       r.state, r.finished_at_ms, r.reason,
       (SELECT count(*) FROM attempts WHERE run_id = r.run_id) AS attempts,
       (SELECT exit_code FROM attempts WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS exit_code,
       (SELECT finished_at_ms - started_at_ms FROM attempts
         WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS duration_ms
  FROM runs AS r INDEXED BY runs_by_task
 WHERE r.project_id = :project AND r.task_id = :task AND (:state IS NULL OR r.state = :state)
 ORDER BY r.scheduled_for_ms DESC, r.admitted_at_ms DESC, r.rowid DESC
 LIMIT :limit;

-- name: exec_list_runs_in_flight
-- Runs of one state that is not terminal, newest first, through the in-flight index.
SELECT r.run_id, r.project_id, r.task_id, r.trigger_id, r.scheduled_for_ms, r.admitted_at_ms,
       r.state, r.finished_at_ms, r.reason,
       (SELECT count(*) FROM attempts WHERE run_id = r.run_id) AS attempts,
       (SELECT exit_code FROM attempts WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS exit_code,
       (SELECT finished_at_ms - started_at_ms FROM attempts
         WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS duration_ms
  FROM runs AS r INDEXED BY runs_in_flight
 WHERE r.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
   AND r.state = :state
   AND (:project IS NULL OR r.project_id = :project) AND (:task IS NULL OR r.task_id = :task)
 ORDER BY r.scheduled_for_ms DESC, r.admitted_at_ms DESC, r.rowid DESC
 LIMIT :limit;

-- name: exec_run
-- One Run with the summary fields of its Attempts.
SELECT r.run_id, r.project_id, r.task_id, r.trigger_id, r.scheduled_for_ms, r.admitted_at_ms,
       r.state, r.finished_at_ms, r.reason, r.idempotency_key, r.task_revision, r.jitter_ms,
       (SELECT count(*) FROM attempts WHERE run_id = r.run_id) AS attempts,
       (SELECT exit_code FROM attempts WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS exit_code,
       (SELECT finished_at_ms - started_at_ms FROM attempts
         WHERE run_id = r.run_id AND finished_at_ms IS NOT NULL
         ORDER BY attempt_no DESC LIMIT 1) AS duration_ms
  FROM runs AS r WHERE r.run_id = ?;

-- name: exec_attempts_of_run
-- Every Attempt of a Run, first to last.
SELECT attempt_id, attempt_no, state, executor, created_at_ms, not_before_ms, started_at_ms,
       finished_at_ms, exit_code, signal, finished_at_ms - started_at_ms AS duration_ms,
       log_bytes, log_dropped_bytes, log_deleted_at_ms, attempt_dir, reason, cancel_reason
  FROM attempts WHERE run_id = ? ORDER BY attempt_no;

-- name: exec_finished_logs
-- Ended Attempts whose log still exists, ended before a time, oldest end first.
SELECT attempt_id, attempt_dir
  FROM attempts INDEXED BY attempts_log_kept
 WHERE finished_at_ms IS NOT NULL AND attempt_dir IS NOT NULL AND log_deleted_at_ms IS NULL
   AND finished_at_ms < :before
 ORDER BY finished_at_ms
 LIMIT :limit;

-- name: exec_logs_for_space
-- Ended Attempts whose log still exists under a directory (a prefix of attempt_dir, ending in
-- '/'), oldest end first, except the newest :keep of each task: what a free-space floor may delete.
SELECT attempt_id, attempt_dir
  FROM (SELECT a.attempt_id, a.attempt_dir, a.finished_at_ms,
               ROW_NUMBER() OVER (PARTITION BY r.project_id, r.task_id
                                  ORDER BY a.finished_at_ms DESC, a.attempt_id DESC) AS newest
          FROM attempts AS a INDEXED BY attempts_log_kept
          JOIN runs AS r ON r.run_id = a.run_id
         WHERE a.finished_at_ms IS NOT NULL AND a.attempt_dir IS NOT NULL
           AND a.log_deleted_at_ms IS NULL)
 WHERE newest > :keep
   AND substr(attempt_dir, 1, length(:under)) = :under
 ORDER BY finished_at_ms
 LIMIT :limit;

-- name: exec_mark_log_deleted
-- The tombstone of a deleted log (the first deletion's time stays).
UPDATE attempts SET log_deleted_at_ms = :now
 WHERE attempt_id = :attempt_id AND log_deleted_at_ms IS NULL;

-- name: exec_prunable_runs
-- Terminal Runs finished before a time, oldest first, none of whose Attempts still has a log on
-- disk (log retention deletes it first; pruning the row would forget the file).
SELECT r.run_id
  FROM runs AS r INDEXED BY runs_finished
 WHERE r.finished_at_ms IS NOT NULL AND r.finished_at_ms < :before
   AND r.state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
   AND NOT EXISTS (SELECT 1 FROM attempts AS a
                    WHERE a.run_id = r.run_id AND a.attempt_dir IS NOT NULL
                      AND a.log_deleted_at_ms IS NULL)
 ORDER BY r.finished_at_ms
 LIMIT :limit;

-- name: exec_delete_run_events
-- A pruned Run's events.
DELETE FROM run_events WHERE run_id = ?;

-- name: exec_delete_run_attempts
-- A pruned Run's Attempts.
DELETE FROM attempts WHERE run_id = ?;

-- name: exec_delete_run
-- A pruned Run (its events and Attempts went first; its manual key, if any, stays).
DELETE FROM runs WHERE run_id = ?;

-- name: exec_insert_run_skip
-- A Run skipped before it started, as a skip record (its Run's row is deleted next).
INSERT INTO run_skips (run_id, project_id, task_id, trigger_id, scheduled_for_ms, reason, recorded_at_ms)
SELECT run_id, project_id, task_id, trigger_id, scheduled_for_ms, :reason, :now
  FROM runs WHERE run_id = :run_id;

-- name: exec_recent_run_skips
-- The newest Runs skipped before they started, newest first.
SELECT run_id, project_id, task_id, trigger_id, scheduled_for_ms, reason, recorded_at_ms
  FROM run_skips ORDER BY id DESC LIMIT :limit;

-- name: exec_note_attempt
-- A note on an Attempt still holding a process (what keeps it from being stopped).
UPDATE attempts SET reason = :note
 WHERE attempt_id = :attempt_id AND state IN ('dispatching', 'running');

-- name: exec_prune_schedule_skips
-- Up to :limit skipped occurrences recorded before :before, oldest first (skip retention).
DELETE FROM schedule_skips WHERE id IN (
    SELECT id FROM schedule_skips INDEXED BY schedule_skips_by_recorded
     WHERE recorded_at_ms < :before ORDER BY recorded_at_ms LIMIT :limit);

-- name: exec_prune_run_skips
-- Up to :limit Runs skipped before they started, recorded before :before, oldest first (a
-- manual Run's key stays in manual_run_keys).
DELETE FROM run_skips WHERE id IN (
    SELECT id FROM run_skips INDEXED BY run_skips_by_recorded
     WHERE recorded_at_ms < :before ORDER BY recorded_at_ms LIMIT :limit);
