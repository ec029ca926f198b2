-- capability: 4
-- A task or a project can be deleted while its Runs stay. Runs reference their execution
-- revision, which references its task revision and task head, so a deleted task keeps its head
-- row with the time it was deleted: every revision stays (a Run still queued or leased finishes
-- on the one it pinned), and publishing the task again continues its revisions. A deleted
-- project keeps its row the same way, inactive. The admin role already updates both tables.
ALTER TABLE qinglong.tasks ADD COLUMN deleted_at_ms bigint;
ALTER TABLE qinglong.projects ADD COLUMN deleted_at_ms bigint;
