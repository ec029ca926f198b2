-- capability: 25
-- A Run waiting for its retry is not finished. A late completion (0014) may end an Attempt that
-- the expiry had ended `lost`, on a Run that was then finished (a non-idempotent Run is not
-- retried after a lost execution); when the real outcome is one the task's policy retries, the
-- Run waits for its next Attempt again, and its finished_at_ms must be cleared with it (else
-- runs_finished_check refuses the late completion on every try and the outcome is never
-- recorded). Same body as 0007's but for that one column.

CREATE OR REPLACE FUNCTION qinglong._end_attempt(
    p_attempt_id uuid, p_state text, p_exit_code integer, p_signal integer, p_log_bytes bigint,
    p_log_dropped_bytes bigint, p_reason text, p_now bigint, p_next_attempt_no integer,
    p_not_before_ms bigint, p_stop_words text,
    OUT run_state text, OUT next_attempt_no integer, OUT next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a qinglong.attempts%ROWTYPE;
    v_status text;
    v_reason text;
BEGIN
    SELECT * INTO STRICT a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id;
    v_status := CASE WHEN p_exit_code IS NOT NULL THEN qinglong._reason('status_exit', ARRAY[p_exit_code::text])
                     WHEN p_signal IS NOT NULL THEN qinglong._reason('status_signal', ARRAY[p_signal::text]) END;
    UPDATE qinglong.attempts x
    SET state = p_state, finished_at_ms = greatest(p_now, coalesce(x.started_at_ms, p_now)),
        exit_code = p_exit_code, signal = p_signal,
        log_bytes = coalesce(p_log_bytes, x.log_bytes),
        log_dropped_bytes = coalesce(p_log_dropped_bytes, x.log_dropped_bytes),
        reason = p_reason, lease_expires_at_ms = NULL
    WHERE x.attempt_id = p_attempt_id;
    IF p_next_attempt_no IS NOT NULL THEN
        INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor, created_at_ms,
                                       not_before_ms)
        VALUES (pg_catalog.gen_random_uuid(), a.run_id, p_next_attempt_no, 'claimed', a.executor, p_now,
                p_not_before_ms);
        v_reason := qinglong._reason('retry_scheduled', ARRAY[a.attempt_no::text, p_state,
                                     coalesce(p_reason, v_status, p_state), p_next_attempt_no::text,
                                     qinglong._utc(p_not_before_ms)]);
        UPDATE qinglong.runs r SET state = 'retry_wait', reason = v_reason, finished_at_ms = NULL
        WHERE r.run_id = a.run_id;
        PERFORM qinglong._event(a.run_id, 'run.retry_scheduled', p_now);
        run_state := 'retry_wait';
        next_attempt_no := p_next_attempt_no;
        next_not_before_ms := p_not_before_ms;
        RETURN;
    END IF;
    IF p_state <> 'succeeded' THEN
        v_reason := pg_catalog.concat_ws('; ', p_reason, v_status, p_stop_words);
        IF v_reason = '' THEN
            v_reason := p_state;
        END IF;
    END IF;
    UPDATE qinglong.runs r
    SET state = p_state, finished_at_ms = p_now, reason = v_reason,
        cancelled = (p_state = 'cancelled')
    WHERE r.run_id = a.run_id;
    PERFORM qinglong._event(a.run_id, 'run.finished', p_now);
    run_state := p_state;
END $$;
