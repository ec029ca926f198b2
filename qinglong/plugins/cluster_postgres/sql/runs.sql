-- The control plane's side of the cluster's Runs, as the runtime role: reading and cancelling
-- them for the operator's commands (`runs`, `runs show`, `runs cancel`, `logs`: short read-only
-- statements, each one snapshot), and the replicas' expiry and log retention. Every change goes
-- through a control-plane function (qinglong.request_cancel, expire_attempt,
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
       r.reason AS run_reason, r.idempotency_key, r.task_revision, r.jitter_ms,
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

-- name: control_expired_attempts
-- The Attempts expiry must end now, at most %(limit)s (a plain read: expire_attempt re-checks
-- each under its row locks): expired leases first, then running Attempts whose deadline is past
-- by their session's lease; with what the decision needs (the pinned spec as JSON text, NULL
-- when the revision has none) and the database clock.
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
),
lease AS (
    SELECT a.attempt_id, 0 AS rank, a.lease_expires_at_ms AS due_ms
    FROM qinglong.attempts a CROSS JOIN clock
    WHERE a.state IN ('dispatching', 'running') AND a.lease_expires_at_ms <= clock.now_ms
    ORDER BY a.lease_expires_at_ms
    LIMIT %(limit)s
),
deadline AS (
    SELECT a.attempt_id, 1 AS rank, a.deadline_ms AS due_ms
    FROM qinglong.attempts a CROSS JOIN clock
    LEFT JOIN qinglong.worker_sessions w ON w.worker_id = a.worker_id
    WHERE a.state = 'running' AND a.lease_expires_at_ms > clock.now_ms
      AND a.deadline_ms + coalesce(w.lease_ms, 600000::bigint) <= clock.now_ms
    ORDER BY a.deadline_ms
    LIMIT %(limit)s
),
picked AS (
    SELECT * FROM lease UNION ALL SELECT * FROM deadline
    ORDER BY rank, due_ms
    LIMIT %(limit)s
)
SELECT a.attempt_id::text AS attempt_id, a.run_id::text AS run_id, a.attempt_no, a.state,
       a.lease_version, a.worker_id, a.session_generation, a.cancel_reason,
       CASE WHEN p.rank = 0 THEN 'lease' ELSE 'deadline' END AS expired,
       (e.spec_json::jsonb -> 'execution')::text AS spec, clock.now_ms
FROM picked p
CROSS JOIN clock
JOIN qinglong.attempts a ON a.attempt_id = p.attempt_id
JOIN qinglong.runs r ON r.run_id = a.run_id
LEFT JOIN qinglong.execution_revisions e
  ON e.project_id = r.project_id AND e.task_id = r.task_id AND e.task_revision = r.task_revision
 AND e.executor = r.executor
ORDER BY p.rank, p.due_ms

-- name: control_expire_attempt
-- Apply the control plane's decision for one expired Attempt under its fence and state (see
-- qinglong.expire_attempt): the action applied, or NULL when the Attempt moved on.
SELECT qinglong.expire_attempt(%(attempt_id)s::uuid, %(lease_version)s::bigint, %(action)s::text,
                               %(reason)s::text, %(next_attempt_no)s::integer,
                               %(retry_after_ms)s::bigint, %(stop_words)s::text) AS action

-- name: control_prune_logs
-- Delete up to %(limit)s shipped log chunks of Attempts that ended more than %(retention_ms)s
-- ago in database time (each keeps its tombstone); how many were deleted.
SELECT qinglong.prune_attempt_logs(
           floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - %(retention_ms)s::bigint,
           %(limit)s::integer) AS pruned

-- name: control_prune_skips
-- Delete up to %(limit)s skip records of each kind recorded before %(before)s (the caller's
-- skip_cutoff_ms), or before %(retention_ms)s ago in database time when %(before)s is NULL
-- (qinglong.prune_skips keeps the last hour whatever it is given).
SELECT p.occurrences, p.runs
  FROM qinglong.prune_skips(
           coalesce(%(before)s::bigint,
                    floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
                    - greatest(%(retention_ms)s::bigint, %(min_retention_ms)s::bigint)),
           %(limit)s::integer) AS p

-- name: control_request_cancel_audited
-- Cancel a Run and append the API request's audit entry in one transaction: its state after,
-- NULL for an unknown Run (and then no entry).
SELECT qinglong.request_cancel_audited(%(run_id)s::uuid, %(reason)s::text, %(at)s, %(actor)s, %(token_id)s,
                                       %(source)s, %(detail)s) AS state

-- name: control_recent_run_skips
-- The newest Runs skipped before they started (qinglong._skip_run), newest first.
SELECT k.run_id::text AS run_id, k.project_id, k.task_id, k.trigger_id, k.scheduled_for_ms,
       k.reason, k.recorded_at_ms
  FROM qinglong.run_skips k
 ORDER BY k.skip_seq DESC
 LIMIT %(limit)s::bigint

-- name: control_list_workers
-- Every worker id's current session (one row per worker id: a handful), live ones first, then by
-- worker id, at most %(limit)s: its labels, capacity, clocks and its leased Attempts (dispatching
-- or running under this session's generation, as stats.sql counts them). %(worker_ids)s not
-- NULL: only those worker ids (what a token limited to projects may see).
SELECT w.worker_id, w.labels, w.capacity, w.opened_at_ms, w.heartbeat_at_ms, w.lease_expires_at_ms,
       w.closed_at_ms,
       (SELECT count(*) FROM qinglong.attempts a
        WHERE a.session_id = w.session_id AND a.session_generation = w.generation
          AND a.state IN ('dispatching', 'running')) AS running
FROM qinglong.worker_sessions w
WHERE %(worker_ids)s::text[] IS NULL OR w.worker_id = ANY (%(worker_ids)s::text[])
ORDER BY (w.closed_at_ms IS NULL AND w.lease_expires_at_ms > %(now_ms)s::bigint) DESC, w.worker_id
LIMIT %(limit)s;
