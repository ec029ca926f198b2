-- capability: 3
-- Workers: sessions of `qinglong worker` processes, Run leases on Attempts, shipped logs, and the
-- worker protocol as SECURITY DEFINER functions. The worker_ingress role may execute the seven
-- worker functions and nothing else; the runtime role executes the three control-plane functions
-- (expiry, cancel, log pruning) and reads sessions and logs, but never updates a Run or an Attempt
-- by itself. Every function is owned by the owner role, runs with search_path pinned to
-- pg_catalog, pg_temp, names every table qinglong.<table>, and compares values of exactly matching
-- types. Readiness (roles.py, fingerprint.py) compares each function's definition, owner, security,
-- settings and grants with the shipped fingerprint and fails closed on any difference.
--
-- Refusals raise SQLSTATE QL001 (session fenced; its DETAIL says why: session_replaced,
-- session_closed or session_expired), QL002 (lease fenced) or QL003 (bad argument);
-- a refused call changes nothing (the RAISE aborts the statement). Times are epoch ms of the
-- database clock (clock_timestamp(), as the claim and admission statements use). The events a Run
-- gets are the edge store's: run.dispatching, run.started, run.requeued, run.cancel_requested,
-- run.skipped, run.retry_scheduled and run.finished, with consecutive seq per Run (always written
-- while holding the Run's row lock). Locks are taken Run before Attempt everywhere.

-- ------------------------------------------------------------------------------------------
-- Tables and columns
-- ------------------------------------------------------------------------------------------

-- One row per worker id: its current session. Opening a session increments the generation,
-- which fences every call of the older one.
CREATE TABLE qinglong.worker_sessions (
    worker_id            text PRIMARY KEY,
    generation           bigint NOT NULL CHECK (generation >= 1),
    session_id           uuid NOT NULL UNIQUE,
    labels               text[] NOT NULL,
    capacity             integer NOT NULL CHECK (capacity BETWEEN 1 AND 256),
    lease_ms             bigint NOT NULL CHECK (lease_ms BETWEEN 5000 AND 600000),
    opened_at_ms         bigint NOT NULL,
    heartbeat_at_ms      bigint NOT NULL,
    lease_expires_at_ms  bigint NOT NULL,
    closed_at_ms         bigint
);

ALTER TABLE qinglong.attempts
    ALTER COLUMN session_id TYPE uuid USING session_id::uuid,
    ADD COLUMN not_before_ms bigint,
    ADD COLUMN session_generation bigint,
    ADD COLUMN lease_version bigint NOT NULL DEFAULT 0 CHECK (lease_version >= 0),
    ADD COLUMN lease_token_hash bytea,
    ADD COLUMN dispatched_at_ms bigint,
    ADD COLUMN deadline_ms bigint,
    ADD COLUMN timeout_ms bigint,
    ADD COLUMN cancel_reason text
        CHECK (cancel_reason IN ('timeout', 'operator', 'replaced', 'shutdown')),
    ADD COLUMN cancel_requested_at_ms bigint,
    ADD COLUMN exit_code integer,
    ADD COLUMN signal integer,
    ADD COLUMN log_bytes bigint NOT NULL DEFAULT 0 CHECK (log_bytes >= 0),
    ADD COLUMN log_dropped_bytes bigint NOT NULL DEFAULT 0 CHECK (log_dropped_bytes >= 0),
    ADD COLUMN log_deleted_at_ms bigint,
    ADD COLUMN reason text,
    DROP CONSTRAINT attempts_state_check,
    ADD CONSTRAINT attempts_state_check CHECK (state IN (
        'claimed', 'dispatching', 'running', 'succeeded', 'failed', 'timed_out', 'cancelled', 'lost')),
    -- a leased Attempt names its whole fence; one that is not leased names none of it
    ADD CONSTRAINT attempts_lease_check CHECK (
        (state IN ('dispatching', 'running')) <= (session_id IS NOT NULL AND session_generation IS NOT NULL
                                                 AND lease_token_hash IS NOT NULL
                                                 AND lease_expires_at_ms IS NOT NULL));

ALTER TABLE qinglong.runs
    ADD COLUMN finished_at_ms bigint,
    ADD COLUMN reason text,
    DROP CONSTRAINT runs_state_check,
    ADD CONSTRAINT runs_state_check CHECK (state IN (
        'queued', 'dispatching', 'running', 'retry_wait', 'succeeded', 'failed', 'timed_out',
        'cancelled', 'lost')),
    ADD CONSTRAINT runs_finished_check CHECK (
        finished_at_ms IS NULL OR state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost'));

-- The shipped log of an Attempt, in chunks at explicit offsets (a chunk is at most 256 KiB).
CREATE TABLE qinglong.attempt_logs (
    attempt_id    uuid NOT NULL REFERENCES qinglong.attempts (attempt_id),
    offset_bytes  bigint NOT NULL CHECK (offset_bytes >= 0),
    data          bytea NOT NULL CHECK (octet_length(data) BETWEEN 1 AND 262144),
    PRIMARY KEY (attempt_id, offset_bytes)
);

-- The claim's scan: Runs waiting for a worker, in dispatch order (the size is the backlog).
CREATE INDEX runs_dispatchable ON qinglong.runs (scheduled_for_ms, admitted_at_ms, run_id)
    WHERE state IN ('queued', 'retry_wait');
-- A task's active Runs (its concurrency policy).
CREATE INDEX runs_active_by_task ON qinglong.runs (project_id, task_id)
    WHERE state IN ('dispatching', 'running');
-- A session's Attempts (heartbeat, capacity, close) and the leases that expire (expiry).
CREATE INDEX attempts_by_session ON qinglong.attempts (session_id)
    WHERE state IN ('dispatching', 'running');
CREATE INDEX attempts_lease_expiry ON qinglong.attempts (lease_expires_at_ms)
    WHERE state IN ('dispatching', 'running');
CREATE INDEX attempts_deadline ON qinglong.attempts (deadline_ms) WHERE state = 'running';
-- Log retention: ended Attempts whose shipped log is still kept, oldest end first.
CREATE INDEX attempts_log_kept ON qinglong.attempts (finished_at_ms)
    WHERE finished_at_ms IS NOT NULL AND log_deleted_at_ms IS NULL AND log_bytes > 0;

GRANT SELECT ON qinglong.worker_sessions, qinglong.attempt_logs TO {{runtime}};

-- ------------------------------------------------------------------------------------------
-- Internal helpers (no grant: they run inside the definer functions, as the owner)
-- ------------------------------------------------------------------------------------------

-- The database clock in epoch ms.
CREATE FUNCTION qinglong._now_ms() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.clock_timestamp()) * 1000::numeric)::bigint;
END $$;

