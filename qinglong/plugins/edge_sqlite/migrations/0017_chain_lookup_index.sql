-- 0017_chain_lookup_index: a Run's end looks up the 'after' triggers that follow its task
-- (chain_triggers_of). triggers_by_project made it read every trigger of the project: 10,000 cron
-- triggers cost each Run's end 10,000 rows (about 5 ms of CPU) inside its write transaction. This
-- partial index holds the 'after' triggers alone, keyed by the task they follow and in the order
-- the lookup admits them (so the planner need not sort, and prefers it).
CREATE INDEX triggers_after_by_upstream
    ON triggers (project_id, json_extract(spec_json, '$.task'), trigger_id)
    WHERE kind = 'after';
