-- capability: 1
-- The exact privileges of the three non-owner roles (the owner owns every object). Readiness
-- compares the catalog with roles.EXPECTED_GRANTS and fails on any difference, so a change here
-- must change that table too.

REVOKE ALL ON SCHEMA qinglong FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA qinglong FROM PUBLIC;
GRANT USAGE ON SCHEMA qinglong TO {{admin}}, {{runtime}}, {{worker_ingress}};

-- Admin publishes projects, tasks and triggers and creates, resets and deletes schedule rows.
GRANT SELECT ON qinglong.schema_migrations TO {{admin}};
GRANT SELECT, INSERT, UPDATE ON qinglong.projects TO {{admin}};
GRANT SELECT, INSERT, UPDATE ON qinglong.tasks TO {{admin}};
GRANT SELECT, INSERT ON qinglong.task_revisions TO {{admin}};
GRANT SELECT, INSERT ON qinglong.execution_revisions TO {{admin}};
GRANT SELECT, INSERT, UPDATE, DELETE ON qinglong.triggers TO {{admin}};
GRANT SELECT, INSERT, UPDATE, DELETE ON qinglong.trigger_schedules TO {{admin}};

-- Runtime claims and advances schedules (never creates or deletes them) and admits Runs.
GRANT SELECT ON qinglong.schema_migrations TO {{runtime}};
GRANT SELECT ON qinglong.projects, qinglong.tasks, qinglong.task_revisions,
                qinglong.execution_revisions, qinglong.triggers TO {{runtime}};
GRANT SELECT, UPDATE ON qinglong.trigger_schedules TO {{runtime}};
GRANT SELECT, INSERT ON qinglong.runs, qinglong.attempts, qinglong.run_events,
                        qinglong.schedule_skips TO {{runtime}};

-- Worker ingress: schema usage only; no privilege on any table of scheduler state.
