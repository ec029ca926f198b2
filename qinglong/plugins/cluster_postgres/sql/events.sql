-- The outbox (events.py), as the runtime role: routing events to channels, claiming the
-- deliveries due (held by a lease, so two replicas never send one together), recording each
-- try. The scans read partial indexes of what waits, never the history.

-- name: events_unrouted
-- Events not routed yet, in seq order; another replica routing them meanwhile is skipped.
SELECT o.seq, o.event_id::text AS event_id, o.kind, o.subject, o.project_id, o.task_id,
       o.trigger_id, o.run_id::text AS run_id, o.state, o.exit_code, o.duration_ms, o.reason,
       o.notify_json, o.detail_json, o.at_ms
FROM qinglong.event_outbox o
WHERE o.routed_at_ms IS NULL
ORDER BY o.seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: events_insert_delivery
-- One pending delivery of an event on a channel (routing it again creates nothing).
INSERT INTO qinglong.event_deliveries (event_seq, channel, subject, state, next_try_at_ms,
                                       created_at_ms)
VALUES (%(seq)s, %(channel)s, %(subject)s, 'pending', %(now)s, %(now)s)
ON CONFLICT DO NOTHING;

-- name: events_mark_routed
-- An event routed: its deliveries exist (or it has none).
UPDATE qinglong.event_outbox SET routed_at_ms = %(now)s
WHERE seq = %(seq)s AND routed_at_ms IS NULL;

