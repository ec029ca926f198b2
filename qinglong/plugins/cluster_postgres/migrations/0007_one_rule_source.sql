-- capability: 5
-- One source for the rules the worker functions repeat. Every reason string comes from
-- qinglong._reason, generated from qinglong/contracts/reasons.py (reasons.sql_reason_function;
-- a test compares the database's words with the table's for every key). Expiry is decided by the
-- control plane in Python through the contracts (control.py): expire_attempts is replaced by
-- expire_attempt, which only checks the Attempt's fence and state before it applies the given
-- decision. _finish_attempt keeps the SQL retry decision for the worker's own calls, which must
-- decide inside the database; _end_attempt applies a decision, whoever made it.

-- generated: reasons.sql_reason_function() (do not edit by hand)
CREATE OR REPLACE FUNCTION qinglong._reason(p_key text, p_args text[] DEFAULT '{}')
RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer := coalesce(pg_catalog.array_length(p_args, 1), 0);
    v_text text;
BEGIN
    v_text := CASE p_key
        WHEN 'retry_succeeded' THEN
            CASE WHEN v_count = 0 THEN 'the process exited 0' END
        WHEN 'retry_cancelled' THEN
            CASE WHEN v_count = 0 THEN 'cancelled runs are not retried' END
        WHEN 'retry_not_started' THEN
            CASE WHEN v_count = 0 THEN 'the process could not be started' END
        WHEN 'retry_none_configured' THEN
            CASE WHEN v_count = 0 THEN 'no retry configured' END
        WHEN 'retry_attempts_used' THEN
            CASE WHEN v_count = 1 THEN 'all ' || p_args[1] || ' attempts used' END
        WHEN 'retry_lost_not_idempotent' THEN
            CASE WHEN v_count = 0 THEN 'a lost attempt may have run to the end; retried only for an idempotent task' END
        WHEN 'retry_timeout_not_retried' THEN
            CASE WHEN v_count = 0 THEN 'timeouts are not retried (retry.on_timeout = false)' END
        WHEN 'retry_exit_not_listed' THEN
            CASE WHEN v_count = 1 THEN 'exit status ' || p_args[1] || ' is not in retry.exit_codes' END
        WHEN 'retry_exit_by_signal' THEN
            CASE WHEN v_count = 0 THEN 'by signal' END
        WHEN 'overlap_max_running' THEN
            CASE WHEN v_count = 2 THEN p_args[1] || ' of this task running (concurrency.max_running = ' || p_args[2] || ')' END
        WHEN 'overlap_forbid' THEN
            CASE WHEN v_count = 1 THEN 'skipped: concurrency ''forbid'' and run ' || p_args[1] || ' of this task is still running' END
        WHEN 'overlap_replace_older' THEN
            CASE WHEN v_count = 0 THEN 'concurrency ''replace'': an older run of this task starts first' END
        WHEN 'overlap_replacing' THEN
            CASE WHEN v_count = 0 THEN 'replacing the running run of this task' END
        WHEN 'overlap_replace_waiting' THEN
            CASE WHEN v_count = 1 THEN 'concurrency ''replace'': waiting for the replaced run ' || p_args[1] || ' to end' END
        WHEN 'overlap_queue' THEN
            CASE WHEN v_count = 0 THEN 'concurrency ''queue'': waiting for the earlier run' END
        WHEN 'cancel_timeout' THEN
            CASE WHEN v_count = 0 THEN 'the timeout expired' END
        WHEN 'cancel_operator' THEN
            CASE WHEN v_count = 0 THEN 'cancelled by an operator' END
        WHEN 'cancel_replaced' THEN
            CASE WHEN v_count = 0 THEN 'replaced by a newer run of the task' END
        WHEN 'cancel_shutdown' THEN
            CASE WHEN v_count = 0 THEN 'stopped with the control plane' END
        WHEN 'cancelled_before_start' THEN
            CASE WHEN v_count = 1 THEN p_args[1] || ' before the process started' END
        WHEN 'spec_missing' THEN
            CASE WHEN v_count = 0 THEN 'the task revision was published without an execution spec for workers; publish the task again' END
        WHEN 'spec_no_command' THEN
            CASE WHEN v_count = 0 THEN 'the task has no command' END
        WHEN 'spec_invalid' THEN
            CASE WHEN v_count = 0 THEN 'invalid execution spec: the stored spec lacks a key or has a key of the wrong type; publish the task again' END
        WHEN 'lease_expired' THEN
            CASE WHEN v_count = 2 THEN 'the lease of worker ' || p_args[1] || ' (session generation ' || p_args[2] || ') expired while the job was running' END
        WHEN 'deadline_unreported' THEN
            CASE WHEN v_count = 0 THEN 'the timeout expired and the worker did not report the end of the job' END
        WHEN 'session_closed' THEN
            CASE WHEN v_count = 0 THEN 'the worker closed its session while the job was running' END
        WHEN 'status_exit' THEN
            CASE WHEN v_count = 1 THEN 'exit status ' || p_args[1] END
        WHEN 'status_signal' THEN
            CASE WHEN v_count = 1 THEN 'killed by signal ' || p_args[1] END
        WHEN 'retry_scheduled' THEN
            CASE WHEN v_count = 5 THEN 'attempt ' || p_args[1] || ' ' || p_args[2] || ' (' || p_args[3] || '); attempt ' || p_args[4] || ' not before ' || p_args[5] END
    END;
    IF v_text IS NULL THEN
        RAISE EXCEPTION 'reason %: unknown key, or a missing or NULL value', p_key
            USING ERRCODE = 'QL003';
    END IF;
    RETURN v_text;
