-- 0004_local_execution: Runs are executed here. A Run may be in every state of the execution
-- state machine (retry_wait, timed_out, lost besides the earlier ones) and remembers when and why
-- it ended; an Attempt records its process (directory, durable handle, deadline), a durable cancel
-- request, its exit status and log size; a manual Run's idempotency key outlives the Run; and the
-- dispatcher's queries read partial indexes whose size is what is waiting or active, never the
-- whole history. Runs admitted before (for a remote worker an edge store never had) end
-- cancelled, with the reason.

-- Attempts only gain columns (no constraint changes), so no rebuild is needed.
-- not_before_ms: a retry's backoff (NULL: due at once). attempt_dir: the directory the process
-- uses (log, receipt, pid, lock), recorded before it is spawned. handle_json: the process's
-- durable handle (boot id, pid, process group, start time). deadline_ms: when its timeout expires.
ALTER TABLE attempts ADD COLUMN not_before_ms INTEGER;
ALTER TABLE attempts ADD COLUMN attempt_dir TEXT;
ALTER TABLE attempts ADD COLUMN handle_json TEXT;
ALTER TABLE attempts ADD COLUMN deadline_ms INTEGER;
ALTER TABLE attempts ADD COLUMN dispatched_at_ms INTEGER;
ALTER TABLE attempts ADD COLUMN cancel_reason TEXT
    CHECK (cancel_reason IN ('timeout', 'operator', 'replaced', 'shutdown'));
ALTER TABLE attempts ADD COLUMN cancel_requested_at_ms INTEGER;
ALTER TABLE attempts ADD COLUMN exit_code INTEGER;
ALTER TABLE attempts ADD COLUMN signal INTEGER;
ALTER TABLE attempts ADD COLUMN log_bytes INTEGER;
ALTER TABLE attempts ADD COLUMN log_dropped_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN log_deleted_at_ms INTEGER;
ALTER TABLE attempts ADD COLUMN reason TEXT;

-- A manual Run's idempotency key, kept after its Run is pruned, so the same key keeps admitting
-- nothing. (A trigger's occurrence needs no such row: its schedule's cursor has passed it.)
CREATE TABLE manual_run_keys (
    idempotency_key TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    project_id      TEXT NOT NULL,
    task_id         TEXT NOT NULL,
    created_at_ms   INTEGER NOT NULL
) WITHOUT ROWID;

-- Runs admitted before this version were claimed for a remote worker that an edge store never
-- had: nothing was ever going to run them. Starting that backlog now (a per-second trigger leaves
-- 86,400 a day) would run stale occurrences late, against their misfire policy. They end
-- cancelled, saying why, at the migration's time (so retention prunes them like any other): their
-- Attempt here, their run.finished event here, the Run itself in the copy below. The old
-- runs_in_flight index finds them (its predicate is repeated so that SQLite may use it).
UPDATE attempts
   SET state = 'cancelled',
       finished_at_ms = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       reason = 'admitted before this store executed runs; no worker was going to run it'
 WHERE state = 'claimed' AND executor = 'remote_worker'
   AND run_id IN (SELECT run_id FROM runs
                   WHERE state = 'queued' AND state NOT IN ('succeeded', 'failed', 'cancelled'));

INSERT INTO run_events (run_id, seq, type, at_ms)
SELECT r.run_id, (SELECT max(e.seq) FROM run_events AS e WHERE e.run_id = r.run_id) + 1,
       'run.finished', CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
  FROM runs AS r
 WHERE r.state = 'queued' AND r.state NOT IN ('succeeded', 'failed', 'cancelled')
   AND EXISTS (SELECT 1 FROM attempts AS a WHERE a.run_id = r.run_id AND a.state = 'cancelled'
                                            AND a.executor = 'remote_worker')
   AND EXISTS (SELECT 1 FROM run_events AS e WHERE e.run_id = r.run_id);

-- The Runs' state CHECK can only change by rebuilding the table (as in 0003). attempts and
-- run_events reference runs: with the keys deferred, the dropped table's rows count as violations
-- until the same keys are inserted again, so the copy goes back into a table of the same name,
-- each row under its old rowid (listings read insertion order from it). A Run already in a
-- terminal state gets its admission time as its finish time, so pruning can find it; a Run
-- whose Attempt was just cancelled above ends cancelled now.
-- A manual Run (admitted by `task run`, not by a trigger) has trigger_id '' and
-- trigger_revision 0: no trigger id is empty and revisions start at 1.
PRAGMA defer_foreign_keys = ON;

CREATE TABLE runs_before_0004 AS
SELECT rowid AS old_rowid, *,
       (state = 'queued'
        AND EXISTS (SELECT 1 FROM attempts AS a WHERE a.run_id = runs.run_id
                       AND a.state = 'cancelled' AND a.executor = 'remote_worker')) AS unrunnable
  FROM runs;

DROP TABLE runs;

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
        CHECK (state IN ('queued', 'dispatching', 'running', 'retry_wait', 'succeeded', 'failed',
                         'timed_out', 'cancelled', 'lost')),
    idempotency_key  TEXT NOT NULL UNIQUE,
    finished_at_ms   INTEGER,
    reason           TEXT,
    -- a Run still in flight has not finished (the store writes a finish with every terminal state)
    CHECK (finished_at_ms IS NULL OR state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost'))
);

INSERT INTO runs (rowid, run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                  task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state,
                  idempotency_key, finished_at_ms, reason)
SELECT old_rowid, run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
       task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms,
       CASE WHEN unrunnable THEN 'cancelled' ELSE state END,
       idempotency_key,
       CASE WHEN unrunnable THEN CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
            WHEN state IN ('succeeded', 'failed', 'cancelled') THEN admitted_at_ms END,
       CASE WHEN unrunnable
            THEN 'admitted before this store executed runs; no worker was going to run it' END
  FROM runs_before_0004
 ORDER BY old_rowid;

DROP TABLE runs_before_0004;

-- Dropping the table dropped its indexes: 0002's by-trigger index comes back unchanged.
CREATE INDEX runs_by_trigger ON runs (trigger_id, scheduled_for_ms);

-- Startup recovery and the reconciler look only at Runs that are not finished.
CREATE INDEX runs_in_flight ON runs (state)
    WHERE state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost');

-- The dispatcher's scan: Runs waiting for an Attempt to start, in dispatch order. The order's
-- columns live on the Run, so the index is the Run's; its size is the backlog, not the history.
CREATE INDEX runs_dispatchable ON runs (scheduled_for_ms, admitted_at_ms, run_id)
    WHERE state IN ('queued', 'retry_wait');

-- Pruning: finished Runs, oldest finish first.
CREATE INDEX runs_finished ON runs (finished_at_ms)
    WHERE finished_at_ms IS NOT NULL;

-- Listings: newest first, of one task or of all.
CREATE INDEX runs_by_task ON runs (project_id, task_id, scheduled_for_ms, admitted_at_ms);
CREATE INDEX runs_by_time ON runs (scheduled_for_ms, admitted_at_ms);

-- Attempts holding (or maybe holding) a process: what the reconciler and the dispatcher's
-- running count read.
CREATE INDEX attempts_active ON attempts (state)
    WHERE state IN ('dispatching', 'running');

-- Log retention: ended Attempts whose log still exists, oldest end first.
CREATE INDEX attempts_log_kept ON attempts (finished_at_ms)
    WHERE finished_at_ms IS NOT NULL AND attempt_dir IS NOT NULL AND log_deleted_at_ms IS NULL;
