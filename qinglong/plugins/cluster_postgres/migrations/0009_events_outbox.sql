-- capability: 7
-- Events out. When a Run ends (whichever path ends it: a worker's completion, the control plane's
-- expiry, a cancel, a closed session) and when a trigger's occurrences are skipped, a row trigger
-- writes one outbox row in the transaction that made the change: a crash can neither lose an
-- event nor invent one. The row carries what its message needs as it was then (the last
-- Attempt's exit code and duration, the task's notify table). event_id is stable (receivers
-- dedupe on it); seq orders the events. Every replica's delivery loop routes each event to its
-- channels (event_deliveries, one row per event and channel), holds a delivery while it sends
-- it (lease_until_ms, so replicas do not send it together) and records every try there.

CREATE TABLE qinglong.event_outbox (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id      uuid NOT NULL UNIQUE,
    kind          text NOT NULL,
    subject       text NOT NULL,
    project_id    text NOT NULL,
    task_id       text NOT NULL,
    trigger_id    text NOT NULL,
    run_id        uuid,
    state         text,
    exit_code     integer,
    duration_ms   bigint,
    reason        text,
    notify_json   jsonb,
    detail_json   jsonb,
    at_ms         bigint NOT NULL,
    routed_at_ms  bigint
);
CREATE INDEX event_outbox_unrouted ON qinglong.event_outbox (seq) WHERE routed_at_ms IS NULL;

CREATE TABLE qinglong.event_deliveries (
    event_seq        bigint NOT NULL REFERENCES qinglong.event_outbox (seq),
    channel          text NOT NULL,
    subject          text NOT NULL,
    state            text NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    tries            integer NOT NULL DEFAULT 0 CHECK (tries >= 0),
    next_try_at_ms   bigint NOT NULL,
    lease_until_ms   bigint,
    last_error       text,
    delivered_at_ms  bigint,
    created_at_ms    bigint NOT NULL,
    PRIMARY KEY (event_seq, channel)
);
CREATE INDEX event_deliveries_pending ON qinglong.event_deliveries (channel, subject, event_seq)
    WHERE state = 'pending';

CREATE FUNCTION qinglong._outbox_run_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a record;
    v_notify jsonb;
BEGIN
    SELECT x.exit_code, x.finished_at_ms - x.started_at_ms AS duration_ms INTO a
    FROM qinglong.attempts x WHERE x.run_id = NEW.run_id ORDER BY x.attempt_no DESC LIMIT 1;
    SELECT CASE WHEN pg_catalog.jsonb_typeof(v.payload_json::jsonb -> 'notify') = 'object'
                THEN v.payload_json::jsonb -> 'notify' END
    INTO v_notify
    FROM qinglong.task_revisions v
    WHERE v.project_id = NEW.project_id AND v.task_id = NEW.task_id
      AND v.task_revision = NEW.task_revision;
    INSERT INTO qinglong.event_outbox (event_id, kind, subject, project_id, task_id, trigger_id,
                                       run_id, state, exit_code, duration_ms, reason, notify_json,
                                       at_ms)
    VALUES (pg_catalog.gen_random_uuid(), 'run.' || NEW.state,
            NEW.project_id || '/' || NEW.task_id, NEW.project_id, NEW.task_id, NEW.trigger_id,
            NEW.run_id, NEW.state, a.exit_code, a.duration_ms, NEW.reason, v_notify,
            coalesce(NEW.finished_at_ms, qinglong._now_ms()));
    RETURN NULL;
END $$;

CREATE TRIGGER runs_outbox_on_end AFTER UPDATE OF state ON qinglong.runs
FOR EACH ROW
WHEN (NEW.state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
      AND OLD.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost'))
EXECUTE FUNCTION qinglong._outbox_run_ended();

CREATE FUNCTION qinglong._outbox_skipped() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO qinglong.event_outbox (event_id, kind, subject, project_id, task_id, trigger_id,
                                       reason, detail_json, at_ms)
    VALUES (pg_catalog.gen_random_uuid(), 'trigger.skipped',
            NEW.project_id || '/trigger/' || NEW.trigger_id, NEW.project_id,
            coalesce((SELECT t.task_id FROM qinglong.triggers t WHERE t.trigger_id = NEW.trigger_id), ''),
            NEW.trigger_id, 'misfire policy ' || NEW.policy,
            pg_catalog.jsonb_build_object('policy', NEW.policy,
                                          'first_skipped_ms', NEW.first_skipped_ms,
                                          'last_skipped_ms', NEW.last_skipped_ms,
                                          'count', NEW.skipped_count,
                                          'count_exact', NEW.count_exact),
            NEW.recorded_at_ms);
    RETURN NULL;
END $$;

CREATE TRIGGER schedule_skips_outbox AFTER INSERT ON qinglong.schedule_skips
FOR EACH ROW EXECUTE FUNCTION qinglong._outbox_skipped();

REVOKE ALL ON FUNCTION qinglong._outbox_run_ended(), qinglong._outbox_skipped() FROM PUBLIC;

GRANT SELECT ON qinglong.event_outbox TO {{runtime}};
GRANT UPDATE (routed_at_ms) ON qinglong.event_outbox TO {{runtime}};
GRANT SELECT, INSERT, UPDATE ON qinglong.event_deliveries TO {{runtime}};
