-- capability: 19
-- Operator events in the outbox, each written in the transaction of the change that reveals it:
-- * worker.lost: an Attempt a worker held leaves its lease while that worker's session is over
--   (expired, closed, or replaced by a newer session of the same worker id). A row trigger on
--   attempts writes it from whichever path ends the Attempt (the control plane's expiry, the
--   session's close), once per session (operator_episodes keeps the session's key).
-- * queue.stalled / queue.resumed: queued Runs no live worker can take (none offers their labels)
--   for longer than a grace; check_stranded_runs opens the episode (one event) and closes it
--   (one event) when none is left. Every replica calls it; the episode's key makes it once.
-- * scheduler.not_ready / scheduler.ready: a replica's scheduler without a completed round for a
--   while, and its recovery, through operator_episode (the host decides when).
-- Operator events have no project, task or Run; their subject orders their deliveries.

CREATE TABLE qinglong.operator_episodes (
    episode_key   text PRIMARY KEY,
    kind          text NOT NULL,
    opened_at_ms  bigint NOT NULL,
    detail_json   jsonb
);

-- One operator event into the outbox.
CREATE FUNCTION qinglong._operator_event(p_kind text, p_subject text, p_reason text,
                                         p_detail jsonb, p_now bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO qinglong.event_outbox (event_id, kind, subject, project_id, task_id, trigger_id,
                                       reason, detail_json, at_ms)
    VALUES (pg_catalog.gen_random_uuid(), p_kind, p_subject, '', '', '', p_reason, p_detail,
            p_now);
END $$;

CREATE FUNCTION qinglong._outbox_worker_lost() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    v_cause text;
    v_held bigint;
BEGIN
    IF OLD.session_id IS NULL OR OLD.worker_id IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO s FROM qinglong.worker_sessions w WHERE w.worker_id = OLD.worker_id;
    v_cause := CASE WHEN NOT FOUND OR s.session_id <> OLD.session_id THEN 'session_replaced'
                    WHEN s.closed_at_ms IS NOT NULL THEN 'session_closed'
                    WHEN s.lease_expires_at_ms <= v_now THEN 'session_expired' END;
    IF v_cause IS NULL THEN
        RETURN NULL;  -- the session lives: this is the worker's own report, or a lone lease
    END IF;
    INSERT INTO qinglong.operator_episodes (episode_key, kind, opened_at_ms)
    VALUES ('worker.lost/' || OLD.session_id::text, 'worker.lost', v_now)
    ON CONFLICT (episode_key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;  -- this session's loss is announced already
    END IF;
    SELECT count(*) INTO v_held FROM qinglong.attempts a
    WHERE a.session_id = OLD.session_id
      AND (a.state IN ('dispatching', 'running') OR a.attempt_id = OLD.attempt_id);
    PERFORM qinglong._operator_event(
        'worker.lost', 'worker/' || OLD.worker_id,
        'worker ' || OLD.worker_id || ': ' || pg_catalog.replace(v_cause, '_', ' ') || ' with '
            || v_held || ' run(s) held',
        pg_catalog.jsonb_build_object('worker', OLD.worker_id, 'session', OLD.session_id::text,
                                      'generation', OLD.session_generation, 'cause', v_cause,
                                      'runs_held', v_held),
        v_now);
    RETURN NULL;
END $$;

CREATE TRIGGER attempts_outbox_worker_lost AFTER UPDATE OF state ON qinglong.attempts
FOR EACH ROW
WHEN (OLD.state IN ('dispatching', 'running') AND NEW.state NOT IN ('dispatching', 'running'))
EXECUTE FUNCTION qinglong._outbox_worker_lost();

-- Open (p_active) or close an episode of an operator condition: the first opening writes its
-- event, the first close after it writes the recovery event (with when it opened); any other
-- call writes nothing. Returns whether an event was written.
CREATE FUNCTION qinglong.operator_episode(p_key text, p_kind text, p_active boolean,
                                          p_subject text, p_reason text, p_detail jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    v_opened bigint;
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('scheduler.not_ready', 'queue.stalled')
       OR p_key IS NULL OR pg_catalog.char_length(p_key) NOT BETWEEN 1 AND 300
       OR p_active IS NULL OR p_subject IS NULL OR pg_catalog.char_length(p_subject) > 300
       OR pg_catalog.char_length(p_reason) > 1000
       OR (p_detail IS NOT NULL AND pg_catalog.jsonb_typeof(p_detail) <> 'object') THEN
        RAISE EXCEPTION 'operator episode: expected kind scheduler.not_ready or queue.stalled, a key and a subject of at most 300 characters, a reason of at most 1000 and a JSON object'
            USING ERRCODE = 'QL003';
    END IF;
    IF p_active THEN
        INSERT INTO qinglong.operator_episodes (episode_key, kind, opened_at_ms, detail_json)
        VALUES (p_key, p_kind, v_now, p_detail)
        ON CONFLICT (episode_key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        PERFORM qinglong._operator_event(p_kind, p_subject, p_reason, p_detail, v_now);
        RETURN true;
    END IF;
    DELETE FROM qinglong.operator_episodes e WHERE e.episode_key = p_key AND e.kind = p_kind
    RETURNING e.opened_at_ms INTO v_opened;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM qinglong._operator_event(
        CASE p_kind WHEN 'scheduler.not_ready' THEN 'scheduler.ready' ELSE 'queue.resumed' END,
        p_subject, p_reason,
        coalesce(p_detail, '{}'::jsonb) || pg_catalog.jsonb_build_object('since_ms', v_opened),
        v_now);
    RETURN true;
END $$;

-- Queued Runs that waited past p_grace_ms while no live worker offers every label they require:
-- opens the queue.stalled episode when there are some, closes it when there are none. Returns
-- how many there are.
CREATE FUNCTION qinglong.check_stranded_runs(p_grace_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    v_n bigint;
    v_oldest bigint;
    v_labels jsonb;
BEGIN
    IF p_grace_ms IS NULL OR p_grace_ms < 0::bigint THEN
        RAISE EXCEPTION 'stranded runs: expected a grace >= 0 ms' USING ERRCODE = 'QL003';
    END IF;
    SELECT coalesce(sum(q.n), 0), min(q.oldest),
           coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(q.labels) ORDER BY q.labels), '[]')
    INTO v_n, v_oldest, v_labels
    FROM (SELECT coalesce(r.required_labels, '{}'::text[]) AS labels, count(*) AS n,
                 min(GREATEST(r.scheduled_for_ms,
                                         coalesce(r.queued_at_ms, r.admitted_at_ms))) AS oldest
          FROM qinglong.runs r
          WHERE r.state IN ('queued', 'retry_wait') AND r.state = 'queued'
            AND GREATEST(r.scheduled_for_ms, coalesce(r.queued_at_ms, r.admitted_at_ms))
                <= v_now - p_grace_ms
          GROUP BY 1) q
    WHERE NOT EXISTS (SELECT 1 FROM qinglong.worker_sessions w
                      WHERE w.closed_at_ms IS NULL AND w.lease_expires_at_ms > v_now
                        AND q.labels <@ w.labels);
    PERFORM qinglong.operator_episode(
        'queue.stalled', 'queue.stalled', v_n > 0, 'queue',
        CASE WHEN v_n > 0 THEN v_n || ' queued run(s) with no live worker able to take them'
             ELSE 'every queued run has a live worker able to take it' END,
        CASE WHEN v_n > 0 THEN pg_catalog.jsonb_build_object('runs', v_n, 'oldest_ms', v_oldest,
                                                             'labels', v_labels, 'grace_ms', p_grace_ms)
             ELSE pg_catalog.jsonb_build_object('grace_ms', p_grace_ms) END);
    RETURN v_n;
END $$;

REVOKE ALL ON FUNCTION qinglong._operator_event(text, text, text, jsonb, bigint),
    qinglong._outbox_worker_lost(),
    qinglong.operator_episode(text, text, boolean, text, text, jsonb),
    qinglong.check_stranded_runs(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.operator_episode(text, text, boolean, text, text, jsonb),
    qinglong.check_stranded_runs(bigint) TO {{runtime}};
GRANT SELECT ON qinglong.operator_episodes TO {{runtime}};
GRANT DELETE ON qinglong.operator_episodes TO {{runtime}};