-- Append a Run's next event (the caller holds the Run's row lock).
CREATE FUNCTION qinglong._event(p_run_id uuid, p_type text, p_now bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO qinglong.run_events (event_id, run_id, seq, event_type, at_ms)
    SELECT pg_catalog.gen_random_uuid(), p_run_id, coalesce(max(e.seq), 0) + 1, p_type, p_now
    FROM qinglong.run_events e WHERE e.run_id = p_run_id;
END $$;

-- An instant as an operator reads it (UTC, to the second), as the edge store writes it.
CREATE FUNCTION qinglong._utc(p_ms bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pg_catalog.to_char(pg_catalog.timezone('UTC'::text,
               pg_catalog.to_timestamp((p_ms / 1000::bigint)::double precision)),
           'YYYY-MM-DD"T"HH24:MI:SS"Z"');
END $$;

-- What a cancel request's reason says in words (the contracts' classify_outcome words).
CREATE FUNCTION qinglong._cancel_words(p_reason text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE p_reason WHEN 'timeout' THEN 'the timeout expired'
                         WHEN 'operator' THEN 'cancelled by an operator'
                         WHEN 'replaced' THEN 'replaced by a newer run of the task'
                         WHEN 'shutdown' THEN 'stopped with the control plane' END;
END $$;

-- The pinned execution spec of a Run (key "execution" of its execution revision: the normalised
-- spec, or JSON null when the task has no command); SQL NULL when the revision predates it.
CREATE FUNCTION qinglong._run_spec(p_run_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_spec jsonb;
BEGIN
    SELECT e.spec_json::jsonb -> 'execution' INTO v_spec
    FROM qinglong.runs r
    JOIN qinglong.execution_revisions e
      ON e.project_id = r.project_id AND e.task_id = r.task_id
     AND e.task_revision = r.task_revision AND e.executor = r.executor
    WHERE r.run_id = p_run_id;
    RETURN v_spec;
END $$;

-- Why a stored spec cannot be run (NULL when it can): every key the functions read must be there
-- with its type, since no default lives in SQL.
CREATE FUNCTION qinglong._spec_problem(p_spec jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_spec IS NULL THEN
        RETURN 'the task revision was published without an execution spec for workers; publish the task again';
    END IF;
    IF pg_catalog.jsonb_typeof(p_spec) = 'null' THEN
        RETURN 'the task has no command';
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
        RETURN 'invalid execution spec: the stored spec lacks a key or has a key of the wrong type; publish the task again';
    END IF;
    RETURN NULL;
END $$;

-- The retry decision after Attempt p_attempt_no ended in p_state: the same rule, in the same
-- words, as contracts.execution.retry_decision (a property test holds the two equal). Returns a
-- retry (next_attempt_no, not_before_ms) or a stop (stop_state, stop_reason). The backoff is
-- initial * 2^(n-1) capped at max, of which the jitter fraction is drawn at random, so the delay
-- lies in [(1 - jitter) * d, d]. A spec without a retry policy never retries.
CREATE FUNCTION qinglong._retry_decision(
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
        stop_reason := 'the process exited 0';
        RETURN;
    ELSIF p_state = 'cancelled' THEN
        stop_reason := 'cancelled runs are not retried';
        RETURN;
    ELSIF NOT p_started THEN
        stop_reason := 'the process could not be started';
        RETURN;
    END IF;
    v_max := coalesce((v_retry ->> 'max_attempts')::integer, 1);
    IF p_attempt_no >= v_max THEN
        stop_reason := CASE WHEN v_max = 1 THEN 'no retry configured'
                            ELSE 'all ' || v_max::text || ' attempts used' END;
        RETURN;
    ELSIF p_state = 'lost' AND NOT (p_spec ->> 'idempotent')::boolean THEN
        stop_reason := 'a lost attempt may have run to the end; retried only for an idempotent task';
        RETURN;
    ELSIF p_state = 'timed_out' AND NOT (v_retry ->> 'on_timeout')::boolean THEN
        stop_reason := 'timeouts are not retried (retry.on_timeout = false)';
        RETURN;
    ELSIF p_state = 'failed' AND pg_catalog.jsonb_typeof(v_retry -> 'exit_codes') = 'array'
          AND (p_exit_code IS NULL OR NOT (v_retry -> 'exit_codes') @> pg_catalog.to_jsonb(p_exit_code)) THEN
        stop_reason := 'exit status ' || coalesce(p_exit_code::text, 'by signal')
                       || ' is not in retry.exit_codes';
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

-- End an Attempt that is not ended yet and apply the retry decision: Attempt N+1 'claimed' not
-- before its backoff (Run retry_wait, run.retry_scheduled) or the Run's terminal state (with its
-- finish and reason, run.finished), in the edge store's words. A durable cancel request other than
-- a timeout suppresses the retry. The caller holds the Run's and the Attempt's row locks.
CREATE FUNCTION qinglong._finish_attempt(
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
    v_status text;
    v_reason text;
BEGIN
    SELECT * INTO STRICT a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id;
    v_spec := qinglong._run_spec(a.run_id);
    IF qinglong._spec_problem(v_spec) IS NOT NULL THEN
        v_spec := NULL;  -- no policy to read: never retried
    END IF;
    SELECT d.next_attempt_no, d.not_before_ms, d.stop_reason INTO v_next, v_not_before, v_stop
    FROM qinglong._retry_decision(v_spec, a.attempt_no, p_state, p_exit_code, p_started, p_now) AS d;
    IF v_next IS NOT NULL AND a.cancel_reason IS NOT NULL AND a.cancel_reason <> 'timeout' THEN
        v_next := NULL;  -- cancelled on purpose: no successor (and no stop reason either)
    END IF;
    v_status := CASE WHEN p_exit_code IS NOT NULL THEN 'exit status ' || p_exit_code::text
                     WHEN p_signal IS NOT NULL THEN 'killed by signal ' || p_signal::text END;
    UPDATE qinglong.attempts x
    SET state = p_state, finished_at_ms = greatest(p_now, coalesce(x.started_at_ms, p_now)),
        exit_code = p_exit_code, signal = p_signal,
        log_bytes = coalesce(p_log_bytes, x.log_bytes),
        log_dropped_bytes = coalesce(p_log_dropped_bytes, x.log_dropped_bytes),
        reason = p_reason, lease_expires_at_ms = NULL
    WHERE x.attempt_id = p_attempt_id;
    IF v_next IS NOT NULL THEN
        INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor, created_at_ms,
                                       not_before_ms)
        VALUES (pg_catalog.gen_random_uuid(), a.run_id, v_next, 'claimed', a.executor, p_now, v_not_before);
        v_reason := 'attempt ' || a.attempt_no::text || ' ' || p_state || ' ('
                    || coalesce(p_reason, v_status, p_state) || '); attempt ' || v_next::text
                    || ' not before ' || qinglong._utc(v_not_before);
        UPDATE qinglong.runs r SET state = 'retry_wait', reason = v_reason WHERE r.run_id = a.run_id;
        PERFORM qinglong._event(a.run_id, 'run.retry_scheduled', p_now);
        run_state := 'retry_wait';
        next_attempt_no := v_next;
        next_not_before_ms := v_not_before;
        RETURN;
    END IF;
    IF p_state <> 'succeeded' THEN
        v_reason := pg_catalog.concat_ws('; ', p_reason, v_status,
                        CASE WHEN coalesce((v_spec -> 'retry' ->> 'max_attempts')::integer, 1) > 1
                             THEN v_stop END);
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

-- A leased Attempt that provably never started goes back to the queue (claimed, its lease
-- cleared; the next claim increments the lease version), or, when it carries a cancel request,
-- ends cancelled. The caller holds the Run's and the Attempt's row locks. Returns the action.
CREATE FUNCTION qinglong._requeue(p_attempt_id uuid, p_now bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a qinglong.attempts%ROWTYPE;
BEGIN
    SELECT * INTO STRICT a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id;
    IF a.cancel_reason IS NOT NULL THEN
        PERFORM qinglong._finish_attempt(p_attempt_id, 'cancelled', NULL, NULL, NULL, NULL,
                                         qinglong._cancel_words(a.cancel_reason) || ' before the process started',
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

-- The session fence: the worker id's current generation, this session, open, lease unexpired.
-- Locks the session row (FOR UPDATE when p_exclusive, else FOR SHARE). Raises QL001.
CREATE FUNCTION qinglong._session(p_worker_id text, p_session_id uuid, p_generation bigint,
                                  p_now bigint, p_exclusive boolean)
RETURNS qinglong.worker_sessions
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s qinglong.worker_sessions%ROWTYPE;
BEGIN
    IF p_exclusive THEN
        SELECT * INTO s FROM qinglong.worker_sessions w WHERE w.worker_id = p_worker_id FOR UPDATE;
    ELSE
        SELECT * INTO s FROM qinglong.worker_sessions w WHERE w.worker_id = p_worker_id FOR SHARE;
    END IF;
    IF NOT FOUND OR s.session_id IS DISTINCT FROM p_session_id OR s.generation IS DISTINCT FROM p_generation THEN
        RAISE EXCEPTION 'session fenced: not the current session of this worker id'
            USING ERRCODE = 'QL001', DETAIL = 'session_replaced';
    ELSIF s.closed_at_ms IS NOT NULL THEN
        RAISE EXCEPTION 'session fenced: the session is closed'
            USING ERRCODE = 'QL001', DETAIL = 'session_closed';
    ELSIF s.lease_expires_at_ms <= p_now THEN
        RAISE EXCEPTION 'session fenced: the session lease expired'
            USING ERRCODE = 'QL001', DETAIL = 'session_expired';
    END IF;
    RETURN s;
END $$;

-- The lease fence of one Attempt under a checked session: this session and generation, the lease
-- version, sha256(token) = the kept hash. Locks the Run, then the Attempt. p_active: the Attempt
-- must still be leased (dispatching or running, lease unexpired); otherwise an ended Attempt is
-- returned too (for the replay of a completion). Raises QL002.
CREATE FUNCTION qinglong._lease(p_session qinglong.worker_sessions, p_attempt_id uuid,
                                p_lease_version bigint, p_token bytea, p_now bigint, p_active boolean)
RETURNS qinglong.attempts
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a qinglong.attempts%ROWTYPE;
BEGIN
    PERFORM 1 FROM qinglong.runs r
    WHERE r.run_id = (SELECT x.run_id FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id)
    FOR UPDATE;
    SELECT * INTO a FROM qinglong.attempts x WHERE x.attempt_id = p_attempt_id FOR UPDATE;
    IF NOT FOUND OR p_token IS NULL
       OR a.session_id IS DISTINCT FROM p_session.session_id
       OR a.session_generation IS DISTINCT FROM p_session.generation
       OR a.lease_version IS DISTINCT FROM p_lease_version
       OR a.lease_token_hash IS DISTINCT FROM pg_catalog.sha256(p_token) THEN
        RAISE EXCEPTION 'lease fenced: the attempt is not leased under this fence'
            USING ERRCODE = 'QL002';
    END IF;
    IF a.state IN ('dispatching', 'running') THEN
        IF a.lease_expires_at_ms <= p_now THEN
            RAISE EXCEPTION 'lease fenced: the attempt''s lease expired' USING ERRCODE = 'QL002';
        END IF;
    ELSIF p_active OR a.state = 'claimed' THEN
        RAISE EXCEPTION 'lease fenced: the attempt is no longer leased (it is %)', a.state
            USING ERRCODE = 'QL002';
    END IF;
    RETURN a;
END $$;

-- The concurrency decision of a task for one candidate Run, as contracts.execution.overlap_decision
-- takes it: 'start', 'wait', 'skip' (with the reason) or 'replace' (cancel requests written on the
-- active Runs that can be locked now). The caller holds the task's row lock, which serialises this
-- decision cluster-wide; p_before: the candidate's dispatch order, for 'queue' and 'replace'.
CREATE FUNCTION qinglong._overlap(p_spec jsonb, p_project_id text, p_task_id text, p_run_id uuid,
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
            reason := v_active::text || ' of this task running (concurrency.max_running = ' || v_max::text || ')';
        END IF;
        RETURN;
    ELSIF v_mode = 'forbid' THEN
        IF v_active > 0 THEN
            action := 'skip';
            reason := 'skipped: concurrency ''forbid'' and run ' || v_first::text || ' of this task is still running';
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
            reason := 'concurrency ''queue'': waiting for the earlier run';
        END IF;
        RETURN;
    END IF;
    -- replace
    IF v_ahead THEN
        action := 'wait';
        reason := 'concurrency ''replace'': an older run of this task starts first';
        RETURN;
    ELSIF v_active = 0 THEN
        RETURN;
    END IF;
    action := 'wait';
    reason := 'concurrency ''replace'': waiting for the replaced run ' || v_first::text || ' to end';
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
        reason := 'replacing the running run of this task';
    END LOOP;
END $$;

-- ------------------------------------------------------------------------------------------
-- Worker functions (EXECUTE: worker_ingress only)
-- ------------------------------------------------------------------------------------------

CREATE FUNCTION qinglong.worker_open_session(p_worker_id text, p_labels text[], p_capacity integer,
                                             p_lease_ms bigint)
RETURNS TABLE (session_id uuid, generation bigint, lease_expires_at_ms bigint, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    v_labels text[];
BEGIN
    IF p_worker_id IS NULL OR pg_catalog.char_length(p_worker_id) NOT BETWEEN 1 AND 200
       OR p_worker_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'worker id: expected 1-200 characters without control characters'
            USING ERRCODE = 'QL003';
    ELSIF p_labels IS NULL OR coalesce(pg_catalog.array_length(p_labels, 1), 0) > 32
          OR EXISTS (SELECT 1 FROM pg_catalog.unnest(p_labels) AS l (label)
                     WHERE l.label IS NULL OR l.label !~ '^[A-Za-z0-9_.:=/-]{1,64}$') THEN
        RAISE EXCEPTION 'labels: expected at most 32 labels, each 1-64 characters of letters, digits and _ . : = / -'
            USING ERRCODE = 'QL003';
    ELSIF p_capacity IS NULL OR p_capacity NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'capacity: expected 1 to 256' USING ERRCODE = 'QL003';
    ELSIF p_lease_ms IS NULL OR p_lease_ms NOT BETWEEN 5000::bigint AND 600000::bigint THEN
        RAISE EXCEPTION 'session lease: expected 5000 to 600000 ms' USING ERRCODE = 'QL003';
    END IF;
    v_labels := ARRAY(SELECT DISTINCT l FROM pg_catalog.unnest(p_labels) AS l ORDER BY l);
    RETURN QUERY
    INSERT INTO qinglong.worker_sessions AS w (worker_id, generation, session_id, labels, capacity,
                                               lease_ms, opened_at_ms, heartbeat_at_ms,
                                               lease_expires_at_ms, closed_at_ms)
    VALUES (p_worker_id, 1, pg_catalog.gen_random_uuid(), v_labels, p_capacity, p_lease_ms, v_now,
            v_now, v_now + p_lease_ms, NULL)
    ON CONFLICT (worker_id) DO UPDATE
    SET generation = w.generation + 1, session_id = excluded.session_id, labels = excluded.labels,
        capacity = excluded.capacity, lease_ms = excluded.lease_ms, opened_at_ms = excluded.opened_at_ms,
        heartbeat_at_ms = excluded.heartbeat_at_ms, lease_expires_at_ms = excluded.lease_expires_at_ms,
        closed_at_ms = NULL
    RETURNING w.session_id, w.generation, w.lease_expires_at_ms, v_now;
END $$;

CREATE FUNCTION qinglong.worker_heartbeat(p_worker_id text, p_session_id uuid, p_generation bigint,
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
    WHERE a.session_id = s.session_id AND a.session_generation = s.generation
      AND a.state IN ('dispatching', 'running');
    RETURN QUERY
    SELECT v_expires, v_now,
           coalesce(array_agg(i.id ORDER BY i.ord), '{}'::uuid[]),
           coalesce(array_agg(i.why ORDER BY i.ord), '{}'::text[])
    FROM (SELECT u.id, u.ord,
                 CASE WHEN a.attempt_id IS NULL THEN 'lease_lost' ELSE a.cancel_reason END AS why
          FROM pg_catalog.unnest(coalesce(p_running, '{}'::uuid[])) WITH ORDINALITY AS u (id, ord)
          LEFT JOIN qinglong.attempts a
            ON a.attempt_id = u.id AND a.session_id = s.session_id
           AND a.session_generation = s.generation AND a.state IN ('dispatching', 'running')) AS i
    WHERE i.why IS NOT NULL;
END $$;

CREATE FUNCTION qinglong.worker_claim(p_worker_id text, p_session_id uuid, p_generation bigint,
                                      p_tokens bytea[])
RETURNS TABLE (run_id uuid, attempt_id uuid, attempt_no integer, lease_version bigint,
               token_index integer, lease_expires_at_ms bigint, project_id text, task_id text,
               task_revision bigint, scheduled_for_ms bigint, payload_json text, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    v_want integer;
    v_taken integer := 0;
    c record;
    v_spec jsonb;
    v_problem text;
    v_required text[];
    v_decision record;
    v_waiting text[] := '{}';
BEGIN
    s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, true);
    IF pg_catalog.current_setting('transaction_isolation') = 'repeatable read' THEN
        -- a snapshot older than the task lock would count another worker's start as not made
        RAISE EXCEPTION 'worker_claim needs READ COMMITTED or SERIALIZABLE, not REPEATABLE READ'
            USING ERRCODE = 'QL003';
    ELSIF p_tokens IS NULL OR coalesce(pg_catalog.array_length(p_tokens, 1), 0) > 256
          OR EXISTS (SELECT 1 FROM pg_catalog.unnest(p_tokens) AS t (token)
                     WHERE t.token IS NULL OR pg_catalog.octet_length(t.token) NOT BETWEEN 16 AND 64) THEN
        RAISE EXCEPTION 'tokens: expected at most 256 tokens of 16 to 64 bytes' USING ERRCODE = 'QL003';
    END IF;
    SELECT least(coalesce(pg_catalog.array_length(p_tokens, 1), 0), s.capacity - count(*)::integer)
    INTO v_want
    FROM qinglong.attempts a
    WHERE a.session_id = s.session_id AND a.session_generation = s.generation
      AND a.state IN ('dispatching', 'running');
    IF v_want <= 0 THEN
        RETURN;
    END IF;
    FOR c IN
        SELECT r.run_id, a.attempt_id, r.project_id, r.task_id, r.scheduled_for_ms, r.admitted_at_ms
        FROM qinglong.runs r
        JOIN qinglong.attempts a ON a.run_id = r.run_id AND a.state = 'claimed'
        WHERE r.state IN ('queued', 'retry_wait') AND coalesce(a.not_before_ms, 0::bigint) <= v_now
        ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id
        LIMIT 1000
    LOOP
        EXIT WHEN v_taken >= v_want;
        CONTINUE WHEN (c.project_id || '/' || c.task_id) = ANY (v_waiting);
        v_spec := qinglong._run_spec(c.run_id);
        v_problem := qinglong._spec_problem(v_spec);
        IF v_problem IS NULL THEN
            v_required := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                                   coalesce(v_spec -> 'labels', '[]'::jsonb)));
            CONTINUE WHEN NOT (v_required <@ s.labels);
            IF v_spec -> 'concurrency' ->> 'mode' = 'allow'
               AND pg_catalog.jsonb_typeof(v_spec -> 'concurrency' -> 'max_running') IS DISTINCT FROM 'number' THEN
                -- nothing of the task bounds this start: workers claim its Runs in parallel
                SELECT 'start'::text AS action, NULL::text AS reason INTO v_decision;
            ELSE
                -- serialise this task's start decisions cluster-wide; a task another claim is
                -- deciding right now is left to it
                PERFORM 1 FROM qinglong.tasks t WHERE t.project_id = c.project_id AND t.task_id = c.task_id
                FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    v_waiting := v_waiting || (c.project_id || '/' || c.task_id);
                    CONTINUE;
                END IF;
                v_decision := qinglong._overlap(v_spec, c.project_id, c.task_id, c.run_id,
                                                c.scheduled_for_ms, c.admitted_at_ms, v_now);
            END IF;
            IF v_decision.action IN ('wait', 'replace') THEN
                v_waiting := v_waiting || (c.project_id || '/' || c.task_id);
                CONTINUE;
            END IF;
        END IF;
        -- lock the candidate; another claim or a cancel holding it wins
        PERFORM 1 FROM qinglong.runs r JOIN qinglong.attempts a ON a.run_id = r.run_id
        WHERE r.run_id = c.run_id AND a.attempt_id = c.attempt_id AND a.state = 'claimed'
          AND r.state IN ('queued', 'retry_wait') AND coalesce(a.not_before_ms, 0::bigint) <= v_now
        FOR UPDATE OF r, a SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        IF v_problem IS NOT NULL THEN
            -- nothing can run: the Run fails at claim, as the local dispatcher fails it
            UPDATE qinglong.attempts a SET state = 'dispatching', dispatched_at_ms = v_now,
                   worker_id = p_worker_id, session_id = s.session_id, session_generation = s.generation,
                   lease_version = a.lease_version + 1, lease_token_hash = pg_catalog.sha256(p_tokens[1]),
                   lease_expires_at_ms = s.lease_expires_at_ms
            WHERE a.attempt_id = c.attempt_id;
            UPDATE qinglong.runs r SET state = 'dispatching' WHERE r.run_id = c.run_id;
            PERFORM qinglong._event(c.run_id, 'run.dispatching', v_now);
            PERFORM qinglong._finish_attempt(c.attempt_id, 'failed', NULL, NULL, NULL, NULL, v_problem,
                                             false, v_now);
            CONTINUE;
        ELSIF v_decision.action = 'skip' THEN
            PERFORM qinglong._event(c.run_id, 'run.skipped', v_now);
            PERFORM qinglong._finish_attempt(c.attempt_id, 'cancelled', NULL, NULL, NULL, NULL,
                                             v_decision.reason, false, v_now);
            CONTINUE;
        END IF;
        v_taken := v_taken + 1;
        UPDATE qinglong.attempts a
        SET state = 'dispatching', dispatched_at_ms = v_now, worker_id = p_worker_id,
            session_id = s.session_id, session_generation = s.generation,
            lease_version = a.lease_version + 1, lease_token_hash = pg_catalog.sha256(p_tokens[v_taken]),
            lease_expires_at_ms = s.lease_expires_at_ms, timeout_ms = (v_spec ->> 'timeout_ms')::bigint,
            deadline_ms = NULL, started_at_ms = NULL
        WHERE a.attempt_id = c.attempt_id;
        UPDATE qinglong.runs r SET state = 'dispatching' WHERE r.run_id = c.run_id;
        PERFORM qinglong._event(c.run_id, 'run.dispatching', v_now);
        RETURN QUERY
        SELECT r.run_id, a.attempt_id, a.attempt_no, a.lease_version, v_taken, a.lease_expires_at_ms,
               r.project_id, r.task_id, r.task_revision, r.scheduled_for_ms, tr.payload_json, v_now
        FROM qinglong.attempts a
        JOIN qinglong.runs r ON r.run_id = a.run_id
        JOIN qinglong.task_revisions tr
          ON tr.project_id = r.project_id AND tr.task_id = r.task_id AND tr.task_revision = r.task_revision
        WHERE a.attempt_id = c.attempt_id;
    END LOOP;
END $$;

CREATE FUNCTION qinglong.worker_started(p_worker_id text, p_session_id uuid, p_generation bigint,
                                        p_attempt_id uuid, p_lease_version bigint, p_token bytea)
RETURNS TABLE (deadline_ms bigint, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    a qinglong.attempts%ROWTYPE;
BEGIN
    s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, false);
    a := qinglong._lease(s, p_attempt_id, p_lease_version, p_token, v_now, true);
    IF a.state = 'dispatching' THEN
        UPDATE qinglong.attempts x
        SET state = 'running', started_at_ms = v_now, deadline_ms = v_now + x.timeout_ms
        WHERE x.attempt_id = p_attempt_id
        RETURNING * INTO a;
        UPDATE qinglong.runs r SET state = 'running' WHERE r.run_id = a.run_id;
        PERFORM qinglong._event(a.run_id, 'run.started', v_now);
    END IF;
    RETURN QUERY SELECT a.deadline_ms, v_now;
END $$;

CREATE FUNCTION qinglong.worker_append_log(p_worker_id text, p_session_id uuid, p_generation bigint,
                                           p_attempt_id uuid, p_lease_version bigint, p_token bytea,
                                           p_offset bigint, p_data bytea)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    a qinglong.attempts%ROWTYPE;
    v_len bigint := pg_catalog.octet_length(p_data)::bigint;
    v_overlap bigint;
    v_stored bytea;
BEGIN
    s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, false);
    a := qinglong._lease(s, p_attempt_id, p_lease_version, p_token, v_now, true);
    IF p_data IS NULL OR p_offset IS NULL OR p_offset < 0::bigint OR v_len > 262144::bigint THEN
        RAISE EXCEPTION 'log chunk: expected an offset >= 0 and at most 262144 bytes' USING ERRCODE = 'QL003';
    ELSIF p_offset > a.log_bytes THEN
        RAISE EXCEPTION 'log chunk at offset % leaves a gap: % bytes are stored', p_offset, a.log_bytes
            USING ERRCODE = 'QL003';
    ELSIF p_offset + v_len > (qinglong._run_spec(a.run_id) ->> 'log_limit_bytes')::bigint THEN
        RAISE EXCEPTION 'log chunk: the log would exceed the task''s log_limit_bytes' USING ERRCODE = 'QL003';
    END IF;
    -- the part already stored must be the same bytes (a resent chunk)
    v_overlap := least(a.log_bytes, p_offset + v_len) - p_offset;
    IF v_overlap > 0::bigint THEN
        SELECT pg_catalog.substring(pg_catalog.string_agg(l.data, ''::bytea ORDER BY l.offset_bytes),
                                    (p_offset - pg_catalog.min(l.offset_bytes))::integer + 1, v_overlap::integer)
        INTO v_stored
        FROM qinglong.attempt_logs l
        WHERE l.attempt_id = p_attempt_id AND l.offset_bytes < p_offset + v_overlap
          AND l.offset_bytes + pg_catalog.octet_length(l.data)::bigint > p_offset;
        IF v_stored IS DISTINCT FROM pg_catalog.substring(p_data, 1, v_overlap::integer) THEN
            RAISE EXCEPTION 'log chunk at offset % differs from the bytes stored there', p_offset
                USING ERRCODE = 'QL003';
        END IF;
    END IF;
    IF p_offset + v_len > a.log_bytes THEN
        INSERT INTO qinglong.attempt_logs (attempt_id, offset_bytes, data)
        VALUES (p_attempt_id, a.log_bytes,
                pg_catalog.substring(p_data, (a.log_bytes - p_offset)::integer + 1));
        UPDATE qinglong.attempts x SET log_bytes = p_offset + v_len WHERE x.attempt_id = p_attempt_id;
        RETURN p_offset + v_len;
    END IF;
    RETURN a.log_bytes;
END $$;

CREATE FUNCTION qinglong.worker_complete(p_worker_id text, p_session_id uuid, p_generation bigint,
                                         p_attempt_id uuid, p_lease_version bigint, p_token bytea,
                                         p_state text, p_exit_code integer, p_signal integer,
                                         p_log_bytes bigint, p_log_dropped_bytes bigint,
                                         p_reason text, p_started boolean)
RETURNS TABLE (result text, run_state text, log_bytes_stored bigint, next_attempt_no integer,
               next_not_before_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    a qinglong.attempts%ROWTYPE;
    d record;
BEGIN
    s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, false);
    IF p_state IS NULL OR p_state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
       OR p_exit_code NOT BETWEEN 0 AND 255 OR p_signal NOT BETWEEN 1 AND 128
       OR p_log_bytes IS NULL OR p_log_bytes < 0::bigint
       OR p_log_dropped_bytes IS NULL OR p_log_dropped_bytes < 0::bigint
       OR pg_catalog.char_length(p_reason) > 2000 OR p_started IS NULL THEN
        RAISE EXCEPTION 'completion: expected an ended state, exit code 0-255, signal 1-128, log sizes >= 0, a reason of at most 2000 characters'
            USING ERRCODE = 'QL003';
    END IF;
    a := qinglong._lease(s, p_attempt_id, p_lease_version, p_token, v_now, false);
    IF a.state NOT IN ('dispatching', 'running') THEN
        -- ended: the exact replay of the accepted completion is answered, anything else refused
        IF a.state IS DISTINCT FROM p_state OR a.exit_code IS DISTINCT FROM p_exit_code
           OR a.signal IS DISTINCT FROM p_signal OR a.log_bytes IS DISTINCT FROM p_log_bytes
           OR a.log_dropped_bytes IS DISTINCT FROM p_log_dropped_bytes
           OR a.reason IS DISTINCT FROM p_reason THEN
            RAISE EXCEPTION 'lease fenced: the attempt already ended differently (%)', a.state
                USING ERRCODE = 'QL002';
        END IF;
        RETURN QUERY
        SELECT 'already_done'::text, r.state, a.log_bytes, n.attempt_no, n.not_before_ms
        FROM qinglong.runs r
        LEFT JOIN qinglong.attempts n ON n.run_id = r.run_id AND n.attempt_no = a.attempt_no + 1
        WHERE r.run_id = a.run_id;
        RETURN;
    ELSIF a.log_bytes <> p_log_bytes THEN
        RETURN QUERY SELECT 'log_incomplete'::text, r.state, a.log_bytes, NULL::integer, NULL::bigint
        FROM qinglong.runs r WHERE r.run_id = a.run_id;
        RETURN;
    END IF;
    d := qinglong._finish_attempt(p_attempt_id, p_state, p_exit_code, p_signal, p_log_bytes,
                                  p_log_dropped_bytes, p_reason, p_started, v_now);
    RETURN QUERY SELECT 'accepted'::text, d.run_state, p_log_bytes, d.next_attempt_no, d.next_not_before_ms;
END $$;

CREATE FUNCTION qinglong.worker_close_session(p_worker_id text, p_session_id uuid, p_generation bigint)
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
                                             'the worker closed its session while the job was running',
                                             true, v_now);
        END IF;
    END LOOP;
END $$;

-- ------------------------------------------------------------------------------------------
-- Control-plane functions (EXECUTE: runtime only)
-- ------------------------------------------------------------------------------------------

CREATE FUNCTION qinglong.expire_attempts(p_limit integer)
RETURNS TABLE (attempt_id uuid, run_id uuid, action text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    c record;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'limit: expected 1 to 10000' USING ERRCODE = 'QL003';
    END IF;
    -- leases that expired: a start that never happened goes back to the queue, a started job is lost
    FOR c IN
        SELECT r.run_id, a.attempt_id, a.state, a.worker_id, a.session_generation FROM qinglong.attempts a
        JOIN qinglong.runs r ON r.run_id = a.run_id
        WHERE a.state IN ('dispatching', 'running') AND a.lease_expires_at_ms <= v_now
        ORDER BY a.lease_expires_at_ms
        LIMIT p_limit
        FOR UPDATE OF r, a SKIP LOCKED
    LOOP
        attempt_id := c.attempt_id;
        run_id := c.run_id;
        IF c.state = 'dispatching' THEN
            action := qinglong._requeue(c.attempt_id, v_now);
        ELSE
            PERFORM qinglong._finish_attempt(c.attempt_id, 'lost', NULL, NULL, NULL, NULL,
                'the lease of worker ' || c.worker_id || ' (session generation '
                || c.session_generation::text || ') expired while the job was running', true, v_now);
            action := 'lost';
        END IF;
        p_limit := p_limit - 1;
        RETURN NEXT;
    END LOOP;
    IF p_limit <= 0 THEN
        RETURN;
    END IF;
    -- a deadline long past (by a session lease) with no completion: the worker did not enforce it
    FOR c IN
        SELECT r.run_id, a.attempt_id FROM qinglong.attempts a
        JOIN qinglong.runs r ON r.run_id = a.run_id
        LEFT JOIN qinglong.worker_sessions w ON w.worker_id = a.worker_id
        WHERE a.state = 'running'
          AND a.deadline_ms + coalesce(w.lease_ms, 600000::bigint) <= v_now
        ORDER BY a.deadline_ms
        LIMIT p_limit
        FOR UPDATE OF r, a SKIP LOCKED
    LOOP
        UPDATE qinglong.attempts x SET cancel_reason = coalesce(x.cancel_reason, 'timeout'),
               cancel_requested_at_ms = coalesce(x.cancel_requested_at_ms, v_now)
        WHERE x.attempt_id = c.attempt_id;
        PERFORM qinglong._finish_attempt(c.attempt_id, 'timed_out', NULL, NULL, NULL, NULL,
            'the timeout expired and the worker did not report the end of the job', true, v_now);
        attempt_id := c.attempt_id;
        run_id := c.run_id;
        action := 'timed_out';
        RETURN NEXT;
    END LOOP;
END $$;

CREATE FUNCTION qinglong.request_cancel(p_run_id uuid, p_reason text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    v_state text;
    a qinglong.attempts%ROWTYPE;
BEGIN
    IF p_reason IS NULL OR p_reason NOT IN ('timeout', 'operator', 'replaced', 'shutdown') THEN
        RAISE EXCEPTION 'cancel reason: expected timeout, operator, replaced or shutdown'
            USING ERRCODE = 'QL003';
    END IF;
    SELECT r.state INTO v_state FROM qinglong.runs r WHERE r.run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO a FROM qinglong.attempts x WHERE x.run_id = p_run_id
    ORDER BY x.attempt_no DESC LIMIT 1 FOR UPDATE;
    IF v_state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost') OR NOT FOUND THEN
        RETURN v_state;
    ELSIF a.state = 'claimed' THEN
        UPDATE qinglong.attempts x SET cancel_reason = p_reason, cancel_requested_at_ms = v_now
        WHERE x.attempt_id = a.attempt_id;
        PERFORM qinglong._event(p_run_id, 'run.cancel_requested', v_now);
        RETURN (qinglong._finish_attempt(a.attempt_id, 'cancelled', NULL, NULL, NULL, NULL,
                                         qinglong._cancel_words(p_reason), false, v_now)).run_state;
    ELSIF a.state IN ('dispatching', 'running') AND a.cancel_reason IS NULL THEN
        UPDATE qinglong.attempts x SET cancel_reason = p_reason, cancel_requested_at_ms = v_now
        WHERE x.attempt_id = a.attempt_id;
        PERFORM qinglong._event(p_run_id, 'run.cancel_requested', v_now);
    END IF;
    RETURN v_state;
END $$;

CREATE FUNCTION qinglong.prune_attempt_logs(p_older_than_ms bigint, p_limit integer) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    v_ids uuid[];
BEGIN
    IF p_older_than_ms IS NULL OR p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'prune: expected a time and a limit of 1 to 10000' USING ERRCODE = 'QL003';
    END IF;
    v_ids := ARRAY(
        SELECT a.attempt_id FROM qinglong.attempts a
        WHERE a.finished_at_ms IS NOT NULL AND a.log_deleted_at_ms IS NULL AND a.log_bytes > 0::bigint
          AND a.finished_at_ms < p_older_than_ms
        ORDER BY a.finished_at_ms
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    DELETE FROM qinglong.attempt_logs l WHERE l.attempt_id = ANY (v_ids);
    UPDATE qinglong.attempts a SET log_deleted_at_ms = v_now WHERE a.attempt_id = ANY (v_ids);
    RETURN coalesce(pg_catalog.array_length(v_ids, 1), 0);
END $$;

-- ------------------------------------------------------------------------------------------
-- Privileges: nobody but the owner executes anything, then exactly one role per function
-- ------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA qinglong FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    qinglong.worker_open_session(text, text[], integer, bigint),
    qinglong.worker_heartbeat(text, uuid, bigint, uuid[]),
    qinglong.worker_claim(text, uuid, bigint, bytea[]),
    qinglong.worker_started(text, uuid, bigint, uuid, bigint, bytea),
    qinglong.worker_append_log(text, uuid, bigint, uuid, bigint, bytea, bigint, bytea),
    qinglong.worker_complete(text, uuid, bigint, uuid, bigint, bytea, text, integer, integer, bigint,
                             bigint, text, boolean),
    qinglong.worker_close_session(text, uuid, bigint)
TO {{worker_ingress}};
GRANT EXECUTE ON FUNCTION
    qinglong.expire_attempts(integer),
    qinglong.request_cancel(uuid, text),
    qinglong.prune_attempt_logs(bigint, integer)
TO {{runtime}};
