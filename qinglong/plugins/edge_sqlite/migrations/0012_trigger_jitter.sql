-- 0012_trigger_jitter: a trigger's random delay window, and the delay each Run's occurrence drew.
-- 0 is no delay, what every trigger and Run written before had; the columns only grow the rows.
ALTER TABLE triggers ADD COLUMN jitter_ms INTEGER NOT NULL DEFAULT 0 CHECK (jitter_ms >= 0);
ALTER TABLE runs ADD COLUMN jitter_ms INTEGER NOT NULL DEFAULT 0 CHECK (jitter_ms >= 0);
