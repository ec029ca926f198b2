-- capability: 12
-- An outcome that exists is recorded. A worker that was frozen, cut off or killed while its job
-- ended on its own holds the job's real outcome, and the Attempt's lease token proves the outcome
-- is this Attempt's: the database keeps its SHA-256 after the lease ends. worker_complete_late
-- takes such a completion without a live session: accepted while no other Attempt of the Run
-- has been leased (one waiting for its retry is withdrawn), and recorded as late
-- (attempts.completed_late_at_ms, event run.completed_late). The Attempt may still be leased
-- (its lease ran out and no replica ended it yet) or already ended `lost` by the expiry or a
-- closed session; any other end stands and the call is refused (QL002).
--
-- attempts.log_tail_missing_bytes: bytes of the job's log the store never received (the worker
-- could not ship them); the stored log is then a prefix, marked incomplete.

ALTER TABLE qinglong.attempts
    ADD COLUMN completed_late_at_ms bigint,
    ADD COLUMN log_tail_missing_bytes bigint NOT NULL DEFAULT 0 CHECK (log_tail_missing_bytes >= 0);

CREATE FUNCTION qinglong.worker_complete_late(p_worker_id text, p_attempt_id uuid, p_lease_version bigint,
                                              p_token bytea, p_state text, p_exit_code integer,
                                              p_signal integer, p_log_bytes bigint,
                                              p_log_dropped_bytes bigint, p_reason text)
RETURNS TABLE (result text, run_state text, log_bytes_stored bigint, next_attempt_no integer,
               next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    a qinglong.attempts%ROWTYPE;
    d record;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled')
       OR p_exit_code NOT BETWEEN 0 AND 255 OR p_signal NOT BETWEEN 1 AND 128
       OR p_log_bytes IS NULL OR p_log_bytes < 0::bigint
       OR p_log_dropped_bytes IS NULL OR p_log_dropped_bytes < 0::bigint
       OR pg_catalog.char_length(p_reason) > 2000 OR p_token IS NULL THEN
        RAISE EXCEPTION 'late completion: expected an ended state other than lost, exit code 0-255, signal 1-128, log sizes >= 0, a reason of at most 2000 characters and the token'
            USING ERRCODE = 'QL003';
    END IF;
    PERFORM 1 FROM qinglong.runs r
    WHERE r.run_id = (SELECT x.run_id FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id)
    FOR UPDATE;
    SELECT * INTO a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id FOR UPDATE;
    IF NOT FOUND OR a.worker_id IS DISTINCT FROM p_worker_id
       OR a.lease_version IS DISTINCT FROM p_lease_version
       OR a.lease_token_hash IS DISTINCT FROM pg_catalog.sha256(p_token) OR a.started_at_ms IS NULL THEN
        RAISE EXCEPTION 'lease fenced: the token does not prove a started lease of this attempt'
            USING ERRCODE = 'QL002';
    END IF;
    IF a.state = p_state AND a.exit_code IS NOT DISTINCT FROM p_exit_code
       AND a.signal IS NOT DISTINCT FROM p_signal THEN
        -- the replay of an accepted completion (in time or late)
        RETURN QUERY
        SELECT 'already_done'::text, r.state, a.log_bytes, n.attempt_no, n.not_before_ms
        FROM qinglong.runs r
        LEFT JOIN qinglong.attempts n ON n.run_id = r.run_id AND n.attempt_no = a.attempt_no + 1
        WHERE r.run_id = a.run_id;
        RETURN;
    ELSIF a.state NOT IN ('dispatching', 'running', 'lost') OR a.completed_late_at_ms IS NOT NULL THEN
        RAISE EXCEPTION 'lease fenced: the attempt already ended differently (%)', a.state
            USING ERRCODE = 'QL002';
    ELSIF EXISTS (SELECT 1 FROM qinglong.attempts n
                  WHERE n.run_id = a.run_id AND n.attempt_no > a.attempt_no AND n.state <> 'claimed') THEN
        RAISE EXCEPTION 'lease fenced: another attempt of the run has started' USING ERRCODE = 'QL002';
    END IF;
    -- the retry the expiry scheduled was never leased: the real outcome decides instead
    DELETE FROM qinglong.attempts n
    WHERE n.run_id = a.run_id AND n.attempt_no > a.attempt_no AND n.state = 'claimed';
    d := qinglong._finish_attempt(p_attempt_id, p_state, p_exit_code, p_signal, a.log_bytes,
                                  p_log_dropped_bytes, p_reason, true, v_now);
    UPDATE qinglong.attempts x
    SET completed_late_at_ms = v_now,
        log_tail_missing_bytes = greatest(p_log_bytes - a.log_bytes, 0::bigint)
    WHERE x.attempt_id = p_attempt_id;
    PERFORM qinglong._event(a.run_id, 'run.completed_late', v_now);
    RETURN QUERY SELECT 'accepted'::text, d.run_state, a.log_bytes, d.next_attempt_no, d.next_not_before_ms;
END $$;

REVOKE ALL ON FUNCTION qinglong.worker_complete_late(text, uuid, bigint, bytea, text, integer, integer,
                                                     bigint, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.worker_complete_late(text, uuid, bigint, bytea, text, integer, integer,
                                                        bigint, bigint, text) TO {{worker_ingress}};
