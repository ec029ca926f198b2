-- 0003_revision_integrity: a schedule row remembers when its revision was published; a trigger
-- id's revisions never repeat, even after a delete; a task head always names a stored revision;
-- startup recovery reads only the Runs still in flight.

-- Initialisation counts a revision's first occurrence from its publish time (process clock of
-- the publisher). Rows written before this column existed take their revision's head time, which
-- the publisher wrote in the same transaction.
ALTER TABLE trigger_schedules ADD COLUMN published_at_ms INTEGER;

UPDATE trigger_schedules
   SET published_at_ms = (SELECT t.updated_at_ms FROM triggers AS t
                           WHERE t.trigger_id = trigger_schedules.trigger_id
                             AND t.trigger_revision = trigger_schedules.trigger_revision);

-- The highest revision ever published under a trigger id. It outlives the trigger head, so a
-- trigger deleted and created again continues its revisions and (trigger_id, trigger_revision)
-- keeps naming one definition (and its idempotency keys stay unique). Seeded from every place a
-- revision is recorded: heads, Runs and skipped ranges of triggers deleted earlier.
CREATE TABLE trigger_revision_marks (
    trigger_id    TEXT PRIMARY KEY,
    high_revision INTEGER NOT NULL CHECK (high_revision >= 1)
);

INSERT INTO trigger_revision_marks (trigger_id, high_revision)
SELECT trigger_id, max(revision)
  FROM (SELECT trigger_id, trigger_revision AS revision FROM triggers
        UNION ALL
        SELECT trigger_id, max(trigger_revision) FROM runs GROUP BY trigger_id
        UNION ALL
        SELECT trigger_id, max(trigger_revision) FROM schedule_skips GROUP BY trigger_id)
 GROUP BY trigger_id;

-- A task head must name a stored revision with the same content. SQLite adds a foreign key only
-- by rebuilding the table; the key is deferred because the publisher writes the head before the
-- revision (the revision references the head). The dropped table's rows count as violations
-- until the same keys are inserted again, so the copy is re-inserted into a table of the same name.
-- A head that already names a missing revision (written by hand, or by a bug) gets that revision
-- from its own content: the head is what the scheduler pinned Runs to.
INSERT INTO task_revisions (project_id, task_id, task_revision, payload_json, content_digest,
                            created_at_ms)
SELECT k.project_id, k.task_id, k.task_revision, k.payload_json, k.content_digest, k.updated_at_ms
  FROM tasks AS k
 WHERE NOT EXISTS (SELECT 1 FROM task_revisions AS r
                    WHERE r.project_id = k.project_id AND r.task_id = k.task_id
                      AND r.task_revision = k.task_revision);

CREATE UNIQUE INDEX task_revisions_by_digest
    ON task_revisions (project_id, task_id, task_revision, content_digest);

PRAGMA defer_foreign_keys = ON;

CREATE TABLE tasks_before_0003 AS SELECT * FROM tasks;

DROP TABLE tasks;

CREATE TABLE tasks (
    project_id     TEXT NOT NULL REFERENCES projects (project_id),
    task_id        TEXT NOT NULL,
    task_revision  INTEGER NOT NULL CHECK (task_revision >= 1),
    payload_json   TEXT NOT NULL,
    content_digest TEXT NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (project_id, task_id),
    FOREIGN KEY (project_id, task_id, task_revision, content_digest)
        REFERENCES task_revisions (project_id, task_id, task_revision, content_digest)
        DEFERRABLE INITIALLY DEFERRED
);

INSERT INTO tasks (project_id, task_id, task_revision, payload_json, content_digest, updated_at_ms)
SELECT project_id, task_id, task_revision, payload_json, content_digest, updated_at_ms
  FROM tasks_before_0003;

DROP TABLE tasks_before_0003;

-- Startup recovery looks only at Runs that are not finished; finished ones are most of the table.
CREATE INDEX runs_in_flight ON runs (state)
    WHERE state NOT IN ('succeeded', 'failed', 'cancelled');
