-- Both queries read only Runs still in flight, through the partial index runs_in_flight (finished
-- Runs are most of the table and never need recovery). "Pristine" is exactly what admission
-- writes: the Run queued at its admission time; its latest Attempt the first, claimed for
-- remote_worker at the admission time with every dispatch and result field NULL; and exactly the
-- events run.created (seq 1) and run.queued (seq 2) at the admission time. The execution digest
-- is checked against the pinned task revision by the caller, per distinct pin.

-- name: pristine_queued_by_pin
-- Pristine-shaped in-flight Runs counted per pinned task revision and recorded execution digest.
SELECT r.project_id, r.task_id, r.task_revision, r.task_digest, a.execution_digest, count(*)
  FROM runs AS r INDEXED BY runs_in_flight
  JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.state NOT IN ('succeeded', 'failed', 'cancelled')
   AND r.state = 'queued' AND r.queued_at_ms IS r.admitted_at_ms
   AND a.attempt_no = 1 AND a.state = 'claimed' AND a.executor = 'remote_worker'
   AND a.created_at_ms IS r.admitted_at_ms
   AND a.worker_id IS NULL AND a.session_id IS NULL AND a.lease_id IS NULL
   AND a.offer_id IS NULL AND a.callback_token IS NULL AND a.started_at_ms IS NULL
   AND a.finished_at_ms IS NULL AND a.result_json IS NULL AND a.error_json IS NULL
   AND (SELECT count(*) FROM run_events WHERE run_id = r.run_id) = 2
   AND EXISTS (SELECT 1 FROM run_events WHERE run_id = r.run_id AND seq = 1
                  AND type = 'run.created' AND at_ms IS r.admitted_at_ms)
   AND EXISTS (SELECT 1 FROM run_events WHERE run_id = r.run_id AND seq = 2
                  AND type = 'run.queued' AND at_ms IS r.admitted_at_ms)
 GROUP BY r.project_id, r.task_id, r.task_revision, r.task_digest, a.execution_digest;

-- name: in_flight_not_pristine
-- In-flight Runs (not finished) whose shape drifted from what admission wrote, or that have no
-- Attempt at all, with what is needed to say why.
SELECT r.run_id, r.state, r.queued_at_ms, r.admitted_at_ms, a.attempt_id, a.attempt_no, a.state,
       a.executor, a.created_at_ms,
       (a.worker_id IS NOT NULL OR a.session_id IS NOT NULL OR a.lease_id IS NOT NULL
        OR a.offer_id IS NOT NULL OR a.callback_token IS NOT NULL OR a.started_at_ms IS NOT NULL
        OR a.finished_at_ms IS NOT NULL OR a.result_json IS NOT NULL OR a.error_json IS NOT NULL),
       ((SELECT count(*) FROM run_events WHERE run_id = r.run_id) = 2
        AND EXISTS (SELECT 1 FROM run_events WHERE run_id = r.run_id AND seq = 1
                       AND type = 'run.created' AND at_ms IS r.admitted_at_ms)
        AND EXISTS (SELECT 1 FROM run_events WHERE run_id = r.run_id AND seq = 2
                       AND type = 'run.queued' AND at_ms IS r.admitted_at_ms))
  FROM runs AS r INDEXED BY runs_in_flight
  LEFT JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.state NOT IN ('succeeded', 'failed', 'cancelled')
   AND NOT (r.state = 'queued' AND r.queued_at_ms IS r.admitted_at_ms
            AND a.attempt_no IS 1 AND a.state IS 'claimed' AND a.executor IS 'remote_worker'
            AND a.created_at_ms IS r.admitted_at_ms
            AND a.worker_id IS NULL AND a.session_id IS NULL AND a.lease_id IS NULL
            AND a.offer_id IS NULL AND a.callback_token IS NULL AND a.started_at_ms IS NULL
            AND a.finished_at_ms IS NULL AND a.result_json IS NULL AND a.error_json IS NULL
            AND (SELECT count(*) FROM run_events WHERE run_id = r.run_id) = 2
            AND EXISTS (SELECT 1 FROM run_events WHERE run_id = r.run_id AND seq = 1
                           AND type = 'run.created' AND at_ms IS r.admitted_at_ms)
            AND EXISTS (SELECT 1 FROM run_events WHERE run_id = r.run_id AND seq = 2
                           AND type = 'run.queued' AND at_ms IS r.admitted_at_ms))
 ORDER BY r.rowid
 LIMIT ?;

-- name: in_flight_of_pin
-- The in-flight Runs of one pin whose latest Attempt recorded one execution digest (to name
-- the Runs of a pin whose digest does not match).
SELECT r.run_id, a.attempt_id, a.attempt_no
  FROM runs AS r INDEXED BY runs_in_flight
  JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.state NOT IN ('succeeded', 'failed', 'cancelled')
   AND r.project_id = ? AND r.task_id = ? AND r.task_revision = ? AND r.task_digest = ?
   AND a.execution_digest = ?
 ORDER BY r.rowid
 LIMIT ?;

-- name: task_revision_exists
-- Whether a Run's pinned task revision is stored with the digest the Run recorded.
SELECT 1 FROM task_revisions
 WHERE project_id = ? AND task_id = ? AND task_revision = ? AND content_digest = ?;
