-- name: scan_in_flight_runs
-- Lists every in-flight Run (queued, dispatching, running, retry_wait) and whether it is pristine: exactly as
-- admission left it. The Run is runtime-owned, queued, not cancelled, queued at its admission
-- time, and its execution digest is the digest of the execution revision it pins; it has exactly
-- one Attempt, number 1, claimed, remote_worker, created at the admission time, with every
-- worker/session/lease/offer/callback/start/result/error field still NULL; and exactly two events,
-- run.created (seq 1) and run.queued (seq 2), at the admission time. A Run the worker protocol
-- holds is not a candidate either: its newest Attempt leased to a session (dispatching or running,
-- matching the Run, with the whole fence), or claimed again after a requeue (queued, a lease
-- version) or for a retry (retry_wait, Attempt 2 or later), every earlier Attempt ended; the
-- replicas' expiry and the workers own those. Anything else is a recovery candidate (fail closed).
SELECT r.run_id::text,
       coalesce(((r.state IN ('dispatching', 'running') AND a.state = r.state
                  AND a.session_id IS NOT NULL AND a.session_generation IS NOT NULL
                  AND a.lease_token_hash IS NOT NULL AND a.lease_expires_at_ms IS NOT NULL)
                 OR (r.state = 'queued' AND a.state = 'claimed' AND a.lease_version > 0)
                 OR (r.state = 'retry_wait' AND a.state = 'claimed' AND a.attempt_no > 1))
                AND NOT EXISTS (SELECT 1 FROM qinglong.attempts o
                                WHERE o.run_id = r.run_id AND o.attempt_id <> a.attempt_id
                                  AND o.state IN ('claimed', 'dispatching', 'running')),
                false) AS worker_protocol,
       coalesce(r.owned_by = 'runtime'
                AND r.state = 'queued'
                AND NOT r.cancelled
                AND r.queued_at_ms = r.admitted_at_ms
                AND r.execution_digest = e.content_digest
                AND a.attempt_no = 1
                AND a.state = 'claimed'
                AND a.executor = 'remote_worker'
                AND a.created_at_ms = r.admitted_at_ms
                AND a.worker_id IS NULL AND a.session_id IS NULL
                AND a.lease_id IS NULL AND a.lease_expires_at_ms IS NULL
                AND a.offer_id IS NULL AND a.offered_at_ms IS NULL
                AND a.callback_token_digest IS NULL
                AND a.started_at_ms IS NULL AND a.finished_at_ms IS NULL
                AND a.result_json IS NULL AND a.error_code IS NULL AND a.error_message IS NULL
                AND NOT EXISTS (SELECT 1 FROM qinglong.attempts n
                                WHERE n.run_id = r.run_id AND n.attempt_id <> a.attempt_id)
                AND (SELECT count(*) = 2
                            AND count(*) FILTER (WHERE v.seq = 1 AND v.event_type = 'run.created'
                                                 AND v.at_ms = r.admitted_at_ms) = 1
                            AND count(*) FILTER (WHERE v.seq = 2 AND v.event_type = 'run.queued'
                                                 AND v.at_ms = r.admitted_at_ms) = 1
                     FROM qinglong.run_events v WHERE v.run_id = r.run_id),
                false) AS pristine
FROM qinglong.runs r
LEFT JOIN LATERAL (
    SELECT * FROM qinglong.attempts x WHERE x.run_id = r.run_id ORDER BY x.attempt_no DESC LIMIT 1
) a ON true
LEFT JOIN qinglong.execution_revisions e
  ON e.project_id = r.project_id AND e.task_id = r.task_id AND e.task_revision = r.task_revision
 AND e.executor = r.executor
WHERE r.state IN ('queued', 'dispatching', 'running', 'retry_wait')
ORDER BY r.run_id

-- name: enabled_trigger_kinds
-- Every trigger kind that enabled triggers use, with how many use it (startup tells which kinds
-- this replica has no provider for: it never claims those triggers).
SELECT kind, count(*) AS triggers FROM qinglong.triggers WHERE enabled GROUP BY kind ORDER BY kind