-- name: events_claim_due
-- Pending deliveries that head their channel and subject, due and not held, oldest first; each
-- is held until %(until)s.
WITH due AS (
    SELECT d.event_seq, d.channel
    FROM qinglong.event_deliveries d
    WHERE d.state = 'pending' AND d.next_try_at_ms <= %(now)s
      AND (d.lease_until_ms IS NULL OR d.lease_until_ms <= %(now)s)
      AND NOT EXISTS (SELECT 1 FROM qinglong.event_deliveries e
                      WHERE e.state = 'pending' AND e.channel = d.channel
                        AND e.subject = d.subject AND e.event_seq < d.event_seq)
    ORDER BY d.event_seq, d.channel
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE qinglong.event_deliveries d SET lease_until_ms = %(until)s
FROM due
WHERE d.event_seq = due.event_seq AND d.channel = due.channel
RETURNING d.event_seq, d.channel;

-- name: events_deliveries_by_key
-- Deliveries with their events, by (seq, channel) pairs.
SELECT d.channel, d.state AS delivery_state, d.tries, d.next_try_at_ms, d.last_error,
       d.delivered_at_ms, d.created_at_ms,
       o.seq, o.event_id::text AS event_id, o.kind, o.subject, o.project_id, o.task_id,
       o.trigger_id, o.run_id::text AS run_id, o.state, o.exit_code, o.duration_ms, o.reason,
       o.notify_json, o.detail_json, o.at_ms
FROM qinglong.event_deliveries d
JOIN qinglong.event_outbox o ON o.seq = d.event_seq
WHERE (d.event_seq, d.channel) IN (SELECT * FROM unnest(%(seqs)s::bigint[], %(channels)s::text[]))
ORDER BY d.event_seq, d.channel;

-- name: events_record_try
-- One try of a pending delivery (identified by its event's id): delivered, pending again at
-- %(next)s, or dead. Returns the delivery's state after (a row even when nothing changed).
WITH target AS (
    SELECT d.event_seq, d.channel
    FROM qinglong.event_deliveries d
    JOIN qinglong.event_outbox o ON o.seq = d.event_seq
    WHERE o.event_id = %(event_id)s::uuid AND d.channel = %(channel)s
),
moved AS (
    UPDATE qinglong.event_deliveries d
    SET state = %(state)s, tries = d.tries + 1,
        next_try_at_ms = coalesce(%(next)s::bigint, d.next_try_at_ms),
        lease_until_ms = NULL, last_error = %(error)s,
        delivered_at_ms = CASE WHEN %(state)s = 'delivered' THEN %(now)s::bigint END
    FROM target t
    WHERE d.event_seq = t.event_seq AND d.channel = t.channel AND d.state = 'pending'
    RETURNING d.state
)
SELECT coalesce((SELECT m.state FROM moved m),
                (SELECT d.state FROM qinglong.event_deliveries d JOIN target t
                   ON d.event_seq = t.event_seq AND d.channel = t.channel)) AS state;

-- name: events_list_deliveries
-- Deliveries newest first, optionally of one state.
SELECT d.channel, d.state AS delivery_state, d.tries, d.next_try_at_ms, d.last_error,
       d.delivered_at_ms, d.created_at_ms,
       o.seq, o.event_id::text AS event_id, o.kind, o.subject, o.project_id, o.task_id,
       o.trigger_id, o.run_id::text AS run_id, o.state, o.exit_code, o.duration_ms, o.reason,
       o.notify_json, o.detail_json, o.at_ms
FROM qinglong.event_deliveries d
JOIN qinglong.event_outbox o ON o.seq = d.event_seq
WHERE (%(state)s::text IS NULL OR d.state = %(state)s::text)
ORDER BY d.event_seq DESC, d.channel
LIMIT %(limit)s;

-- name: events_list
-- Events newest first.
SELECT o.seq, o.event_id::text AS event_id, o.kind, o.subject, o.project_id, o.task_id,
       o.trigger_id, o.run_id::text AS run_id, o.state, o.exit_code, o.duration_ms, o.reason,
       o.notify_json, o.detail_json, o.at_ms
FROM qinglong.event_outbox o
ORDER BY o.seq DESC
LIMIT %(limit)s;

-- name: events_run_context
-- A Run's last Attempt (its shipped log's size) and its task revision's payload (the env).
SELECT a.attempt_id::text AS attempt_id,
       (SELECT coalesce(max(l.offset_bytes + octet_length(l.data)), 0)
          FROM qinglong.attempt_logs l WHERE l.attempt_id = a.attempt_id) AS stored_bytes,
       v.payload_json, r.project_id, r.task_id
FROM qinglong.runs r
LEFT JOIN LATERAL (SELECT x.attempt_id FROM qinglong.attempts x WHERE x.run_id = r.run_id
                   ORDER BY x.attempt_no DESC LIMIT 1) a ON true
LEFT JOIN qinglong.task_revisions v
  ON v.project_id = r.project_id AND v.task_id = r.task_id AND v.task_revision = r.task_revision
WHERE r.run_id = %(run_id)s::uuid;

-- name: occurrence_admit
-- One queued Run of a trigger for an event source's occurrence, in one statement (one snapshot):
-- only while the trigger is of the kind, enabled, in an active project with a live task (its
-- task head pinned), with its payload (handed to the worker with each claim of the Run); a second
-- admission of the key inserts nothing. Returns the Run created, the Run that held the key
-- before (or its skip record), and whether the trigger admits at all.
WITH t AS (
    SELECT tr.trigger_id, tr.trigger_revision, tr.project_id, tr.task_id, k.task_revision,
           e.content_digest
    FROM qinglong.triggers tr
    JOIN qinglong.projects p ON p.project_id = tr.project_id
    JOIN qinglong.tasks k ON k.project_id = tr.project_id AND k.task_id = tr.task_id
    JOIN qinglong.execution_revisions e
      ON e.project_id = k.project_id AND e.task_id = k.task_id
     AND e.task_revision = k.task_revision AND e.executor = 'remote_worker'
    WHERE tr.trigger_id = %(trigger_id)s AND tr.kind = %(kind)s AND tr.enabled
      AND p.active AND p.deleted_at_ms IS NULL AND k.deleted_at_ms IS NULL
),
run AS (
    INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                               task_revision, executor, execution_digest, scheduled_for_ms,
                               admitted_at_ms, queued_at_ms, state, owned_by, cancelled,
                               idempotency_key, admitted_by, max_queued)
    SELECT %(run_id)s::uuid, t.project_id, t.trigger_id, t.trigger_revision, t.task_id,
           t.task_revision, 'remote_worker', t.content_digest, %(now)s, %(now)s, %(now)s,
           'queued', 'runtime', false, %(key)s, 'event-source', %(max_queued)s::integer
    FROM t
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING run_id, admitted_at_ms
),
attempt AS (
    INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor, created_at_ms)
    SELECT %(attempt_id)s::uuid, r.run_id, 1, 'claimed', 'remote_worker', r.admitted_at_ms
    FROM run r
    RETURNING attempt_id
),
events AS (
    INSERT INTO qinglong.run_events (event_id, run_id, seq, event_type, at_ms)
    SELECT gen_random_uuid(), r.run_id, ev.seq, ev.event_type, r.admitted_at_ms
    FROM run r CROSS JOIN (VALUES (1, 'run.created'), (2, 'run.queued')) AS ev (seq, event_type)
    RETURNING event_id
),
payload AS (
    INSERT INTO qinglong.run_event_payloads (run_id, payload_json)
    SELECT r.run_id, %(payload)s::text FROM run r WHERE %(payload)s::text IS NOT NULL
    RETURNING run_id
)
SELECT (SELECT r.run_id::text FROM run r) AS created,
       coalesce((SELECT x.run_id::text FROM qinglong.runs x WHERE x.idempotency_key = %(key)s),
                (SELECT k.run_id::text FROM qinglong.run_skips k WHERE k.idempotency_key = %(key)s))
           AS existing,
       (SELECT count(*) FROM t) AS admits,
       (SELECT count(*) FROM attempt) + (SELECT count(*) FROM events)
           + (SELECT count(*) FROM payload) AS written;

