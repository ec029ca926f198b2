-- capability: 1
-- The scheduler schema: projects, tasks with their revisions and pinned execution revisions,
-- triggers and their schedules (the row-lease state), runs, attempts, run events and skips.
-- Every time is an integer epoch millisecond (bigint); canonical JSON is kept as text next to
-- each digest so admission can re-verify the digest inside the database.

CREATE TABLE qinglong.projects (
    project_id      text PRIMARY KEY,
    name            text NOT NULL,
    active          boolean NOT NULL DEFAULT true,
    created_at_ms   bigint NOT NULL,
    updated_at_ms   bigint NOT NULL
);

CREATE TABLE qinglong.tasks (
    project_id      text NOT NULL REFERENCES qinglong.projects (project_id),
    task_id         text NOT NULL,
    task_revision   bigint NOT NULL CHECK (task_revision >= 1),
    content_digest  text NOT NULL,
    updated_at_ms   bigint NOT NULL,
    PRIMARY KEY (project_id, task_id)
);

CREATE TABLE qinglong.task_revisions (
    project_id      text NOT NULL,
    task_id         text NOT NULL,
    task_revision   bigint NOT NULL CHECK (task_revision >= 1),
    payload_json    text NOT NULL,
    content_digest  text NOT NULL,
    created_at_ms   bigint NOT NULL,
    PRIMARY KEY (project_id, task_id, task_revision),
    FOREIGN KEY (project_id, task_id) REFERENCES qinglong.tasks (project_id, task_id)
);

-- What a Run of a task revision will execute on a remote worker, pinned by digest.
CREATE TABLE qinglong.execution_revisions (
    project_id      text NOT NULL,
    task_id         text NOT NULL,
    task_revision   bigint NOT NULL,
    executor        text NOT NULL CHECK (executor = 'remote_worker'),
    spec_json       text NOT NULL,
    content_digest  text NOT NULL,
    created_at_ms   bigint NOT NULL,
    PRIMARY KEY (project_id, task_id, task_revision, executor),
    FOREIGN KEY (project_id, task_id, task_revision)
        REFERENCES qinglong.task_revisions (project_id, task_id, task_revision)
);

CREATE TABLE qinglong.triggers (
    trigger_id        text PRIMARY KEY,
    project_id        text NOT NULL REFERENCES qinglong.projects (project_id),
    task_id           text NOT NULL,
    trigger_revision  bigint NOT NULL CHECK (trigger_revision >= 1),
    kind              text NOT NULL,
    spec_json         jsonb NOT NULL,
    misfire_policy    text NOT NULL CHECK (misfire_policy IN ('skip', 'fire_once')),
    misfire_grace_ms  bigint NOT NULL CHECK (misfire_grace_ms >= 0),
    enabled           boolean NOT NULL,
    content_digest    text NOT NULL,
    updated_at_ms     bigint NOT NULL,
    FOREIGN KEY (project_id, task_id) REFERENCES qinglong.tasks (project_id, task_id)
);

-- One row per trigger head: the cursor and the four-part claim fence.
CREATE TABLE qinglong.trigger_schedules (
    trigger_id            text PRIMARY KEY REFERENCES qinglong.triggers (trigger_id),
    project_id            text NOT NULL,
    trigger_revision      bigint NOT NULL CHECK (trigger_revision >= 1),
    next_fire_at_ms       bigint,
    last_scheduled_at_ms  bigint,
    state_version         bigint NOT NULL CHECK (state_version >= 1),
    claim_owner           text,
    claim_token           uuid,
    claim_version         bigint NOT NULL CHECK (claim_version >= 0),
    claim_expires_at_ms   bigint,
    updated_at_ms         bigint NOT NULL,
    -- a claim is all three of owner, token and expiry, or none of them
    CHECK ((claim_owner IS NULL) = (claim_token IS NULL)
           AND (claim_token IS NULL) = (claim_expires_at_ms IS NULL))
);

-- The due scan reads this index in claim order.
CREATE INDEX trigger_schedules_due
    ON qinglong.trigger_schedules (next_fire_at_ms NULLS FIRST, project_id, trigger_id);

CREATE TABLE qinglong.runs (
    run_id            uuid PRIMARY KEY,
    project_id        text NOT NULL REFERENCES qinglong.projects (project_id),
    trigger_id        text NOT NULL,
    trigger_revision  bigint NOT NULL,
    task_id           text NOT NULL,
    task_revision     bigint NOT NULL,
    executor          text NOT NULL,
    execution_digest  text NOT NULL,
    scheduled_for_ms  bigint NOT NULL,
    admitted_at_ms    bigint NOT NULL,
    queued_at_ms      bigint,
    state             text NOT NULL
        CHECK (state IN ('queued', 'dispatching', 'running', 'succeeded', 'failed', 'cancelled')),
    owned_by          text NOT NULL CHECK (owned_by IN ('runtime', 'operator')),
    cancelled         boolean NOT NULL DEFAULT false,
    idempotency_key   text NOT NULL UNIQUE,
    admitted_by       text NOT NULL,
    FOREIGN KEY (project_id, task_id, task_revision, executor)
        REFERENCES qinglong.execution_revisions (project_id, task_id, task_revision, executor)
);
CREATE INDEX runs_recent ON qinglong.runs (admitted_at_ms DESC);
CREATE INDEX runs_trigger_recent ON qinglong.runs (trigger_id, admitted_at_ms DESC);
CREATE INDEX runs_in_flight ON qinglong.runs (run_id) WHERE state IN ('queued', 'dispatching', 'running');

CREATE TABLE qinglong.attempts (
    attempt_id             uuid PRIMARY KEY,
    run_id                 uuid NOT NULL REFERENCES qinglong.runs (run_id),
    attempt_no             integer NOT NULL CHECK (attempt_no >= 1),
    state                  text NOT NULL
        CHECK (state IN ('claimed', 'offered', 'running', 'succeeded', 'failed', 'abandoned')),
    executor               text NOT NULL,
    created_at_ms          bigint NOT NULL,
    worker_id              text,
    session_id             text,
    lease_id               text,
    lease_expires_at_ms    bigint,
    offer_id               text,
    offered_at_ms          bigint,
    callback_token_digest  text,
    started_at_ms          bigint,
    finished_at_ms         bigint,
    result_json            jsonb,
    error_code             text,
    error_message          text,
    UNIQUE (run_id, attempt_no)
);

CREATE TABLE qinglong.run_events (
    event_id    uuid PRIMARY KEY,
    run_id      uuid NOT NULL REFERENCES qinglong.runs (run_id),
    seq         integer NOT NULL,
    event_type  text NOT NULL,
    at_ms       bigint NOT NULL,
    UNIQUE (run_id, seq)
);

CREATE TABLE qinglong.schedule_skips (
    skip_id            uuid PRIMARY KEY,
    project_id         text NOT NULL,
    trigger_id         text NOT NULL,
    trigger_revision   bigint NOT NULL,
    policy             text NOT NULL CHECK (policy IN ('skip', 'fire_once')),
    first_skipped_ms   bigint NOT NULL,
    last_skipped_ms    bigint NOT NULL,
    skipped_count      bigint NOT NULL CHECK (skipped_count >= 1),
    count_exact        boolean NOT NULL,
    recorded_at_ms     bigint NOT NULL
);
CREATE INDEX schedule_skips_recent ON qinglong.schedule_skips (recorded_at_ms DESC);
