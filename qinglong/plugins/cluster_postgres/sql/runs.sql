-- The control plane's side of the cluster's Runs, as the runtime role: reading and cancelling
-- them for the operator's commands (`runs`, `runs show`, `runs cancel`, `logs`: short read-only
-- statements, each one snapshot), and the replicas' expiry and log retention. Every change goes
-- through a control-plane function (qinglong.request_cancel, expire_attempts,
-- prune_attempt_logs): the role never UPDATEs or DELETEs runs, attempts or logs itself.

-- name: control_list_runs
-- Runs newest first (scheduled time, then admission, then id), optionally of one state,
-- project, task and trigger (NULL = any), at most %(limit)s, each with its number of Attempts
-- and the exit code and duration of its last ended Attempt.
SELECT r.run_id::text AS run_id, r.project_id, r.task_id, r.trigger_id, r.scheduled_for_ms,
       r.admitted_at_ms, r.state, r.finished_at_ms, r.reason, r.idempotency_key, r.task_revision,
       n.attempts, last.exit_code, last.duration_ms
  FROM qinglong.runs r
 CROSS JOIN LATERAL (SELECT count(*)::integer AS attempts
                       FROM qinglong.attempts a WHERE a.run_id = r.run_id) n
  LEFT JOIN LATERAL (SELECT a.exit_code, a.finished_at_ms - a.started_at_ms AS duration_ms
                       FROM qinglong.attempts a
                      WHERE a.run_id = r.run_id AND a.finished_at_ms IS NOT NULL
                      ORDER BY a.attempt_no DESC LIMIT 1) last ON true
 WHERE (%(state)s::text IS NULL OR r.state = %(state)s::text)
   AND (%(project_id)s::text IS NULL OR r.project_id = %(project_id)s::text)
   AND (%(task_id)s::text IS NULL OR r.task_id = %(task_id)s::text)
   AND (%(trigger_id)s::text IS NULL OR r.trigger_id = %(trigger_id)s::text)
 ORDER BY r.scheduled_for_ms DESC, r.admitted_at_ms DESC, r.run_id DESC
 LIMIT %(limit)s::bigint

-- name: control_run_detail
-- One Run (by id) with every Attempt, first to last, in one statement (one snapshot): one row
-- per Attempt carrying the Run's columns too (a Run has at least one Attempt; the LEFT JOIN
-- still returns the Run if it has none).
SELECT r.run_id::text AS run_id, r.project_id, r.task_id, r.trigger_id, r.scheduled_for_ms,
       r.admitted_at_ms, r.state AS run_state, r.finished_at_ms AS run_finished_at_ms,
       r.reason AS run_reason, r.idempotency_key, r.task_revision,
       a.attempt_id::text AS attempt_id, a.attempt_no, a.state, a.executor, a.created_at_ms,
       a.not_before_ms, a.started_at_ms, a.finished_at_ms, a.exit_code, a.signal,
       a.finished_at_ms - a.started_at_ms AS duration_ms, a.log_bytes, a.log_dropped_bytes,
       a.log_deleted_at_ms, a.reason, a.cancel_reason, a.worker_id
  FROM qinglong.runs r
  LEFT JOIN qinglong.attempts a ON a.run_id = r.run_id
 WHERE r.run_id = %(run_id)s::uuid
 ORDER BY a.attempt_no

-- name: control_request_cancel
-- Cancel a Run through the control-plane function: its state after, NULL for an unknown Run.
SELECT qinglong.request_cancel(%(run_id)s::uuid, %(reason)s::text) AS state

-- name: control_log_state
-- An Attempt's state and the bytes of its log stored so far (the end of its last chunk: chunks
-- are contiguous from 0), its dropped bytes and its tombstone, in one snapshot.
SELECT a.state, a.log_dropped_bytes, a.log_deleted_at_ms,
       coalesce((SELECT l.offset_bytes + length(l.data)
                   FROM qinglong.attempt_logs l
                  WHERE l.attempt_id = a.attempt_id
                  ORDER BY l.offset_bytes DESC LIMIT 1), 0)::bigint AS stored_bytes
  FROM qinglong.attempts a
 WHERE a.attempt_id = %(attempt_id)s::uuid

-- name: control_read_log
-- The stored chunks of an Attempt's log that overlap [%(offset)s, %(end)s), in order. A chunk
-- is at most %(max_chunk)s bytes, so one overlapping %(offset)s starts after
-- %(offset)s - %(max_chunk)s: the scan is a bounded range of the primary key.
SELECT offset_bytes, data
  FROM qinglong.attempt_logs
 WHERE attempt_id = %(attempt_id)s::uuid
   AND offset_bytes > %(offset)s::bigint - %(max_chunk)s::bigint
   AND offset_bytes < %(end)s::bigint
   AND offset_bytes + length(data) > %(offset)s::bigint
 ORDER BY offset_bytes

-- name: control_expire_attempts
-- One bounded, leaderless expiry page (SKIP LOCKED inside the function, database time): what
-- it did to each Attempt ('requeued', 'lost', 'timed_out'), at most %(limit)s rows.
SELECT attempt_id::text AS attempt_id, run_id::text AS run_id, action
  FROM qinglong.expire_attempts(%(limit)s::integer)

-- name: control_prune_logs
-- Delete up to %(limit)s shipped log chunks of Attempts that ended more than %(retention_ms)s
-- ago in database time (each keeps its tombstone); how many were deleted.
SELECT qinglong.prune_attempt_logs(
           floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - %(retention_ms)s::bigint,
           %(limit)s::integer) AS pruned
