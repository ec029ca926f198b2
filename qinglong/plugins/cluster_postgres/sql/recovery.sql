-- name: scan_in_flight_runs
-- Lists every in-flight Run (queued, dispatching, running) and whether it is pristine: the Run is
-- runtime-owned, queued, not cancelled, has queued_at_ms, and has exactly one Attempt, number 1,
-- claimed, remote_worker, with every worker/session/lease/offer/callback/start/result/error field
-- still NULL, as admission left it. Anything else is a recovery candidate (fail closed).
SELECT r.run_id::text,
       coalesce(r.owned_by = 'runtime'
                AND r.state = 'queued'
                AND NOT r.cancelled
                AND r.queued_at_ms IS NOT NULL
                AND a.attempt_no = 1
                AND a.state = 'claimed'
                AND a.executor = 'remote_worker'
                AND a.worker_id IS NULL AND a.session_id IS NULL
                AND a.lease_id IS NULL AND a.lease_expires_at_ms IS NULL
                AND a.offer_id IS NULL AND a.offered_at_ms IS NULL
                AND a.callback_token_digest IS NULL
                AND a.started_at_ms IS NULL AND a.finished_at_ms IS NULL
                AND a.result_json IS NULL AND a.error_code IS NULL AND a.error_message IS NULL
                AND NOT EXISTS (SELECT 1 FROM qinglong.attempts n
                                WHERE n.run_id = r.run_id AND n.attempt_id <> a.attempt_id),
                false) AS pristine
FROM qinglong.runs r
LEFT JOIN LATERAL (
    SELECT * FROM qinglong.attempts x WHERE x.run_id = r.run_id ORDER BY x.attempt_no DESC LIMIT 1
) a ON true
WHERE r.state IN ('queued', 'dispatching', 'running')
ORDER BY r.run_id
