-- The outbox (events.py): routing events to channels, claiming the deliveries due, recording
-- each try. Every scan reads a partial index of what waits (event_outbox_unrouted,
-- event_deliveries_pending), never the history.

-- name: events_unrouted
-- Events not routed yet, in seq order.
SELECT * FROM event_outbox INDEXED BY event_outbox_unrouted
 WHERE routed_at_ms IS NULL ORDER BY seq LIMIT :limit;

-- name: events_insert_delivery
-- One pending delivery of an event on a channel (routing it again creates nothing).
INSERT OR IGNORE INTO event_deliveries (event_seq, channel, subject, state, next_try_at_ms,
                                        created_at_ms)
VALUES (:seq, :channel, :subject, 'pending', :now, :now);

-- name: events_mark_routed
-- An event routed: its deliveries exist (or it has none).
UPDATE event_outbox SET routed_at_ms = :now WHERE seq = :seq AND routed_at_ms IS NULL;

-- name: events_due
-- Pending deliveries that head their channel and subject (no earlier pending one), due and not
-- held by a sender, oldest event first.
SELECT d.event_seq, d.channel
  FROM event_deliveries AS d INDEXED BY event_deliveries_pending
 WHERE d.state = 'pending' AND d.next_try_at_ms <= :now
   AND (d.lease_until_ms IS NULL OR d.lease_until_ms <= :now)
   AND NOT EXISTS (SELECT 1 FROM event_deliveries AS e INDEXED BY event_deliveries_pending
                    WHERE e.state = 'pending' AND e.channel = d.channel
                      AND e.subject = d.subject AND e.event_seq < d.event_seq)
 ORDER BY d.event_seq, d.channel
 LIMIT :limit;

-- name: events_hold
-- Hold a claimed delivery for its sender until :until.
UPDATE event_deliveries SET lease_until_ms = :until
 WHERE event_seq = :seq AND channel = :channel AND state = 'pending';

-- name: events_delivery
-- One delivery with its event.
SELECT d.channel, d.state AS delivery_state, d.tries, d.next_try_at_ms, d.last_error,
       d.delivered_at_ms, d.created_at_ms, o.*
  FROM event_deliveries AS d JOIN event_outbox AS o ON o.seq = d.event_seq
 WHERE d.event_seq = :seq AND d.channel = :channel;

-- name: events_seq_of
-- The seq of an event, by its id.
SELECT seq FROM event_outbox WHERE event_id = :event_id;

-- name: events_record_try
-- One try of a pending delivery: delivered, pending again at :next, or dead.
UPDATE event_deliveries
   SET state = :state, tries = tries + 1, next_try_at_ms = COALESCE(:next, next_try_at_ms),
       lease_until_ms = NULL, last_error = :error,
       delivered_at_ms = CASE WHEN :state = 'delivered' THEN :now END
 WHERE event_seq = :seq AND channel = :channel AND state = 'pending';

-- name: events_list_deliveries
-- Deliveries newest first, optionally of one state.
SELECT d.channel, d.state AS delivery_state, d.tries, d.next_try_at_ms, d.last_error,
       d.delivered_at_ms, d.created_at_ms, o.*
  FROM event_deliveries AS d JOIN event_outbox AS o ON o.seq = d.event_seq
 WHERE (:state IS NULL OR d.state = :state)
 ORDER BY d.event_seq DESC, d.channel
 LIMIT :limit;

-- name: events_list
-- Events newest first.
SELECT * FROM event_outbox ORDER BY seq DESC LIMIT :limit;

-- name: events_run_context
-- A Run's last Attempt's directory and its task revision's payload (the env to redact).
SELECT a.attempt_dir, v.payload_json, r.project_id, r.task_id
  FROM runs AS r
  LEFT JOIN attempts AS a
    ON a.run_id = r.run_id
   AND a.attempt_no = (SELECT max(attempt_no) FROM attempts WHERE run_id = r.run_id)
  LEFT JOIN task_revisions AS v
    ON v.project_id = r.project_id AND v.task_id = r.task_id AND v.task_revision = r.task_revision
 WHERE r.run_id = :run_id;

-- name: events_prune_deliveries
-- The ended deliveries of events older than :before, oldest events first (a bounded batch).
DELETE FROM event_deliveries
 WHERE state <> 'pending'
   AND event_seq IN (SELECT seq FROM event_outbox
                      WHERE at_ms < :before AND routed_at_ms IS NOT NULL
                      ORDER BY seq LIMIT :limit);

-- name: events_prune_events
-- Routed events older than :before with no delivery left (a pending one keeps its event).
DELETE FROM event_outbox
 WHERE seq IN (SELECT o.seq FROM event_outbox AS o
                WHERE o.at_ms < :before AND o.routed_at_ms IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM event_deliveries AS d WHERE d.event_seq = o.seq)
                ORDER BY o.seq LIMIT :limit);

-- name: episode_open
-- Open an operator episode; nothing when it is open already (the caller then writes no event).
INSERT INTO operator_episodes (episode_key, kind, opened_at_ms, detail_json)
VALUES (:key, :kind, :now, :detail)
ON CONFLICT (episode_key) DO NOTHING;

-- name: episode_opened_at
-- When an open episode opened.
SELECT opened_at_ms FROM operator_episodes WHERE episode_key = :key AND kind = :kind;

-- name: episode_close
-- Close an operator episode.
DELETE FROM operator_episodes WHERE episode_key = :key AND kind = :kind;

-- name: episode_event
-- An operator event (no project, task or Run), in the transaction that opened or closed its
-- episode.
INSERT INTO event_outbox (event_id, kind, subject, project_id, task_id, trigger_id, reason,
                          detail_json, at_ms)
VALUES (:event_id, :kind, :subject, '', '', '', :reason, :detail, :now);
