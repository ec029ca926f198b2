-- capability: 28
-- The Attempt's end is the job's own exit, on the cluster as on the local side. worker_complete
-- recorded the database time at which the completion arrived, which includes the drain of the
-- job's output after its exit (a job leaving a child that holds its output open: seconds), where
-- the local dispatcher records the exit its wrapper noted. The worker's clock is neither trusted
-- nor synchronised with the database, so the worker states how long before the call the job
-- exited (p_exit_age_ms, measured on its own clock); the end is the database's now minus that
-- age, never before the Attempt's start nor after now, and the run's end event in the outbox
-- carries the duration it gives. Only a completion that ends the Attempt now writes it; the Run's
-- finish, its events and a retry's time stay on the database clock, as the local store keeps them
-- on the dispatcher's. The 16-argument form stays for gateways of the earlier build.
--
-- A late completion (0014: the worker lost its lease while reporting, or a restarted worker
-- reports an outcome it found on disk) states the same two facts: worker_complete_late gains the
-- worker's own stop request (p_cancel_reason, p_cancel_age_ms, as 0029 gave worker_complete) and
-- p_exit_age_ms. Under the late completion's own fences (the token of a started lease of this
-- Attempt, by its worker; accepted only while no other Attempt of the Run has started), and only
-- where that call ends the Attempt, the request is kept unless one is there already, dated on the
-- database clock no earlier than the start, with its run.cancel_requested event, before the end is
-- recorded (so a shutdown stops the retries), and the end is dated from the exit's age. The
-- 10-argument form stays for gateways of the earlier build.

CREATE FUNCTION qinglong.worker_complete(p_worker_id text, p_session_id uuid, p_generation bigint,
                                         p_attempt_id uuid, p_lease_version bigint, p_token bytea,
                                         p_state text, p_exit_code integer, p_signal integer,
                                         p_log_bytes bigint, p_log_dropped_bytes bigint,
                                         p_reason text, p_started boolean, p_log_missing_bytes bigint,
                                         p_cancel_reason text, p_cancel_age_ms bigint, p_exit_age_ms bigint)
RETURNS TABLE (result text, run_state text, log_bytes_stored bigint, next_attempt_no integer,
               next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    v_run uuid;
    v_seq bigint;
BEGIN
    IF p_exit_age_ms < 0::bigint THEN
        RAISE EXCEPTION 'completion: expected the age of the job''s exit >= 0, or none'
            USING ERRCODE = 'QL003';
    END IF;
    SELECT x.run_id INTO v_run FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id;
    SELECT max(o.seq) INTO v_seq FROM qinglong.event_outbox o;  -- the index's last entry
    SELECT * INTO STRICT c
    FROM qinglong.worker_complete(p_worker_id, p_session_id, p_generation, p_attempt_id, p_lease_version,
                                  p_token, p_state, p_exit_code, p_signal, p_log_bytes, p_log_dropped_bytes,
                                  p_reason, p_started, p_log_missing_bytes, p_cancel_reason,
                                  p_cancel_age_ms) AS x;
    IF c.result = 'accepted' AND p_exit_age_ms IS NOT NULL THEN
        -- accepted: this call ended the Attempt, under its fences, at finished_at_ms (its now)
        UPDATE qinglong.attempts a
        SET finished_at_ms = greatest(a.finished_at_ms - least(p_exit_age_ms, a.finished_at_ms),
                                      coalesce(a.started_at_ms, a.dispatched_at_ms, a.finished_at_ms))
        WHERE a.attempt_id = p_attempt_id;
        -- the run's end this call wrote to the outbox (the Run's row lock is held: none other)
        UPDATE qinglong.event_outbox o
        SET duration_ms = (SELECT a.finished_at_ms - a.started_at_ms FROM qinglong.attempts a
                           WHERE a.attempt_id = p_attempt_id)
        WHERE o.run_id = v_run AND o.seq > coalesce(v_seq, 0::bigint) AND o.duration_ms IS NOT NULL;
    END IF;
    RETURN QUERY SELECT c.result, c.run_state, c.log_bytes_stored, c.next_attempt_no, c.next_not_before_ms;
END $$;

