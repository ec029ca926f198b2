-- capability: 27
-- A worker's own stop request reaches the store. The local dispatcher writes its timeout (and its
-- shutdown) as the Attempt's cancel request before it signals the job; a worker acted on its own
-- and said nothing. So an Attempt whose job exited 0 before the worker's timeout fired (its output
-- still drained) had no cancel_reason on the cluster, where the local store keeps 'timeout', and a
-- shutdown after a failed exit was retried where the local side stops. worker_complete gains
-- p_cancel_reason (timeout or shutdown, the two a worker decides itself; NULL: none) and
-- p_cancel_age_ms (how long before this call the worker took it up). Under the completion's own
-- session and lease fences, and only for a completion that ends the Attempt now, the request is
-- kept as the Attempt's unless one is there already (the first stays), dated on the database clock
-- and never before the Attempt's start, with its run.cancel_requested event, before the end is
-- recorded (so the retry rule sees it, as it sees the local one). The 14-argument form stays for
-- gateways of the earlier build.

CREATE FUNCTION qinglong.worker_complete(p_worker_id text, p_session_id uuid, p_generation bigint,
                                         p_attempt_id uuid, p_lease_version bigint, p_token bytea,
                                         p_state text, p_exit_code integer, p_signal integer,
                                         p_log_bytes bigint, p_log_dropped_bytes bigint,
                                         p_reason text, p_started boolean, p_log_missing_bytes bigint,
                                         p_cancel_reason text, p_cancel_age_ms bigint)
RETURNS TABLE (result text, run_state text, log_bytes_stored bigint, next_attempt_no integer,
               next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    a qinglong.attempts%ROWTYPE;
    v_at bigint;
BEGIN
    IF (p_cancel_reason IS NULL) <> (p_cancel_age_ms IS NULL)
       OR p_cancel_reason NOT IN ('timeout', 'shutdown') OR p_cancel_age_ms < 0::bigint THEN
        RAISE EXCEPTION 'completion: expected the worker''s own stop request (timeout or shutdown) with its age >= 0, or neither'
            USING ERRCODE = 'QL003';
    END IF;
    IF p_cancel_reason IS NOT NULL THEN
        -- the fences first: a worker states this only for an Attempt leased to its session
        s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, false);
        a := qinglong._lease(s, p_attempt_id, p_lease_version, p_token, v_now, false);
        -- only where this call ends the Attempt: the replay of an ended one, or a completion
        -- still short of its log, writes nothing (a refused completion undoes it all)
        IF a.state IN ('dispatching', 'running') AND a.log_bytes = p_log_bytes AND a.cancel_reason IS NULL THEN
            v_at := greatest(v_now - least(p_cancel_age_ms, v_now),
                             coalesce(a.started_at_ms, a.dispatched_at_ms, v_now));
            UPDATE qinglong.attempts x SET cancel_reason = p_cancel_reason, cancel_requested_at_ms = v_at
            WHERE x.attempt_id = p_attempt_id;
            PERFORM qinglong._event(a.run_id, 'run.cancel_requested', v_at);
        END IF;
    END IF;
    RETURN QUERY
    SELECT c.result, c.run_state, c.log_bytes_stored, c.next_attempt_no, c.next_not_before_ms
    FROM qinglong.worker_complete(p_worker_id, p_session_id, p_generation, p_attempt_id, p_lease_version,
                                  p_token, p_state, p_exit_code, p_signal, p_log_bytes, p_log_dropped_bytes,
                                  p_reason, p_started, p_log_missing_bytes) AS c;
END $$;

REVOKE ALL ON FUNCTION qinglong.worker_complete(text, uuid, bigint, uuid, bigint, bytea, text, integer, integer,
                                                bigint, bigint, text, boolean, bigint, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.worker_complete(text, uuid, bigint, uuid, bigint, bytea, text, integer, integer,
                                                   bigint, bigint, text, boolean, bigint, text, bigint) TO {{gateway}};
