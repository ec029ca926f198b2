-- capability: 13
-- Completion does not wait on log shipping. A database that refuses log appends (a full disk)
-- kept a finished job's Run running, its lease renewed, for up to the task's timeout while the
-- worker tried the same chunk again. worker_complete gains p_log_missing_bytes: the worker
-- completes with the bytes the store holds (p_log_bytes, checked as before) and says how many
-- bytes of the job's log it could not ship; they are kept as attempts.log_tail_missing_bytes,
-- so the stored log is shown as an incomplete prefix. The 13-argument form stays for workers
-- of the earlier release.

CREATE FUNCTION qinglong.worker_complete(p_worker_id text, p_session_id uuid, p_generation bigint,
                                         p_attempt_id uuid, p_lease_version bigint, p_token bytea,
                                         p_state text, p_exit_code integer, p_signal integer,
                                         p_log_bytes bigint, p_log_dropped_bytes bigint,
                                         p_reason text, p_started boolean, p_log_missing_bytes bigint)
RETURNS TABLE (result text, run_state text, log_bytes_stored bigint, next_attempt_no integer,
               next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    IF p_log_missing_bytes IS NULL OR p_log_missing_bytes < 0::bigint THEN
        RAISE EXCEPTION 'completion: expected missing log bytes >= 0' USING ERRCODE = 'QL003';
    END IF;
    SELECT * INTO STRICT c
    FROM qinglong.worker_complete(p_worker_id, p_session_id, p_generation, p_attempt_id, p_lease_version,
                                  p_token, p_state, p_exit_code, p_signal, p_log_bytes, p_log_dropped_bytes,
                                  p_reason, p_started) AS x;
    IF c.result = 'accepted' AND p_log_missing_bytes > 0::bigint THEN
        UPDATE qinglong.attempts a SET log_tail_missing_bytes = p_log_missing_bytes
        WHERE a.attempt_id = p_attempt_id;
    END IF;
    RETURN QUERY SELECT c.result, c.run_state, c.log_bytes_stored, c.next_attempt_no, c.next_not_before_ms;
END $$;

REVOKE ALL ON FUNCTION qinglong.worker_complete(text, uuid, bigint, uuid, bigint, bytea, text, integer, integer,
                                                bigint, bigint, text, boolean, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.worker_complete(text, uuid, bigint, uuid, bigint, bytea, text, integer, integer,
                                                   bigint, bigint, text, boolean, bigint) TO {{worker_ingress}};
