-- capability: 18
-- A Run its task's overlap rules skip before it starts is a skip, not a Run, and a task's waiting
-- Runs are bounded. Until now the worker's claim ended a 'forbid' skip as a cancelled Run (so
-- `skips` showed none) and knew no bound on a task's backlog.
--
-- * runs.max_queued: [execution] max_queued of the replica that admitted the Run, written once
--   at insert by the runtime (a worker, which calls only the functions, cannot change it); NULL
--   on Runs admitted before (no bound).
-- * qinglong._overlap takes the bound and counts the due waiting Runs ahead of the candidate (up
--   to the bound): a Run that would wait behind max_queued of them is skipped
--   (contracts.execution.overlap_decision; a property test holds the two equal).
-- * The claim goes on through the later Runs of a task whose first Run waits, so those beyond
--   the bound are skipped, the oldest kept.
-- * A skipped Run ends cancelled (its end event and its outbox row written as for any end), then
--   becomes a run_skips record with its reason and its rows leave the Runs.
-- * Its idempotency key stays taken: a Run inserted with a key a skip record holds is not
--   inserted (a BEFORE INSERT trigger; it first waits on the Run row holding the key, which a
--   skip holds locked until it commits, so an insert racing the skip sees the record).

ALTER TABLE qinglong.runs
    ADD COLUMN max_queued integer CHECK (max_queued IS NULL OR max_queued BETWEEN 1 AND 100000);

CREATE TABLE qinglong.run_skips (
    skip_seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id            uuid NOT NULL UNIQUE,
    project_id        text NOT NULL,
    task_id           text NOT NULL,
    trigger_id        text NOT NULL,
    scheduled_for_ms  bigint NOT NULL,
    reason            text NOT NULL,
    recorded_at_ms    bigint NOT NULL,
    idempotency_key   text NOT NULL UNIQUE
);
CREATE INDEX run_skips_recorded ON qinglong.run_skips (recorded_at_ms);

GRANT SELECT ON qinglong.run_skips TO {{runtime}};

-- A key held by a skip record admits nothing.
CREATE FUNCTION qinglong._runs_key_kept() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- a Run holding the key: the unique constraint answers (waiting here for a skip that holds
    -- the row, whose record the check below then sees)
    PERFORM 1 FROM qinglong.runs r WHERE r.idempotency_key = NEW.idempotency_key FOR KEY SHARE;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM qinglong.run_skips k WHERE k.idempotency_key = NEW.idempotency_key) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER runs_key_kept BEFORE INSERT ON qinglong.runs
    FOR EACH ROW EXECUTE FUNCTION qinglong._runs_key_kept();

