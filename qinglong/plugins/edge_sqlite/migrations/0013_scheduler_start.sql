-- 0013_scheduler_start: when the running scheduler did its first round (one row, written once per
-- start, never per round: flash wear). What it admitted of occurrences that fell due before then
-- was its start's catch-up, which the misfire policy allowed: the lag figures of /metrics and
-- `qinglong status` count such an occurrence's lag from that round, not from its scheduled time.
CREATE TABLE scheduler_start (
    singleton          INTEGER PRIMARY KEY CHECK (singleton = 1),
    first_round_at_ms  INTEGER NOT NULL
);
