-- 0002_schedule_skips: record what misfire decisions deliberately did not admit, and find a
-- trigger's Runs by occurrence without scanning the whole table.

CREATE TABLE schedule_skips (
    id               INTEGER PRIMARY KEY,
    project_id       TEXT NOT NULL,
    trigger_id       TEXT NOT NULL,
    trigger_revision INTEGER NOT NULL,
    policy           TEXT NOT NULL CHECK (policy IN ('skip', 'fire_once')),
    first_skipped_ms INTEGER NOT NULL,
    last_skipped_ms  INTEGER NOT NULL CHECK (last_skipped_ms >= first_skipped_ms),
    count            INTEGER NOT NULL CHECK (count >= 1),
    count_exact      INTEGER NOT NULL CHECK (count_exact IN (0, 1)),
    recorded_at_ms   INTEGER NOT NULL
);

CREATE INDEX schedule_skips_by_trigger ON schedule_skips (trigger_id, first_skipped_ms);

CREATE INDEX runs_by_trigger ON runs (trigger_id, scheduled_for_ms);
