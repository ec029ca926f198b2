-- capability: 6
-- A worker's claim reads a bounded number of rows whatever the backlog. The claim of 0005 walked
-- up to 1,000 queued Runs in dispatch order and re-derived each one's execution spec (label
-- match, concurrency mode) before it found one to take: its cost grew with the backlog, and a
-- burst drained in time quadratic in its size. Now each Run carries the two fields of its pinned
-- spec that route a claim, written once when the Run is inserted:
--
-- * required_labels: the labels a worker must offer (the spec's `labels`, as text, sorted and
--   distinct; '{}' when the spec names none or cannot be read);
-- * start_gated: the start needs a concurrency decision (anything but `allow` without
--   `max_running`, including a spec that cannot be read: the claim fails such a Run).
--
-- and two partial indexes hold the waiting Runs (queued, or waiting for a retry) in the order a
-- claim seeks them: the free ones by label set and dispatch order, every one by task (the gated
-- starts, and the overlap rule's "an earlier Run of the task waits"). A claim skips from one
-- label set (one task) to the next through the index and reads only the first rows of each.

ALTER TABLE qinglong.runs
    ADD COLUMN required_labels text[],
    ADD COLUMN start_gated boolean;

-- The routing fields of a Run's pinned execution revision (its key "execution"). Total: a spec
-- that cannot be read routes as gated with no labels, and the claim fails it. contracts
-- .stored_spec.stored_claim_routing is the same rule (a property test holds the two equal).
CREATE FUNCTION qinglong._claim_routing(p_project_id text, p_task_id text, p_task_revision bigint,
                                        p_executor text,
                                        OUT required_labels text[], OUT start_gated boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_spec jsonb;
BEGIN
    SELECT e.spec_json::jsonb -> 'execution' INTO v_spec
    FROM qinglong.execution_revisions e
    WHERE e.project_id = p_project_id AND e.task_id = p_task_id AND e.task_revision = p_task_revision
      AND e.executor = p_executor;
    required_labels := CASE WHEN pg_catalog.jsonb_typeof(v_spec -> 'labels') = 'array'
                            THEN ARRAY(SELECT DISTINCT l.label
                                       FROM pg_catalog.jsonb_array_elements_text(v_spec -> 'labels') AS l (label)
                                       ORDER BY l.label)
                            ELSE '{}'::text[] END;
    start_gated := NOT coalesce(pg_catalog.jsonb_typeof(v_spec) = 'object'
                                AND (v_spec -> 'concurrency' ->> 'mode') = 'allow'
                                AND pg_catalog.jsonb_typeof(v_spec -> 'concurrency' -> 'max_running')
                                    IS DISTINCT FROM 'number', false);
END $$;

-- Every writer of a Run gets the fields (the admission, and anything else that inserts one): the
-- trigger fires only for a row that does not carry them, so a writer that computed them pays
-- nothing.
CREATE FUNCTION qinglong._runs_routing() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
BEGIN
    v := qinglong._claim_routing(NEW.project_id, NEW.task_id, NEW.task_revision, NEW.executor);
    NEW.required_labels := coalesce(NEW.required_labels, v.required_labels);
    NEW.start_gated := coalesce(NEW.start_gated, v.start_gated);
    RETURN NEW;
END $$;

CREATE TRIGGER runs_routing BEFORE INSERT ON qinglong.runs
    FOR EACH ROW WHEN (NEW.required_labels IS NULL OR NEW.start_gated IS NULL)
    EXECUTE FUNCTION qinglong._runs_routing();

-- Runs that can still be claimed (a Run not ended may be requeued) get their fields now; ended
-- Runs keep NULL: no claim reads them again.
UPDATE qinglong.runs r
SET (required_labels, start_gated) = (
    SELECT x.required_labels, x.start_gated
    FROM qinglong._claim_routing(r.project_id, r.task_id, r.task_revision, r.executor) AS x)
WHERE r.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost');

ALTER TABLE qinglong.runs ADD CONSTRAINT runs_routing_check CHECK (
    state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
    OR (required_labels IS NOT NULL AND start_gated IS NOT NULL));

-- The free waiting Runs by label set, in dispatch order within each.
CREATE INDEX runs_claim_free ON qinglong.runs (required_labels, scheduled_for_ms, admitted_at_ms, run_id)
    WHERE state IN ('queued', 'retry_wait') AND NOT start_gated;
-- Every waiting Run by task, in dispatch order within it; the gated ones first.
CREATE INDEX runs_claim_by_task
    ON qinglong.runs (start_gated, project_id, task_id, scheduled_for_ms, admitted_at_ms, run_id)
    WHERE state IN ('queued', 'retry_wait');
DROP INDEX qinglong.runs_dispatchable;

-- contracts.execution.overlap_decision (a property test holds the two equal). As in 0007; the
-- earlier waiting Run of the task is looked up through runs_claim_by_task (start_gated is set on
-- every waiting Run, so naming both of its values selects them all).
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
        WHERE r.start_gated = ANY (ARRAY[false, true])
          AND r.project_id = p_project_id AND r.task_id = p_task_id AND r.state IN ('queued', 'retry_wait')
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

-- The claim: the same decisions, in the same dispatch order, as 0005's, over a bounded window of
-- candidates instead of a walk of the backlog. The candidates are, for each label set the
-- session offers, the first free Runs in dispatch order, and for each gated task, its first
-- Runs (a gated start is decided in order within its task: what lies behind a Run that must wait
-- waits too); each range yields at most the window (what the claim wants, twice, plus room for
-- the rows other claims hold right now), read in index order through the index, so a claim reads
-- about (label sets + gated tasks) x window rows at any backlog (a Run waiting for a retry that
-- is not due yet takes a place in its window). The ranges read runs alone: a join with attempts
-- planned generically (the plan a session keeps after five calls) could hash all of them. Every
-- candidate is then handled as before: its waiting Attempt found by the Run, its spec read (a Run whose spec cannot run fails here), its task's start decided
-- under the task's row lock, the Run and Attempt locked SKIP LOCKED and leased.
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
                SELECT r.run_id, r.project_id, r.task_id, r.scheduled_for_ms, r.admitted_at_ms
                FROM qinglong.runs r
                WHERE r.state IN ('queued', 'retry_wait') AND NOT r.start_gated
                  AND r.required_labels = l.labels
                ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id
                LIMIT v_window) AS f
            WHERE l.labels IS NOT NULL AND l.labels <@ s.labels
            UNION ALL
            SELECT t.* FROM gated_tasks g
            CROSS JOIN LATERAL (
                SELECT r.run_id, r.project_id, r.task_id, r.scheduled_for_ms, r.admitted_at_ms
                FROM qinglong.runs r
                WHERE r.state IN ('queued', 'retry_wait') AND r.start_gated
                  AND r.project_id = g.project_id AND r.task_id = g.task_id
                  AND r.required_labels <@ s.labels
                ORDER BY r.start_gated, r.project_id, r.task_id, r.scheduled_for_ms, r.admitted_at_ms, r.run_id
                LIMIT v_window) AS t
        )
        SELECT x.run_id, x.project_id, x.task_id, x.scheduled_for_ms, x.admitted_at_ms
        FROM candidates x
        ORDER BY x.scheduled_for_ms, x.admitted_at_ms, x.run_id
    LOOP
        EXIT WHEN v_taken >= v_want;
        CONTINUE WHEN (c.project_id || '/' || c.task_id) = ANY (v_waiting);
        -- its waiting Attempt, looked up by the Run (one index probe): a retry not due yet waits
        SELECT a.attempt_id INTO v_attempt_id FROM qinglong.attempts a
        WHERE a.run_id = c.run_id AND a.state = 'claimed' AND coalesce(a.not_before_ms, 0::bigint) <= v_now;
        CONTINUE WHEN NOT FOUND;
        v_spec := qinglong._run_spec(c.run_id);
        v_problem := qinglong._spec_problem(v_spec);
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
            PERFORM qinglong._event(c.run_id, 'run.skipped', v_now);
            PERFORM qinglong._finish_attempt(v_attempt_id, 'cancelled', NULL, NULL, NULL, NULL,
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

REVOKE ALL ON FUNCTION
    qinglong._claim_routing(text, text, bigint, text),
    qinglong._runs_routing()
FROM PUBLIC;
