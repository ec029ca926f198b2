-- capability: 29
-- A Run's end looks up the 'after' triggers that follow its task (_chain_after_end). Triggers had
-- no index but their primary key, so every end read every trigger of the cluster: 10,000 cron
-- triggers cost each completion a scan of 10,000 rows inside the worker's transaction. This
-- partial index holds the 'after' triggers alone, keyed by the task they follow and in the order
-- the lookup admits them, so an end reads only the triggers it may start.
CREATE INDEX triggers_after_by_upstream
    ON qinglong.triggers (project_id, (spec_json ->> 'task'), trigger_id)
    WHERE kind = 'after';
