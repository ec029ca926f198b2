-- capability: 9
-- Each task's outcome figures (its last outcome, failure streak, success ratio) are read by
-- /metrics and `qinglong status` from a task's ended Runs, newest first, through this index: a
-- few index reads per task, whatever the history's size.
CREATE INDEX runs_ended_by_task ON qinglong.runs (project_id, task_id, finished_at_ms)
    WHERE finished_at_ms IS NOT NULL;
