-- 0001_initial: projects, tasks with their revisions, triggers, schedule cursors, runs, attempts
-- and run events. The shape is shared with the PostgreSQL backend; times are epoch milliseconds.

CREATE TABLE projects (
    project_id    TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    active        INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1)),
    created_at_ms INTEGER NOT NULL
);

-- The head revision of each task; every revision ever published is kept in task_revisions.
CREATE TABLE tasks (
    project_id     TEXT NOT NULL REFERENCES projects (project_id),
    task_id        TEXT NOT NULL,
    task_revision  INTEGER NOT NULL CHECK (task_revision >= 1),
    payload_json   TEXT NOT NULL,
    content_digest TEXT NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (project_id, task_id)
);

CREATE TABLE task_revisions (
    project_id     TEXT NOT NULL,
    task_id        TEXT NOT NULL,
    task_revision  INTEGER NOT NULL,
    payload_json   TEXT NOT NULL,
    content_digest TEXT NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (project_id, task_id, task_revision),
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, task_id)
);

-- trigger_id is globally unique: the idempotency key names the trigger but not its project.
CREATE TABLE triggers (
    trigger_id       TEXT PRIMARY KEY,
    project_id       TEXT NOT NULL REFERENCES projects (project_id),
    task_id          TEXT NOT NULL,
    trigger_revision INTEGER NOT NULL CHECK (trigger_revision >= 1),
    kind             TEXT NOT NULL,
    spec_json        TEXT NOT NULL,
    misfire_policy   TEXT NOT NULL CHECK (misfire_policy IN ('skip', 'fire_once')),
    misfire_grace_ms INTEGER NOT NULL CHECK (misfire_grace_ms >= 0),
    enabled          INTEGER NOT NULL CHECK (enabled IN (0, 1)),
    content_digest   TEXT NOT NULL,
    updated_at_ms    INTEGER NOT NULL,
    FOREIGN KEY (project_id, task_id) REFERENCES tasks (project_id, task_id)
);

CREATE INDEX triggers_by_project ON triggers (project_id, trigger_id);

-- One cursor per trigger head. NULL next_fire_at_ms means awaiting initialisation.
CREATE TABLE trigger_schedules (
    trigger_id           TEXT PRIMARY KEY REFERENCES triggers (trigger_id) ON DELETE CASCADE,
    project_id           TEXT NOT NULL,
    trigger_revision     INTEGER NOT NULL,
    next_fire_at_ms      INTEGER,
    last_scheduled_at_ms INTEGER,
    state_version        INTEGER NOT NULL,
    updated_at_ms        INTEGER NOT NULL
);

-- Serves the due scan: ORDER BY next_fire_at_ms NULLS FIRST, project_id, trigger_id LIMIT page.
CREATE INDEX trigger_schedules_due
    ON trigger_schedules (next_fire_at_ms, project_id, trigger_id);

-- Runs keep no foreign key to triggers: a deleted trigger's Runs stay.
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    project_id       TEXT NOT NULL,
    trigger_id       TEXT NOT NULL,
    trigger_revision INTEGER NOT NULL,
    task_id          TEXT NOT NULL,
    task_revision    INTEGER NOT NULL,
    task_digest      TEXT NOT NULL,
    scheduled_for_ms INTEGER NOT NULL,
    admitted_at_ms   INTEGER NOT NULL,
    queued_at_ms     INTEGER,
    state            TEXT NOT NULL
        CHECK (state IN ('queued', 'dispatching', 'running', 'succeeded', 'failed', 'cancelled')),
    idempotency_key  TEXT NOT NULL UNIQUE
);

CREATE TABLE attempts (
    attempt_id       TEXT PRIMARY KEY,
    run_id           TEXT NOT NULL REFERENCES runs (run_id),
    attempt_no       INTEGER NOT NULL CHECK (attempt_no >= 1),
    state            TEXT NOT NULL,
    executor         TEXT NOT NULL,
    execution_digest TEXT NOT NULL,
    worker_id        TEXT,
    session_id       TEXT,
    lease_id         TEXT,
    offer_id         TEXT,
    callback_token   TEXT,
    started_at_ms    INTEGER,
    finished_at_ms   INTEGER,
    result_json      TEXT,
    error_json       TEXT,
    created_at_ms    INTEGER NOT NULL,
    UNIQUE (run_id, attempt_no)
);

-- event_id is the rowid: events are never deleted, so ids are never reused without the cost of
-- AUTOINCREMENT's sqlite_sequence write on every insert.
CREATE TABLE run_events (
    event_id INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL REFERENCES runs (run_id),
    seq      INTEGER NOT NULL,
    type     TEXT NOT NULL,
    at_ms    INTEGER NOT NULL,
    UNIQUE (run_id, seq)
);