-- name: events_prune
-- Ended deliveries of events older than %(before)s, then those events once no delivery is left
-- (a pending one keeps its event); a bounded batch, oldest first; and the once-keys of lost
-- workers' events as old. The number of events deleted.
WITH old AS (
    SELECT o.seq FROM qinglong.event_outbox o
    WHERE o.at_ms < %(before)s AND o.routed_at_ms IS NOT NULL
    ORDER BY o.seq LIMIT %(limit)s
),
gone AS (
    DELETE FROM qinglong.event_deliveries d USING old
    WHERE d.event_seq = old.seq AND d.state <> 'pending'
    RETURNING d.event_seq
),
kept AS (
    SELECT DISTINCT d.event_seq FROM qinglong.event_deliveries d JOIN old ON d.event_seq = old.seq
    WHERE d.state = 'pending'
),
events AS (
    DELETE FROM qinglong.event_outbox o USING old
    WHERE o.seq = old.seq AND old.seq NOT IN (SELECT event_seq FROM kept)
    RETURNING o.seq
),
lost AS (
    -- the keys that made a lost worker's event once: its Attempts ended long ago
    DELETE FROM qinglong.operator_episodes e
    WHERE e.episode_key IN (SELECT x.episode_key FROM qinglong.operator_episodes x
                            WHERE x.kind = 'worker.lost' AND x.opened_at_ms < %(before)s
                            LIMIT %(limit)s)
    RETURNING 1
)
SELECT count(*) AS deleted FROM events;

-- name: events_operator_episode
-- Open or close an operator episode (one event each time it changes; see the function).
SELECT qinglong.operator_episode(%(key)s::text, %(kind)s::text, %(active)s::boolean,
                                 %(subject)s::text, %(reason)s::text, %(detail)s::jsonb) AS written;

-- name: events_stranded_runs
-- Queued Runs no live worker can take past the grace; opens or closes queue.stalled.
SELECT qinglong.check_stranded_runs(%(grace_ms)s::bigint) AS stranded;
