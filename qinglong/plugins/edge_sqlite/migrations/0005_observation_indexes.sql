-- 0005_observation_indexes: the store-derived figures of /metrics and `qinglong status` (admission
-- lag of recent Runs, recent skips, recent lost Attempts) are read through indexes on the time
-- each was recorded, so a scrape reads the recent window, never the whole history.

-- Admission lag over the last minutes: Runs by admission time, with the occurrence and the
-- trigger revision alongside (a manual Run has revision 0), so the lag of the trigger Runs is
-- read from the index alone. (A partial index would not do: SQLite does not count a partial
-- index's predicate column as covered, and would read every Run of the window from the table.)
CREATE INDEX runs_by_admission ON runs (admitted_at_ms, scheduled_for_ms, trigger_revision);

-- Skips recorded in the last hour.
CREATE INDEX schedule_skips_by_recorded ON schedule_skips (recorded_at_ms);

-- Attempts lost in the last hour: lost is rare, so this index stays small.
CREATE INDEX attempts_lost ON attempts (finished_at_ms)
    WHERE state = 'lost';
