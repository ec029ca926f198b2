-- Every query reads only Runs still in flight, through the partial index runs_in_flight (finished
-- Runs are most of a long-lived file and never need recovery). "Pristine" is exactly what
-- admission writes: the Run queued at its admission time; its latest Attempt the first, claimed
-- at the admission time with every dispatch and result field NULL; and exactly
-- the events run.created (seq 1) and run.queued (seq 2) at the admission time (the event sum is 2
-- only for those two: any other event adds 3). The executor and the execution digest are checked
-- against the pinned task revision (the executor its payload names) by the caller, once per
-- distinct pin.

-- name: in_flight_summary
-- One pass over the in-flight Runs: how many are pristine-shaped (1) or not (0), and how many are
-- executing (their Attempt holds, or may hold, a process in the Run's state, or waits for its
-- retry's backoff: the dispatcher's reconciler inspects those), per pinned task revision and the
-- executor and execution digest their latest Attempt recorded.
SELECT (r.state = 'queued' AND r.queued_at_ms IS r.admitted_at_ms
        AND a.attempt_no IS 1 AND a.state IS 'claimed'
        AND a.created_at_ms IS r.admitted_at_ms
        AND a.worker_id IS NULL AND a.session_id IS NULL AND a.lease_id IS NULL
        AND a.offer_id IS NULL AND a.callback_token IS NULL AND a.started_at_ms IS NULL
        AND a.finished_at_ms IS NULL AND a.result_json IS NULL AND a.error_json IS NULL
        AND a.not_before_ms IS NULL AND a.attempt_dir IS NULL AND a.handle_json IS NULL
        AND a.deadline_ms IS NULL AND a.dispatched_at_ms IS NULL AND a.cancel_reason IS NULL
        AND a.cancel_requested_at_ms IS NULL AND a.exit_code IS NULL AND a.signal IS NULL
        AND a.log_bytes IS NULL AND a.log_dropped_bytes IS 0 AND a.log_deleted_at_ms IS NULL
        AND a.reason IS NULL AND r.finished_at_ms IS NULL AND r.reason IS NULL
        AND (SELECT sum(CASE WHEN at_ms IS r.admitted_at_ms
                             AND ((seq = 1 AND type = 'run.created') OR (seq = 2 AND type = 'run.queued'))
                           THEN 1 ELSE 3 END)
             FROM run_events WHERE run_id = r.run_id) IS 2) AS pristine,
       ((r.state IN ('dispatching', 'running') AND a.state IS r.state)
        OR (r.state = 'retry_wait' AND a.state IS 'claimed' AND a.attempt_no > 1
            AND a.not_before_ms IS NOT NULL)) AS executing,
       r.project_id, r.task_id, r.task_revision, r.task_digest, a.executor, a.execution_digest,
       count(*) AS runs
  FROM runs AS r INDEXED BY runs_in_flight
  LEFT JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
 GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

-- name: in_flight_not_pristine
-- In-flight Runs whose shape drifted from what admission wrote and that are not executing, or
-- that have no Attempt at all, with what is needed to say why. Read only when the summary found
-- some.
SELECT r.run_id, r.state AS run_state, r.queued_at_ms, r.admitted_at_ms, a.attempt_id, a.attempt_no,
       a.state AS attempt_state, a.executor, a.created_at_ms AS attempt_created_at_ms,
       (a.worker_id IS NOT NULL OR a.session_id IS NOT NULL OR a.lease_id IS NOT NULL
        OR a.offer_id IS NOT NULL OR a.callback_token IS NOT NULL OR a.started_at_ms IS NOT NULL
        OR a.finished_at_ms IS NOT NULL OR a.result_json IS NOT NULL OR a.error_json IS NOT NULL
        OR a.not_before_ms IS NOT NULL OR a.attempt_dir IS NOT NULL OR a.handle_json IS NOT NULL
        OR a.deadline_ms IS NOT NULL OR a.dispatched_at_ms IS NOT NULL
        OR a.cancel_reason IS NOT NULL OR a.cancel_requested_at_ms IS NOT NULL
        OR a.exit_code IS NOT NULL OR a.signal IS NOT NULL OR a.log_bytes IS NOT NULL
        OR a.log_dropped_bytes IS NOT 0 OR a.log_deleted_at_ms IS NOT NULL OR a.reason IS NOT NULL
        OR r.finished_at_ms IS NOT NULL OR r.reason IS NOT NULL) AS touched,
       (SELECT sum(CASE WHEN at_ms IS r.admitted_at_ms
                                AND ((seq = 1 AND type = 'run.created') OR (seq = 2 AND type = 'run.queued'))
                              THEN 1 ELSE 3 END)
                FROM run_events WHERE run_id = r.run_id) IS 2 AS events_ok
  FROM runs AS r INDEXED BY runs_in_flight
  LEFT JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
   AND NOT COALESCE((r.state IN ('dispatching', 'running') AND a.state IS r.state)
        OR (r.state = 'retry_wait' AND a.state IS 'claimed' AND a.attempt_no > 1
            AND a.not_before_ms IS NOT NULL), 0)
   AND NOT (r.state = 'queued' AND r.queued_at_ms IS r.admitted_at_ms
        AND a.attempt_no IS 1 AND a.state IS 'claimed'
        AND a.created_at_ms IS r.admitted_at_ms
        AND a.worker_id IS NULL AND a.session_id IS NULL AND a.lease_id IS NULL
        AND a.offer_id IS NULL AND a.callback_token IS NULL AND a.started_at_ms IS NULL
        AND a.finished_at_ms IS NULL AND a.result_json IS NULL AND a.error_json IS NULL
        AND a.not_before_ms IS NULL AND a.attempt_dir IS NULL AND a.handle_json IS NULL
        AND a.deadline_ms IS NULL AND a.dispatched_at_ms IS NULL AND a.cancel_reason IS NULL
        AND a.cancel_requested_at_ms IS NULL AND a.exit_code IS NULL AND a.signal IS NULL
        AND a.log_bytes IS NULL AND a.log_dropped_bytes IS 0 AND a.log_deleted_at_ms IS NULL
        AND a.reason IS NULL AND r.finished_at_ms IS NULL AND r.reason IS NULL
        AND (SELECT sum(CASE WHEN at_ms IS r.admitted_at_ms
                             AND ((seq = 1 AND type = 'run.created') OR (seq = 2 AND type = 'run.queued'))
                           THEN 1 ELSE 3 END)
             FROM run_events WHERE run_id = r.run_id) IS 2)
 ORDER BY r.rowid
 LIMIT ?;

-- name: in_flight_of_pin
-- The in-flight Runs of one pin whose latest Attempt recorded one executor and execution digest
-- (to name the Runs of a pin whose executor or digest does not match).
SELECT r.run_id, a.attempt_id, a.attempt_no
  FROM runs AS r INDEXED BY runs_in_flight
  JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
   AND r.project_id = ? AND r.task_id = ? AND r.task_revision = ? AND r.task_digest = ?
   AND a.executor IS ? AND a.execution_digest IS ?
 ORDER BY r.rowid
 LIMIT ?;

-- name: task_revision_executor
-- The executor a Run's pinned task revision names (a string in its payload, else the default),
-- if that revision is stored with the digest the Run recorded.
SELECT CASE WHEN json_type(payload_json, '$.executor') = 'text'
            THEN json_extract(payload_json, '$.executor') ELSE 'local_process' END AS executor
  FROM task_revisions
 WHERE project_id = ? AND task_id = ? AND task_revision = ? AND content_digest = ?;
