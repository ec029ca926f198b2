-- 0007_deletions: a task or a project can be deleted while its Runs stay. Runs, Attempts and
-- their events keep naming the task revision they pinned, and task_revisions references its
-- task head, so a deleted task keeps its head row with the time it was deleted: every revision
-- stays readable (a Run still queued or running finishes on its own), and publishing the task
-- again continues its revisions instead of repeating them. A deleted project keeps its row the
-- same way, inactive.
ALTER TABLE tasks ADD COLUMN deleted_at_ms INTEGER;
ALTER TABLE projects ADD COLUMN deleted_at_ms INTEGER;
