-- 0015_operator_events: the open episodes of operator conditions (the scheduler without a
-- completed round for a while). Opening one writes its event to the outbox and closing it the
-- recovery event, each in the transaction that changes this table: an episode is announced once
-- and recovers once, whatever crashes in between.
CREATE TABLE operator_episodes (
    episode_key   TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    opened_at_ms  INTEGER NOT NULL,
    detail_json   TEXT
);
