-- capability: 2
-- Schedule semantics: the publish time of each trigger revision (database time), a per-trigger
-- revision high-water mark that survives deletion, a task head that cannot point at a missing
-- revision, and the scheduler replicas' completed rounds.

-- When the schedule's trigger revision was published (database clock, written by the publisher
-- in the publish transaction). Initialisation takes the first occurrence after it. NULL on rows
-- published before this column existed: they initialise from the observation.
ALTER TABLE qinglong.trigger_schedules ADD COLUMN published_at_ms bigint;

-- The highest revision a trigger id ever had. Deleting a trigger keeps its mark, so a trigger
-- created again under the same id continues after it: (trigger_id, trigger_revision) names one
-- definition forever, and old Runs never mix with new ones.
CREATE TABLE qinglong.trigger_revision_marks (
    trigger_id     text PRIMARY KEY,
    last_revision  bigint NOT NULL CHECK (last_revision >= 1)
);
INSERT INTO qinglong.trigger_revision_marks (trigger_id, last_revision)
SELECT trigger_id, max(trigger_revision)
FROM (SELECT trigger_id, trigger_revision FROM qinglong.triggers
      UNION ALL SELECT trigger_id, trigger_revision FROM qinglong.runs
      UNION ALL SELECT trigger_id, trigger_revision FROM qinglong.schedule_skips) AS seen
GROUP BY trigger_id;

-- A task head names an existing revision. Deferred: the publisher writes the head and then the
-- revision in one transaction (the revision's own key references the head).
ALTER TABLE qinglong.tasks
    ADD CONSTRAINT tasks_head_revision_fkey FOREIGN KEY (project_id, task_id, task_revision)
    REFERENCES qinglong.task_revisions (project_id, task_id, task_revision)
    DEFERRABLE INITIALLY DEFERRED;

-- One row per scheduler replica (its owner name): when it last completed a round, in database
-- time. Readers tell from it whether a scheduler is working the store. Rows of replicas silent
-- for a week are pruned by the replicas themselves.
CREATE TABLE qinglong.scheduler_replicas (
    owner              text PRIMARY KEY,
    first_round_at_ms  bigint NOT NULL,
    last_round_at_ms   bigint NOT NULL,
    rounds             bigint NOT NULL CHECK (rounds >= 1)
);

-- Admin keeps the revision marks; runtime records and prunes its rounds. Nothing else.
GRANT SELECT, INSERT, UPDATE ON qinglong.trigger_revision_marks TO {{admin}};
GRANT SELECT, INSERT, UPDATE, DELETE ON qinglong.scheduler_replicas TO {{runtime}};