END $$;

REVOKE ALL ON FUNCTION qinglong._reason(text, text[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION qinglong._cancel_words(p_reason text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE WHEN p_reason IN ('timeout', 'operator', 'replaced', 'shutdown')
                THEN qinglong._reason('cancel_' || p_reason) END;
END $$;

-- contracts.stored_spec.stored_spec_problem (a property test holds the two equal)
CREATE OR REPLACE FUNCTION qinglong._spec_problem(p_spec jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_spec IS NULL THEN
        RETURN qinglong._reason('spec_missing');
    END IF;
    IF pg_catalog.jsonb_typeof(p_spec) = 'null' THEN
        RETURN qinglong._reason('spec_no_command');
    END IF;
    IF pg_catalog.jsonb_typeof(p_spec) IS DISTINCT FROM 'object'
       OR pg_catalog.jsonb_typeof(p_spec -> 'command') IS DISTINCT FROM 'array'
       OR pg_catalog.jsonb_typeof(p_spec -> 'timeout_ms') IS DISTINCT FROM 'number'
       OR pg_catalog.jsonb_typeof(p_spec -> 'log_limit_bytes') IS DISTINCT FROM 'number'
       OR pg_catalog.jsonb_typeof(p_spec -> 'idempotent') IS DISTINCT FROM 'boolean'
       OR (p_spec -> 'concurrency' ->> 'mode') IS NULL
       OR (p_spec -> 'concurrency' ->> 'mode') NOT IN ('allow', 'forbid', 'replace', 'queue')
       OR pg_catalog.jsonb_typeof(p_spec -> 'concurrency' -> 'max_running') NOT IN ('number', 'null')
       OR pg_catalog.jsonb_typeof(p_spec -> 'retry' -> 'max_attempts') IS DISTINCT FROM 'number'
       OR pg_catalog.jsonb_typeof(p_spec -> 'retry' -> 'initial_backoff_ms') IS DISTINCT FROM 'number'
       OR pg_catalog.jsonb_typeof(p_spec -> 'retry' -> 'max_backoff_ms') IS DISTINCT FROM 'number'
       OR pg_catalog.jsonb_typeof(p_spec -> 'retry' -> 'jitter') IS DISTINCT FROM 'number'
       OR pg_catalog.jsonb_typeof(p_spec -> 'retry' -> 'on_timeout') IS DISTINCT FROM 'boolean'
       OR pg_catalog.jsonb_typeof(p_spec -> 'retry' -> 'exit_codes') NOT IN ('array', 'null')
       OR pg_catalog.jsonb_typeof(p_spec -> 'labels') NOT IN ('array', 'null') THEN
        RETURN qinglong._reason('spec_invalid');
    END IF;
    RETURN NULL;
END $$;

-- contracts.execution.retry_decision (a property test holds the two equal)
CREATE OR REPLACE FUNCTION qinglong._retry_decision(
    p_spec jsonb, p_attempt_no integer, p_state text, p_exit_code integer, p_started boolean,
    p_now bigint,
    OUT next_attempt_no integer, OUT not_before_ms bigint, OUT stop_state text, OUT stop_reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_retry jsonb := p_spec -> 'retry';
    v_max integer;
    v_delay numeric;
    v_jitter double precision;
BEGIN
    IF p_state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost') THEN
        RAISE EXCEPTION 'a retry decision needs an ended attempt, not one %', p_state
            USING ERRCODE = 'QL003';
    END IF;
    stop_state := p_state;
    IF p_state = 'succeeded' THEN
        stop_reason := qinglong._reason('retry_succeeded');
        RETURN;
    ELSIF p_state = 'cancelled' THEN
        stop_reason := qinglong._reason('retry_cancelled');
        RETURN;
    ELSIF NOT p_started THEN
        stop_reason := qinglong._reason('retry_not_started');
        RETURN;
    END IF;
    v_max := coalesce((v_retry ->> 'max_attempts')::integer, 1);
    IF p_attempt_no >= v_max THEN
        stop_reason := CASE WHEN v_max = 1 THEN qinglong._reason('retry_none_configured')
                            ELSE qinglong._reason('retry_attempts_used', ARRAY[v_max::text]) END;
        RETURN;
    ELSIF p_state = 'lost' AND NOT (p_spec ->> 'idempotent')::boolean THEN
        stop_reason := qinglong._reason('retry_lost_not_idempotent');
        RETURN;
    ELSIF p_state = 'timed_out' AND NOT (v_retry ->> 'on_timeout')::boolean THEN
        stop_reason := qinglong._reason('retry_timeout_not_retried');
        RETURN;
    ELSIF p_state = 'failed' AND pg_catalog.jsonb_typeof(v_retry -> 'exit_codes') = 'array'
          AND (p_exit_code IS NULL OR NOT (v_retry -> 'exit_codes') @> pg_catalog.to_jsonb(p_exit_code)) THEN
        stop_reason := qinglong._reason('retry_exit_not_listed', ARRAY[
                           coalesce(p_exit_code::text, qinglong._reason('retry_exit_by_signal'))]);
        RETURN;
    END IF;
    stop_state := NULL;
    v_delay := least((v_retry ->> 'max_backoff_ms')::numeric,
                     (v_retry ->> 'initial_backoff_ms')::numeric
                     * pg_catalog.power(2::numeric, least(greatest(p_attempt_no - 1, 0), 62)::numeric));
    v_jitter := least((v_retry ->> 'jitter')::double precision, 1::double precision);
    IF v_jitter > 0::double precision AND v_delay > 0::numeric THEN
        v_delay := v_delay - pg_catalog.floor(pg_catalog.random() * v_delay::double precision * v_jitter)::numeric;
    END IF;
    next_attempt_no := p_attempt_no + 1;
    not_before_ms := p_now + greatest(v_delay, 0::numeric)::bigint;
END $$;

-- End an Attempt that is not ended yet with a decision already made: Attempt p_next_attempt_no
-- 'claimed' not before p_not_before_ms (Run retry_wait), or the Run's terminal state with its
-- reason (p_stop_words: the stop's words when the run reason shows them, else NULL), in the edge
-- store's words. The caller holds the Run's and the Attempt's row locks.
CREATE FUNCTION qinglong._end_attempt(
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
        UPDATE qinglong.runs r SET state = 'retry_wait', reason = v_reason WHERE r.run_id = a.run_id;
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

-- Decide in SQL (the worker's calls) and end: the retry decision, suppressed by a durable cancel
-- request other than a timeout; the stop's words shown only when the policy allowed retries.
CREATE OR REPLACE FUNCTION qinglong._finish_attempt(
    p_attempt_id uuid, p_state text, p_exit_code integer, p_signal integer, p_log_bytes bigint,
    p_log_dropped_bytes bigint, p_reason text, p_started boolean, p_now bigint,
    OUT run_state text, OUT next_attempt_no integer, OUT next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a qinglong.attempts%ROWTYPE;
    v_spec jsonb;
    v_next integer;
    v_not_before bigint;
    v_stop text;
    d record;
BEGIN
    SELECT * INTO STRICT a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id;
    v_spec := qinglong._run_spec(a.run_id);
    IF qinglong._spec_problem(v_spec) IS NOT NULL THEN
        v_spec := NULL;  -- no policy to read: never retried
    END IF;
    SELECT x.next_attempt_no, x.not_before_ms, x.stop_reason INTO v_next, v_not_before, v_stop
    FROM qinglong._retry_decision(v_spec, a.attempt_no, p_state, p_exit_code, p_started, p_now) AS x;
    IF v_next IS NOT NULL AND a.cancel_reason IS NOT NULL AND a.cancel_reason <> 'timeout' THEN
        v_next := NULL;  -- cancelled on purpose: no successor (and no stop reason either)
    END IF;
    IF coalesce((v_spec -> 'retry' ->> 'max_attempts')::integer, 1) <= 1 THEN
        v_stop := NULL;
    END IF;
    d := qinglong._end_attempt(p_attempt_id, p_state, p_exit_code, p_signal, p_log_bytes,
                               p_log_dropped_bytes, p_reason, p_now, v_next, v_not_before, v_stop);
    run_state := d.run_state;
    next_attempt_no := d.next_attempt_no;
    next_not_before_ms := d.next_not_before_ms;
END $$;

CREATE OR REPLACE FUNCTION qinglong._requeue(p_attempt_id uuid, p_now bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a qinglong.attempts%ROWTYPE;
BEGIN
    SELECT * INTO STRICT a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id;
    IF a.cancel_reason IS NOT NULL THEN
        PERFORM qinglong._finish_attempt(p_attempt_id, 'cancelled', NULL, NULL, NULL, NULL,
                                         qinglong._reason('cancelled_before_start',
                                                          ARRAY[qinglong._cancel_words(a.cancel_reason)]),
                                         false, p_now);
        RETURN 'cancelled';
    END IF;
    UPDATE qinglong.attempts x
    SET state = 'claimed', worker_id = NULL, session_id = NULL, session_generation = NULL,
        lease_token_hash = NULL, lease_expires_at_ms = NULL, dispatched_at_ms = NULL,
        timeout_ms = NULL
    WHERE x.attempt_id = p_attempt_id;
    UPDATE qinglong.runs r SET state = 'queued' WHERE r.run_id = a.run_id;
    PERFORM qinglong._event(a.run_id, 'run.requeued', p_now);
    RETURN 'requeued';
END $$;

-- contracts.execution.overlap_decision (a property test holds the two equal)
CREATE OR REPLACE FUNCTION qinglong._overlap(p_spec jsonb, p_project_id text, p_task_id text, p_run_id uuid,
                                  p_scheduled_for_ms bigint, p_admitted_at_ms bigint, p_now bigint,
                                  OUT action text, OUT reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_mode text := p_spec -> 'concurrency' ->> 'mode';
    v_max integer := (p_spec -> 'concurrency' ->> 'max_running')::integer;
    v_active integer;
    v_first uuid;
    v_ahead boolean;
    v_victim record;
BEGIN
    SELECT count(*)::integer, (array_agg(r.run_id ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id))[1]
    INTO v_active, v_first
    FROM qinglong.runs r
    WHERE r.project_id = p_project_id AND r.task_id = p_task_id AND r.state IN ('dispatching', 'running');
    action := 'start';
    IF v_mode = 'allow' THEN
        IF v_max IS NOT NULL AND v_active >= v_max THEN
            action := 'wait';
            reason := qinglong._reason('overlap_max_running', ARRAY[v_active::text, v_max::text]);
        END IF;
        RETURN;
    ELSIF v_mode = 'forbid' THEN
        IF v_active > 0 THEN
            action := 'skip';
            reason := qinglong._reason('overlap_forbid', ARRAY[v_first::text]);
        END IF;
        RETURN;
    END IF;
    -- queue and replace keep the dispatch order: a due, waiting Run of the task ahead goes first
    SELECT EXISTS (
        SELECT 1 FROM qinglong.runs r JOIN qinglong.attempts a ON a.run_id = r.run_id AND a.state = 'claimed'
        WHERE r.project_id = p_project_id AND r.task_id = p_task_id AND r.state IN ('queued', 'retry_wait')
          AND coalesce(a.not_before_ms, 0::bigint) <= p_now AND r.run_id <> p_run_id
          AND (r.scheduled_for_ms, r.admitted_at_ms, r.run_id) < (p_scheduled_for_ms, p_admitted_at_ms, p_run_id))
    INTO v_ahead;
    IF v_mode = 'queue' THEN
        IF v_active > 0 OR v_ahead THEN
            action := 'wait';
            reason := qinglong._reason('overlap_queue');
        END IF;
        RETURN;
    END IF;
    -- replace
    IF v_ahead THEN
        action := 'wait';
        reason := qinglong._reason('overlap_replace_older');
        RETURN;
    ELSIF v_active = 0 THEN
        RETURN;
    END IF;
    action := 'wait';
    reason := qinglong._reason('overlap_replace_waiting', ARRAY[v_first::text]);
    FOR v_victim IN
        SELECT r.run_id, a.attempt_id FROM qinglong.runs r
        JOIN qinglong.attempts a ON a.run_id = r.run_id AND a.state IN ('dispatching', 'running')
        WHERE r.project_id = p_project_id AND r.task_id = p_task_id AND r.state IN ('dispatching', 'running')
          AND a.cancel_reason IS NULL
        ORDER BY r.run_id
        FOR UPDATE OF r, a SKIP LOCKED
    LOOP
        UPDATE qinglong.attempts a SET cancel_reason = 'replaced', cancel_requested_at_ms = p_now
        WHERE a.attempt_id = v_victim.attempt_id;
        PERFORM qinglong._event(v_victim.run_id, 'run.cancel_requested', p_now);
        action := 'replace';
        reason := qinglong._reason('overlap_replacing');
    END LOOP;
END $$;


CREATE OR REPLACE FUNCTION qinglong.worker_close_session(p_worker_id text, p_session_id uuid, p_generation bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    c record;
    v_state text;
BEGIN
    s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, true);
    UPDATE qinglong.worker_sessions w SET closed_at_ms = v_now WHERE w.worker_id = p_worker_id;
    FOR c IN
        SELECT a.run_id, a.attempt_id FROM qinglong.attempts a
        WHERE a.session_id = s.session_id AND a.session_generation = s.generation
          AND a.state IN ('dispatching', 'running')
        ORDER BY a.run_id
    LOOP
        -- the Run, then the Attempt, as every other writer locks them; then look again
        PERFORM 1 FROM qinglong.runs r WHERE r.run_id = c.run_id FOR UPDATE;
        SELECT x.state INTO v_state FROM qinglong.attempts x
        WHERE x.attempt_id = c.attempt_id AND x.session_id = s.session_id
          AND x.session_generation = s.generation AND x.state IN ('dispatching', 'running')
        FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        IF v_state = 'dispatching' THEN
            PERFORM qinglong._requeue(c.attempt_id, v_now);
        ELSE
            PERFORM qinglong._finish_attempt(c.attempt_id, 'lost', NULL, NULL, NULL, NULL,
                                             qinglong._reason('session_closed'),
                                             true, v_now);
        END IF;
    END LOOP;
END $$;


-- The control plane's expiry of one Attempt, decided in Python through the contracts
-- (control.py): checks only that the Attempt is in the state the decision was made for, under
-- the same lease version, and that its lease (for 'timed_out': its deadline plus its session's
-- lease) ran out in database time; then applies the decision. Returns the action applied, or
-- NULL, writing nothing, when the Attempt moved on or another replica holds it.
CREATE FUNCTION qinglong.expire_attempt(p_attempt_id uuid, p_lease_version bigint, p_action text,
                                        p_reason text, p_next_attempt_no integer,
                                        p_retry_after_ms bigint, p_stop_words text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    a qinglong.attempts%ROWTYPE;
    v_session_lease bigint;
    v_due boolean;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('requeued', 'cancelled', 'lost', 'timed_out')
       OR (p_action = 'requeued') = (p_reason IS NOT NULL)
       OR (p_next_attempt_no IS NULL) <> (p_retry_after_ms IS NULL) OR p_retry_after_ms < 0::bigint
       OR (p_action IN ('requeued', 'cancelled') AND p_next_attempt_no IS NOT NULL) THEN
        RAISE EXCEPTION 'expiry: expected requeued (no reason), or cancelled, lost or timed_out with a reason; a successor (never after a requeue or a cancel) with its delay >= 0, or neither'
            USING ERRCODE = 'QL003';
    END IF;
    PERFORM 1 FROM qinglong.runs r
    WHERE r.run_id = (SELECT x.run_id FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id)
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR a.lease_version IS DISTINCT FROM p_lease_version THEN
        RETURN NULL;
    END IF;
    SELECT w.lease_ms INTO v_session_lease FROM qinglong.worker_sessions w WHERE w.worker_id = a.worker_id;
    v_due := CASE p_action
             WHEN 'requeued' THEN a.state = 'dispatching' AND a.lease_expires_at_ms <= v_now
                                  AND a.cancel_reason IS NULL
             WHEN 'cancelled' THEN a.state = 'dispatching' AND a.lease_expires_at_ms <= v_now
                                   AND a.cancel_reason IS NOT NULL
             WHEN 'lost' THEN a.state = 'running' AND a.lease_expires_at_ms <= v_now
             ELSE a.state = 'running'
                  AND a.deadline_ms + coalesce(v_session_lease, 600000::bigint) <= v_now END;
    IF NOT v_due THEN
        RETURN NULL;
    END IF;
    IF p_next_attempt_no IS DISTINCT FROM NULL AND p_next_attempt_no <> a.attempt_no + 1 THEN
        RAISE EXCEPTION 'expiry: attempt % follows attempt %, not %', p_next_attempt_no, a.attempt_no,
            p_next_attempt_no - 1 USING ERRCODE = 'QL003';
    END IF;
    IF p_action = 'requeued' THEN
        RETURN qinglong._requeue(p_attempt_id, v_now);
    ELSIF p_action = 'timed_out' THEN
        UPDATE qinglong.attempts x SET cancel_reason = coalesce(x.cancel_reason, 'timeout'),
               cancel_requested_at_ms = coalesce(x.cancel_requested_at_ms, v_now)
        WHERE x.attempt_id = p_attempt_id;
    END IF;
    PERFORM qinglong._end_attempt(p_attempt_id, p_action, NULL, NULL, NULL, NULL, p_reason, v_now,
                                  p_next_attempt_no, v_now + p_retry_after_ms, p_stop_words);
    RETURN p_action;
END $$;

DROP FUNCTION qinglong.expire_attempts(integer);

REVOKE ALL ON FUNCTION
    qinglong._end_attempt(uuid, text, integer, integer, bigint, bigint, text, bigint, integer, bigint, text),
    qinglong.expire_attempt(uuid, bigint, text, text, integer, bigint, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.expire_attempt(uuid, bigint, text, text, integer, bigint, text)
TO {{runtime}};
