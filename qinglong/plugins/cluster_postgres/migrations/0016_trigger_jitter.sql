-- capability: 14
-- A trigger's random delay window, and the delay each Run's occurrence drew
-- (qinglong/contracts/jitter.py). 0 is no delay, what every trigger and Run written before had;
-- a constant default adds the columns without rewriting either table.
ALTER TABLE qinglong.triggers ADD COLUMN jitter_ms bigint NOT NULL DEFAULT 0
    CONSTRAINT triggers_jitter_ms_check CHECK (jitter_ms >= 0);
ALTER TABLE qinglong.runs ADD COLUMN jitter_ms bigint NOT NULL DEFAULT 0
    CONSTRAINT runs_jitter_ms_check CHECK (jitter_ms >= 0);
