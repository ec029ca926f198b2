-- 0008_events_outbox: events out. When a Run ends, and when a trigger's occurrences are skipped,
-- a trigger writes one outbox row in the transaction that made the change, whichever statement
-- made it: a crash can neither lose an event nor invent one. The row carries what its message
-- needs as it was then (the last Attempt's exit code and duration, the task's notify table).
-- event_id is stable (receivers dedupe on it); seq orders the events. The delivery loop routes
-- each event to its channels (event_deliveries, one row per event and channel) and records every
-- try there.

CREATE TABLE event_outbox (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id      TEXT NOT NULL UNIQUE,
    kind          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    project_id    TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    trigger_id    TEXT NOT NULL,
    run_id        TEXT,
    state         TEXT,
    exit_code     INTEGER,
    duration_ms   INTEGER,
    reason        TEXT,
    notify_json   TEXT,
    detail_json   TEXT,
    at_ms         INTEGER NOT NULL,
    routed_at_ms  INTEGER
);

-- The routing scan reads only what is not routed yet.
CREATE INDEX event_outbox_unrouted ON event_outbox (seq) WHERE routed_at_ms IS NULL;

CREATE TABLE event_deliveries (
    event_seq        INTEGER NOT NULL REFERENCES event_outbox (seq),
    channel          TEXT NOT NULL,
    subject          TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    tries            INTEGER NOT NULL DEFAULT 0 CHECK (tries >= 0),
    next_try_at_ms   INTEGER NOT NULL,
    lease_until_ms   INTEGER,
    last_error       TEXT,
    delivered_at_ms  INTEGER,
    created_at_ms    INTEGER NOT NULL,
    PRIMARY KEY (event_seq, channel)
);

-- Pending deliveries by channel and subject in event order: the head of each is the one sent.
CREATE INDEX event_deliveries_pending ON event_deliveries (channel, subject, event_seq)
    WHERE state = 'pending';

CREATE TRIGGER runs_outbox_on_end AFTER UPDATE OF state ON runs
WHEN NEW.state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
 AND OLD.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
BEGIN
    INSERT INTO event_outbox (event_id, kind, subject, project_id, task_id, trigger_id, run_id,
                              state, exit_code, duration_ms, reason, notify_json, at_ms)
    SELECT lower(hex(randomblob(16))), 'run.' || NEW.state, NEW.project_id || '/' || NEW.task_id,
           NEW.project_id, NEW.task_id, NEW.trigger_id, NEW.run_id, NEW.state,
           (SELECT a.exit_code FROM attempts AS a WHERE a.run_id = NEW.run_id
             ORDER BY a.attempt_no DESC LIMIT 1),
           (SELECT a.finished_at_ms - a.started_at_ms FROM attempts AS a
             WHERE a.run_id = NEW.run_id ORDER BY a.attempt_no DESC LIMIT 1),
           NEW.reason,
           (SELECT CASE WHEN json_valid(v.payload_json)
                         AND json_type(v.payload_json, '$.notify') = 'object'
                        THEN json_extract(v.payload_json, '$.notify') END
              FROM task_revisions AS v
             WHERE v.project_id = NEW.project_id AND v.task_id = NEW.task_id
               AND v.task_revision = NEW.task_revision),
           COALESCE(NEW.finished_at_ms, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
END;

CREATE TRIGGER schedule_skips_outbox AFTER INSERT ON schedule_skips
BEGIN
    INSERT INTO event_outbox (event_id, kind, subject, project_id, task_id, trigger_id, reason,
                              detail_json, at_ms)
    SELECT lower(hex(randomblob(16))), 'trigger.skipped',
           NEW.project_id || '/trigger/' || NEW.trigger_id, NEW.project_id,
           COALESCE((SELECT t.task_id FROM triggers AS t WHERE t.trigger_id = NEW.trigger_id), ''),
           NEW.trigger_id, 'misfire policy ' || NEW.policy,
           json_object('policy', NEW.policy, 'first_skipped_ms', NEW.first_skipped_ms,
                       'last_skipped_ms', NEW.last_skipped_ms, 'count', NEW.count,
                       'count_exact', json(CASE WHEN NEW.count_exact THEN 'true' ELSE 'false' END)),
           NEW.recorded_at_ms;
END;
