-- 0011_run_skips: a Run its task's overlap rules skip before it starts (concurrency 'forbid'
-- while another Run of the task runs, or a backlog already at [execution] max_queued) is a skip,
-- not a Run: it is recorded here with its reason, and its Run, Attempt and events leave the
-- store in the same transaction (its end event is written first, as for any Run that ends).
CREATE TABLE run_skips (
    id               INTEGER PRIMARY KEY,
    run_id           TEXT NOT NULL,
    project_id       TEXT NOT NULL,
    task_id          TEXT NOT NULL,
    trigger_id       TEXT NOT NULL,
    scheduled_for_ms INTEGER NOT NULL,
    reason           TEXT NOT NULL,
    recorded_at_ms   INTEGER NOT NULL
);

CREATE INDEX run_skips_by_recorded ON run_skips (recorded_at_ms);
