-- capability: 18
-- Workers as untrusted clients: each worker is registered (its id, the labels and projects it
-- may take Runs of, its capacity) with a token of its own, of which the store keeps only the
-- SHA-256. The API tier's gateway authenticates a worker's token through worker_identity and
-- calls the worker functions with the identity it names, never one a request declares. The
-- admin role registers, rotates and lists (table privileges) and revokes (worker_revoke: the
-- registration is revoked, its open session closed and its Runs handed over in one transaction).
-- An Attempt becoming claimable (admitted, requeued, a retry created) notifies channel
-- qinglong_claimable, so a gateway's waiting claims wake at once instead of polling.
CREATE TABLE qinglong.worker_registrations (
    worker_id      text PRIMARY KEY
        CHECK (pg_catalog.char_length(worker_id) BETWEEN 1 AND 200 AND worker_id !~ '[[:cntrl:]]'),
    labels         text[] NOT NULL DEFAULT '{}',
    projects       text[] NOT NULL DEFAULT '{}',
    capacity       integer NOT NULL CHECK (capacity BETWEEN 1 AND 256),
    token_digest   bytea NOT NULL UNIQUE CHECK (pg_catalog.octet_length(token_digest) = 32),
    created_at_ms  bigint NOT NULL,
    rotated_at_ms  bigint,
    revoked_at_ms  bigint
);

REVOKE ALL ON qinglong.worker_registrations FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON qinglong.worker_registrations TO {{admin}};

-- The registration a live token names (nothing for an unknown or revoked one).
CREATE FUNCTION qinglong.worker_identity(p_digest bytea)
RETURNS TABLE (worker_id text, labels text[], projects text[], capacity integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    SELECT r.worker_id, r.labels, r.projects, r.capacity FROM qinglong.worker_registrations r
    WHERE r.token_digest = p_digest AND r.revoked_at_ms IS NULL;
END $$;

-- Revoke a worker: its registration, then its open session (closed, so every call of it is
-- refused), then its Attempts: one that never started goes back to the queue, a started one
-- ends lost (the retry policy decides). Returns the Attempts handed over, or NULL when no live
-- registration has this id.
CREATE FUNCTION qinglong.worker_revoke(p_worker_id text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now bigint := qinglong._now_ms();
    s qinglong.worker_sessions%ROWTYPE;
    c record;
    v_state text;
    v_count integer := 0;
BEGIN
    UPDATE qinglong.worker_registrations r SET revoked_at_ms = v_now
    WHERE r.worker_id = p_worker_id AND r.revoked_at_ms IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO s FROM qinglong.worker_sessions w WHERE w.worker_id = p_worker_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    UPDATE qinglong.worker_sessions w SET closed_at_ms = coalesce(w.closed_at_ms, v_now)
    WHERE w.worker_id = p_worker_id;
    FOR c IN
        SELECT a.run_id, a.attempt_id FROM qinglong.attempts a
        WHERE a.session_id = s.session_id AND a.session_generation = s.generation
          AND a.state IN ('dispatching', 'running')
        ORDER BY a.run_id
    LOOP
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
                                             qinglong._reason('session_closed'), true, v_now);
        END IF;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END $$;

CREATE FUNCTION qinglong._notify_claimable()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('qinglong_claimable', '');
    RETURN NULL;
END $$;

CREATE TRIGGER attempts_claimable AFTER INSERT OR UPDATE OF state ON qinglong.attempts
    FOR EACH ROW WHEN (NEW.state = 'claimed') EXECUTE FUNCTION qinglong._notify_claimable();

REVOKE ALL ON FUNCTION qinglong.worker_identity(bytea), qinglong.worker_revoke(text),
    qinglong._notify_claimable() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.worker_identity(bytea) TO {{worker_ingress}};
GRANT EXECUTE ON FUNCTION qinglong.worker_revoke(text) TO {{admin}};
