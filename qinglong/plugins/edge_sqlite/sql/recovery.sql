-- name: count_pristine_queued
-- In-flight Runs whose latest Attempt is exactly as admission left it.
SELECT count(*)
  FROM runs AS r
  JOIN attempts AS a ON a.run_id = r.run_id
 WHERE r.state = 'queued' AND r.queued_at_ms IS NOT NULL
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
   AND a.state = 'claimed' AND a.executor = 'remote_worker'
   AND a.worker_id IS NULL AND a.session_id IS NULL AND a.lease_id IS NULL
   AND a.offer_id IS NULL AND a.callback_token IS NULL AND a.started_at_ms IS NULL
   AND a.finished_at_ms IS NULL AND a.result_json IS NULL AND a.error_json IS NULL;

-- name: in_flight_not_pristine
-- In-flight Runs (not finished) whose latest Attempt drifted, or that have no Attempt at all.
SELECT r.run_id, r.state, r.queued_at_ms, a.attempt_id, a.attempt_no, a.state, a.executor,
       (a.worker_id IS NOT NULL OR a.session_id IS NOT NULL OR a.lease_id IS NOT NULL
        OR a.offer_id IS NOT NULL OR a.callback_token IS NOT NULL OR a.started_at_ms IS NOT NULL
        OR a.finished_at_ms IS NOT NULL OR a.result_json IS NOT NULL OR a.error_json IS NOT NULL)
  FROM runs AS r
  LEFT JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
 WHERE r.state NOT IN ('succeeded', 'failed', 'cancelled')
   AND NOT (r.state = 'queued' AND r.queued_at_ms IS NOT NULL
            AND a.state IS 'claimed' AND a.executor IS 'remote_worker'
            AND a.worker_id IS NULL AND a.session_id IS NULL AND a.lease_id IS NULL
            AND a.offer_id IS NULL AND a.callback_token IS NULL AND a.started_at_ms IS NULL
            AND a.finished_at_ms IS NULL AND a.result_json IS NULL AND a.error_json IS NULL)
 ORDER BY r.rowid
 LIMIT ?;