REVOKE ALL ON FUNCTION qinglong.worker_complete(text, uuid, bigint, uuid, bigint, bytea, text, integer, integer,
                                                bigint, bigint, text, boolean, bigint, text, bigint,
                                                bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.worker_complete(text, uuid, bigint, uuid, bigint, bytea, text, integer, integer,
                                                   bigint, bigint, text, boolean, bigint, text, bigint,
                                                   bigint) TO {{gateway}};

CREATE FUNCTION qinglong.worker_complete_late(p_worker_id text, p_attempt_id uuid, p_lease_version bigint,
                                              p_token bytea, p_state text, p_exit_code integer,
                                              p_signal integer, p_log_bytes bigint,
                                              p_log_dropped_bytes bigint, p_reason text,
                                              p_cancel_reason text, p_cancel_age_ms bigint, p_exit_age_ms bigint)
RETURNS TABLE (result text, run_state text, log_bytes_stored bigint, next_attempt_no integer,
               next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    a qinglong.attempts%ROWTYPE;
    c record;
    v_seq bigint;
    v_at bigint;
BEGIN
    IF (p_cancel_reason IS NULL) <> (p_cancel_age_ms IS NULL)
       OR p_cancel_reason NOT IN ('timeout', 'shutdown') OR p_cancel_age_ms < 0::bigint THEN
        RAISE EXCEPTION 'late completion: expected the worker''s own stop request (timeout or shutdown) with its age >= 0, or neither'
            USING ERRCODE = 'QL003';
    END IF;
    IF p_exit_age_ms < 0::bigint THEN
        RAISE EXCEPTION 'late completion: expected the age of the job''s exit >= 0, or none'
            USING ERRCODE = 'QL003';
    END IF;
    -- the Run, then the Attempt, as the 10-argument form (and every other writer) locks them
    PERFORM 1 FROM qinglong.runs r
    WHERE r.run_id = (SELECT x.run_id FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id)
    FOR UPDATE;
    SELECT * INTO a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id FOR UPDATE;
    SELECT max(o.seq) INTO v_seq FROM qinglong.event_outbox o;  -- the index's last entry
    -- the fences first: the stop is kept only for a started lease of this Attempt, by its worker,
    -- that this call ends (not a replay, not an Attempt ended otherwise); a later Attempt of the
    -- Run that started makes the call below refuse, which undoes this too
    IF p_cancel_reason IS NOT NULL AND FOUND AND a.worker_id = p_worker_id
       AND a.lease_version = p_lease_version AND a.lease_token_hash = pg_catalog.sha256(p_token)
       AND a.started_at_ms IS NOT NULL AND a.state IN ('dispatching', 'running', 'lost')
       AND a.completed_late_at_ms IS NULL AND a.cancel_reason IS NULL
       AND NOT (a.state = p_state AND a.exit_code IS NOT DISTINCT FROM p_exit_code
                AND a.signal IS NOT DISTINCT FROM p_signal) THEN
        v_at := greatest(v_now - least(p_cancel_age_ms, v_now), a.started_at_ms);
        UPDATE qinglong.attempts x SET cancel_reason = p_cancel_reason, cancel_requested_at_ms = v_at
        WHERE x.attempt_id = p_attempt_id;
        PERFORM qinglong._event(a.run_id, 'run.cancel_requested', v_at);
    END IF;
    SELECT * INTO STRICT c
    FROM qinglong.worker_complete_late(p_worker_id, p_attempt_id, p_lease_version, p_token, p_state,
                                       p_exit_code, p_signal, p_log_bytes, p_log_dropped_bytes, p_reason) AS x;
    IF c.result = 'accepted' AND p_exit_age_ms IS NOT NULL THEN
        -- accepted: this call ended the Attempt at finished_at_ms (its now)
        UPDATE qinglong.attempts x
        SET finished_at_ms = greatest(x.finished_at_ms - least(p_exit_age_ms, x.finished_at_ms),
                                      coalesce(x.started_at_ms, x.finished_at_ms))
        WHERE x.attempt_id = p_attempt_id;
        UPDATE qinglong.event_outbox o
        SET duration_ms = (SELECT x.finished_at_ms - x.started_at_ms FROM qinglong.attempts x
                           WHERE x.attempt_id = p_attempt_id)
        WHERE o.run_id = a.run_id AND o.seq > coalesce(v_seq, 0::bigint) AND o.duration_ms IS NOT NULL;
    END IF;
    RETURN QUERY SELECT c.result, c.run_state, c.log_bytes_stored, c.next_attempt_no, c.next_not_before_ms;
END $$;

REVOKE ALL ON FUNCTION qinglong.worker_complete_late(text, uuid, bigint, bytea, text, integer, integer,
                                                     bigint, bigint, text, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.worker_complete_late(text, uuid, bigint, bytea, text, integer, integer,
                                                        bigint, bigint, text, text, bigint, bigint) TO {{gateway}};
