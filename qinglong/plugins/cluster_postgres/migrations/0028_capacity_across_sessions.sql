-- capability: 26
-- A worker holds at most its capacity of leases, whatever its sessions. worker_claim counted
-- only the current session's Attempts, while an earlier generation's stay leased until their
-- leases run out (their jobs may still be ending: the worker stops them before that). A worker
-- that opened one session after another could so claim its capacity again each time and hold
-- the whole queue. The claim now counts every live lease of the worker id: the current
-- session's, and an earlier session's until its lease expires. Same body as 0023's but for that
-- count.

CREATE OR REPLACE FUNCTION qinglong.worker_claim(p_worker_id text, p_session_id uuid, p_generation bigint,
                                      p_tokens bytea[])
RETURNS TABLE (run_id uuid, attempt_id uuid, attempt_no integer, lease_version bigint,
               token_index integer, lease_expires_at_ms bigint, project_id text, task_id text,
               task_revision bigint, scheduled_for_ms bigint, payload_json text, db_now_ms bigint,
               event_payload text)
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
    v_projects text[];
BEGIN
    s := qinglong._session(p_worker_id, p_session_id, p_generation, v_now, true);
    -- a registered worker is offered its registered projects' Runs only (none listed: every one)
    SELECT nullif(w.projects, '{}') INTO v_projects FROM qinglong.worker_registrations w
    WHERE w.worker_id = p_worker_id AND w.revoked_at_ms IS NULL;
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
    WHERE a.worker_id = p_worker_id AND a.state IN ('dispatching', 'running')
      AND ((a.session_id = s.session_id AND a.session_generation = s.generation)
           OR a.lease_expires_at_ms > v_now);
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
                  AND (v_projects IS NULL OR r.project_id = ANY (v_projects))
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
                  AND (v_projects IS NULL OR r.project_id = ANY (v_projects))
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
               r.project_id, r.task_id, r.task_revision, r.scheduled_for_ms, tr.payload_json, v_now,
               ep.payload_json
        FROM qinglong.attempts a
        JOIN qinglong.runs r ON r.run_id = a.run_id
        JOIN qinglong.task_revisions tr
          ON tr.project_id = r.project_id AND tr.task_id = r.task_id AND tr.task_revision = r.task_revision
        LEFT JOIN qinglong.run_event_payloads ep ON ep.run_id = r.run_id
        WHERE a.attempt_id = v_attempt_id;
    END LOOP;
END $$;