-- Skip a claimed Run (the caller holds its Run's and Attempt's row locks): it ends cancelled
-- with the reason, then its skip record replaces its rows.
CREATE FUNCTION qinglong._skip_run(p_run_id uuid, p_attempt_id uuid, p_reason text, p_now bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM qinglong._event(p_run_id, 'run.skipped', p_now);
    PERFORM qinglong._finish_attempt(p_attempt_id, 'cancelled', NULL, NULL, NULL, NULL, p_reason,
                                     false, p_now);
    INSERT INTO qinglong.run_skips (run_id, project_id, task_id, trigger_id, scheduled_for_ms,
                                    reason, recorded_at_ms, idempotency_key)
    SELECT r.run_id, r.project_id, r.task_id, r.trigger_id, r.scheduled_for_ms, p_reason, p_now,
           r.idempotency_key
    FROM qinglong.runs r WHERE r.run_id = p_run_id;
    DELETE FROM qinglong.run_events e WHERE e.run_id = p_run_id;
    DELETE FROM qinglong.attempt_logs l USING qinglong.attempts a
    WHERE a.run_id = p_run_id AND l.attempt_id = a.attempt_id;
    DELETE FROM qinglong.attempts a WHERE a.run_id = p_run_id;
    DELETE FROM qinglong.runs r WHERE r.run_id = p_run_id;
END $$;

-- contracts.execution.overlap_decision (a property test holds the two equal), with the bound:
-- as in 0008, plus p_max_queued. The due waiting Runs of the task ahead of the candidate are
-- counted up to the bound (the contract reports at most the bound), through runs_claim_by_task.
DROP FUNCTION qinglong._overlap(jsonb, text, text, uuid, bigint, bigint, bigint);
CREATE FUNCTION qinglong._overlap(p_spec jsonb, p_project_id text, p_task_id text, p_run_id uuid,
                                  p_scheduled_for_ms bigint, p_admitted_at_ms bigint, p_now bigint,
                                  p_max_queued integer,
                                  OUT action text, OUT reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_mode text := p_spec -> 'concurrency' ->> 'mode';
    v_max integer := (p_spec -> 'concurrency' ->> 'max_running')::integer;
    v_active integer;
    v_first uuid;
    v_ahead integer;
    v_victim record;
BEGIN
    SELECT count(*)::integer, (array_agg(r.run_id ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id))[1]
    INTO v_active, v_first
    FROM qinglong.runs r
    WHERE r.project_id = p_project_id AND r.task_id = p_task_id AND r.state IN ('dispatching', 'running');
    action := 'start';
    IF v_mode = 'forbid' THEN
        IF v_active > 0 THEN
            action := 'skip';
            reason := qinglong._reason('overlap_forbid', ARRAY[v_first::text]);
        END IF;
        RETURN;
    ELSIF v_mode = 'allow' AND (v_max IS NULL OR v_active < v_max) THEN
        RETURN;
    END IF;
    -- the due, waiting Runs of the task ahead (in dispatch order), counted up to what matters
    SELECT count(*)::integer INTO v_ahead FROM (
        SELECT 1 FROM qinglong.runs r JOIN qinglong.attempts a ON a.run_id = r.run_id AND a.state = 'claimed'
        WHERE r.start_gated = ANY (ARRAY[false, true])
          AND r.project_id = p_project_id AND r.task_id = p_task_id AND r.state IN ('queued', 'retry_wait')
          AND coalesce(a.not_before_ms, 0::bigint) <= p_now AND r.run_id <> p_run_id
          AND (r.scheduled_for_ms, r.admitted_at_ms, r.run_id) < (p_scheduled_for_ms, p_admitted_at_ms, p_run_id)
        LIMIT coalesce(p_max_queued, 1)) x;
    IF v_mode = 'allow' THEN
        action := 'wait';
        reason := qinglong._reason('overlap_max_running', ARRAY[v_active::text, v_max::text]);
    ELSIF v_mode = 'queue' THEN
        IF v_active > 0 OR v_ahead > 0 THEN
            action := 'wait';
            reason := qinglong._reason('overlap_queue');
        END IF;
    ELSIF v_ahead > 0 THEN
        -- replace: an older waiting Run replaces what runs, this one it
        action := 'wait';
        reason := qinglong._reason('overlap_replace_older');
    ELSIF v_active > 0 THEN
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
    END IF;
    IF action = 'wait' AND p_max_queued IS NOT NULL AND v_ahead >= p_max_queued THEN
        action := 'skip';
        reason := qinglong._reason('overlap_queue_full', ARRAY[v_ahead::text, p_max_queued::text]);
    END IF;
END $$;

-- The claim, as in 0008, with the bound: a Run behind a waiting Run of its task is decided too
-- (it waits, or the bound skips it), and a skip becomes a skip record (qinglong._skip_run). A
-- task another claim is deciding is left to it, as before.
CREATE OR REPLACE FUNCTION qinglong.worker_claim(p_worker_id text, p_session_id uuid, p_generation bigint,
                                      p_tokens bytea[])
RETURNS TABLE (run_id uuid, attempt_id uuid, attempt_no integer, lease_version bigint,
               token_index integer, lease_expires_at_ms bigint, project_id text, task_id text,
               task_revision bigint, scheduled_for_ms bigint, payload_json text, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    v_want integer;
    v_window integer;
    v_taken integer := 0;
    c record;
    v_spec jsonb;
    v_problem text;
    v_decision record;
    v_waiting text[] := '{}';
    v_held text[] := '{}';
    v_key text;
    v_behind boolean;
    v_attempt_id uuid;
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
    v_window := 2 * v_want + 16;
    FOR c IN
        WITH RECURSIVE label_sets (labels) AS (
            (SELECT r.required_labels FROM qinglong.runs r
             WHERE r.state IN ('queued', 'retry_wait') AND NOT r.start_gated
             ORDER BY r.required_labels LIMIT 1)
            UNION ALL
            SELECT (SELECT r.required_labels FROM qinglong.runs r
                    WHERE r.state IN ('queued', 'retry_wait') AND NOT r.start_gated
                      AND r.required_labels > l.labels
                    ORDER BY r.required_labels LIMIT 1)
            FROM label_sets l WHERE l.labels IS NOT NULL
        ),
        gated_tasks (project_id, task_id) AS (
            (SELECT r.project_id, r.task_id FROM qinglong.runs r
             WHERE r.state IN ('queued', 'retry_wait') AND r.start_gated
             ORDER BY r.start_gated, r.project_id, r.task_id LIMIT 1)
            UNION ALL
            SELECT n.project_id, n.task_id
            FROM gated_tasks g
            CROSS JOIN LATERAL (
                SELECT r.project_id, r.task_id FROM qinglong.runs r
                WHERE r.state IN ('queued', 'retry_wait') AND r.start_gated
                  AND (r.project_id, r.task_id) > (g.project_id, g.task_id)
                ORDER BY r.start_gated, r.project_id, r.task_id LIMIT 1) AS n
        ),
        candidates AS (
            SELECT f.* FROM label_sets l
            CROSS JOIN LATERAL (
                SELECT r.run_id, r.project_id, r.task_id, r.scheduled_for_ms, r.admitted_at_ms, r.max_queued
                FROM qinglong.runs r
                WHERE r.state IN ('queued', 'retry_wait') AND NOT r.start_gated
                  AND r.required_labels = l.labels
                ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id
                LIMIT v_window) AS f
            WHERE l.labels IS NOT NULL AND l.labels <@ s.labels
            UNION ALL
            SELECT t.* FROM gated_tasks g
            CROSS JOIN LATERAL (
                SELECT r.run_id, r.project_id, r.task_id, r.scheduled_for_ms, r.admitted_at_ms, r.max_queued
                FROM qinglong.runs r
                WHERE r.state IN ('queued', 'retry_wait') AND r.start_gated
                  AND r.project_id = g.project_id AND r.task_id = g.task_id
                  AND r.required_labels <@ s.labels
                ORDER BY r.start_gated, r.project_id, r.task_id, r.scheduled_for_ms, r.admitted_at_ms, r.run_id
                LIMIT v_window) AS t
        )
        SELECT x.run_id, x.project_id, x.task_id, x.scheduled_for_ms, x.admitted_at_ms, x.max_queued
        FROM candidates x
        ORDER BY x.scheduled_for_ms, x.admitted_at_ms, x.run_id
    LOOP
        EXIT WHEN v_taken >= v_want;
        v_key := c.project_id || '/' || c.task_id;
        CONTINUE WHEN v_key = ANY (v_held);
        -- behind a waiting Run of its task: this one waits too, unless the bound skips it
        v_behind := v_key = ANY (v_waiting);
        CONTINUE WHEN v_behind AND c.max_queued IS NULL;
        -- its waiting Attempt, looked up by the Run (one index probe): a retry not due yet waits
        SELECT a.attempt_id INTO v_attempt_id FROM qinglong.attempts a
        WHERE a.run_id = c.run_id AND a.state = 'claimed' AND coalesce(a.not_before_ms, 0::bigint) <= v_now;
        CONTINUE WHEN NOT FOUND;
        v_spec := qinglong._run_spec(c.run_id);
        v_problem := qinglong._spec_problem(v_spec);
        CONTINUE WHEN v_behind AND v_problem IS NOT NULL;
        IF v_problem IS NULL THEN
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
                    v_held := v_held || v_key;
                    CONTINUE;
                END IF;
                v_decision := qinglong._overlap(v_spec, c.project_id, c.task_id, c.run_id,
                                                c.scheduled_for_ms, c.admitted_at_ms, v_now, c.max_queued);
            END IF;
            CONTINUE WHEN v_behind AND v_decision.action <> 'skip';
            IF v_decision.action IN ('wait', 'replace') THEN
                v_waiting := v_waiting || v_key;
                CONTINUE;
            END IF;
        END IF;
        -- lock the candidate; another claim or a cancel holding it wins
        PERFORM 1 FROM qinglong.runs r JOIN qinglong.attempts a ON a.run_id = r.run_id
        WHERE r.run_id = c.run_id AND a.attempt_id = v_attempt_id AND a.state = 'claimed'
          AND r.state IN ('queued', 'retry_wait') AND coalesce(a.not_before_ms, 0::bigint) <= v_now
        FOR UPDATE OF r, a SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        IF v_problem IS NOT NULL THEN
            -- nothing can run: the Run fails at claim, as the local dispatcher fails it
            UPDATE qinglong.attempts a SET state = 'dispatching', dispatched_at_ms = v_now,
                   worker_id = p_worker_id, session_id = s.session_id, session_generation = s.generation,
                   lease_version = a.lease_version + 1, lease_token_hash = pg_catalog.sha256(p_tokens[1]),
                   lease_expires_at_ms = s.lease_expires_at_ms
            WHERE a.attempt_id = v_attempt_id;
            UPDATE qinglong.runs r SET state = 'dispatching' WHERE r.run_id = c.run_id;
            PERFORM qinglong._event(c.run_id, 'run.dispatching', v_now);
            PERFORM qinglong._finish_attempt(v_attempt_id, 'failed', NULL, NULL, NULL, NULL, v_problem,
                                             false, v_now);
            CONTINUE;
        ELSIF v_decision.action = 'skip' THEN
            PERFORM qinglong._skip_run(c.run_id, v_attempt_id, v_decision.reason, v_now);
            CONTINUE;
        END IF;
        v_taken := v_taken + 1;
        UPDATE qinglong.attempts a
        SET state = 'dispatching', dispatched_at_ms = v_now, worker_id = p_worker_id,
            session_id = s.session_id, session_generation = s.generation,
            lease_version = a.lease_version + 1, lease_token_hash = pg_catalog.sha256(p_tokens[v_taken]),
            lease_expires_at_ms = s.lease_expires_at_ms, timeout_ms = (v_spec ->> 'timeout_ms')::bigint,
            deadline_ms = NULL, started_at_ms = NULL
        WHERE a.attempt_id = v_attempt_id;
        UPDATE qinglong.runs r SET state = 'dispatching' WHERE r.run_id = c.run_id;
        PERFORM qinglong._event(c.run_id, 'run.dispatching', v_now);
        RETURN QUERY
        SELECT r.run_id, a.attempt_id, a.attempt_no, a.lease_version, v_taken, a.lease_expires_at_ms,
               r.project_id, r.task_id, r.task_revision, r.scheduled_for_ms, tr.payload_json, v_now
        FROM qinglong.attempts a
        JOIN qinglong.runs r ON r.run_id = a.run_id
        JOIN qinglong.task_revisions tr
          ON tr.project_id = r.project_id AND tr.task_id = r.task_id AND tr.task_revision = r.task_revision
        WHERE a.attempt_id = v_attempt_id;
    END LOOP;
END $$;

-- A chained Run carries the bound of the Run whose end admitted it (a replica wrote that).
CREATE OR REPLACE FUNCTION qinglong._chain_after_end() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    v_now bigint := coalesce(NEW.finished_at_ms, qinglong._now_ms());
    v_run uuid;
BEGIN
    FOR t IN
        SELECT tr.trigger_id, tr.trigger_revision, tr.task_id, k.task_revision, e.content_digest
        FROM qinglong.triggers tr
        JOIN qinglong.projects p ON p.project_id = tr.project_id
        JOIN qinglong.tasks k ON k.project_id = tr.project_id AND k.task_id = tr.task_id
        JOIN qinglong.execution_revisions e
          ON e.project_id = k.project_id AND e.task_id = k.task_id
         AND e.task_revision = k.task_revision AND e.executor = 'remote_worker'
        WHERE tr.project_id = NEW.project_id AND tr.kind = 'after' AND tr.enabled
          AND tr.spec_json ->> 'task' = NEW.task_id
          AND CASE coalesce(tr.spec_json ->> 'on', 'success')
                  WHEN 'success' THEN NEW.state = 'succeeded'
                  WHEN 'failure' THEN NEW.state IN ('failed', 'timed_out', 'lost')
                  WHEN 'any' THEN true
                  ELSE false END
          AND p.active AND p.deleted_at_ms IS NULL AND k.deleted_at_ms IS NULL
        ORDER BY tr.trigger_id
    LOOP
        v_run := pg_catalog.gen_random_uuid();
        INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                   task_revision, executor, execution_digest, scheduled_for_ms,
                                   admitted_at_ms, queued_at_ms, state, owned_by, cancelled,
                                   idempotency_key, admitted_by, max_queued)
        VALUES (v_run, NEW.project_id, t.trigger_id, t.trigger_revision, t.task_id,
                t.task_revision, 'remote_worker', t.content_digest, v_now, v_now, v_now, 'queued',
                'runtime', false, 'ql3:chain:v1:' || NEW.run_id::text || ':' || t.trigger_id,
                'chain', NEW.max_queued)
        ON CONFLICT (idempotency_key) DO NOTHING;
        IF FOUND THEN
            INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor,
                                           created_at_ms)
            VALUES (pg_catalog.gen_random_uuid(), v_run, 1, 'claimed', 'remote_worker', v_now);
            INSERT INTO qinglong.run_events (event_id, run_id, seq, event_type, at_ms)
            VALUES (pg_catalog.gen_random_uuid(), v_run, 1, 'run.created', v_now),
                   (pg_catalog.gen_random_uuid(), v_run, 2, 'run.queued', v_now);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

REVOKE ALL ON FUNCTION
    qinglong._runs_key_kept(),
    qinglong._skip_run(uuid, uuid, text, bigint),
    qinglong._overlap(jsonb, text, text, uuid, bigint, bigint, bigint, integer)
FROM PUBLIC;
