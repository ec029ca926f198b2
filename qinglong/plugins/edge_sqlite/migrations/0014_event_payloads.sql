-- 0014_event_payloads: what an event admitted a Run with (an incoming webhook's body, an event
-- source's payload), written in the admitting transaction and handed to the job as a file.
-- Deleted with its Run.
CREATE TABLE run_event_payloads (
    run_id        TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    payload_json  TEXT NOT NULL
);
