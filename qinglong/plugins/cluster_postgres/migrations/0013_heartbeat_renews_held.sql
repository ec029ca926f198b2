-- capability: 11
-- A heartbeat renews only the Attempts the worker names (the ones it holds), no longer every
-- active Attempt of the session. An Attempt the session holds but the worker does not know of
-- (a claim whose reply was lost, a job the worker gave up) was renewed for as long as the worker
-- lived, so its Run stayed dispatching or running until the worker stopped; now its lease runs
-- out and the control plane's expiry ends it (requeued if it never started, lost otherwise).
-- A worker names every job it holds, the ones reporting their outcome included.

CREATE OR REPLACE FUNCTION qinglong.worker_heartbeat(p_worker_id text, p_session_id uuid, p_generation bigint,
                                          p_running uuid[])
RETURNS TABLE (lease_expires_at_ms bigint, db_now_ms bigint, stop_attempt_ids uuid[], stop_reasons text[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    v_expires bigint;
BEGIN
    s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, true);
    IF coalesce(pg_catalog.array_length(p_running, 1), 0) > 1024 THEN
        RAISE EXCEPTION 'running: expected at most 1024 attempt ids' USING ERRCODE = 'QL003';
    END IF;
    v_expires := v_now + s.lease_ms;
    UPDATE qinglong.worker_sessions w SET heartbeat_at_ms = v_now, lease_expires_at_ms = v_expires
    WHERE w.worker_id = p_worker_id;
    UPDATE qinglong.attempts a SET lease_expires_at_ms = v_expires
    WHERE a.attempt_id = ANY (coalesce(p_running, '{}'::uuid[]))
      AND a.session_id = s.session_id AND a.session_generation = s.generation
      AND a.state IN ('dispatching', 'running') AND a.lease_expires_at_ms > v_now;
    RETURN QUERY
    SELECT v_expires, v_now,
           coalesce(array_agg(i.id ORDER BY i.ord), '{}'::uuid[]),
           coalesce(array_agg(i.why ORDER BY i.ord), '{}'::text[])
    FROM (SELECT u.id, u.ord,
                 CASE WHEN a.attempt_id IS NULL THEN 'lease_lost' ELSE a.cancel_reason END AS why
          FROM pg_catalog.unnest(coalesce(p_running, '{}'::uuid[])) WITH ORDINALITY AS u (id, ord)
          LEFT JOIN qinglong.attempts a
            ON a.attempt_id = u.id AND a.session_id = s.session_id
           AND a.session_generation = s.generation AND a.state IN ('dispatching', 'running')
           AND a.lease_expires_at_ms = v_expires) AS i
    WHERE i.why IS NOT NULL;
END $$;
