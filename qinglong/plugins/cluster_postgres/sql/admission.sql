-- name: admit_occurrence
-- Commits one decision for one claimed schedule, in one statement run inside a SERIALIZABLE
-- transaction: re-locks the schedule by primary key, checks project, trigger revision + digest,
-- task revision + digest, the pinned remote_worker execution revision's digest (recomputed here),
-- schedule revision/state/cursor, the whole fence (owner, token, claim_version, expiry > now) and
-- the decision; then advances the cursor under the fence (clearing the claim, keeping
-- claim_version) and, driven by that one updated row, inserts the Run, its Attempt, run.created and
-- run.queued, and the skip record. If any check fails nothing is written and the returned flags say
-- which; if any write fails the statement (and so the transaction) fails. The final guard turns a
-- write that silently produced no row into an error instead of a partial admission.
-- %(keep_claim)s (for fire and initialize only): when the new cursor is already due at this
-- statement's clock, keep the claim (owner, token, version, expiry) so the same claimer decides
-- the row again at once (a backlog inside the grace, an initialisation from the publish time
-- whose first occurrence is owed); returned as claim_kept. An initialisation counts from the
-- revision's publish time (published_at_ms), so its cursor need only be after that.
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
),
checked AS MATERIALIZED (
    SELECT s.trigger_id,
           s.project_id,
           p.active AS project_ok,
           (t.trigger_revision = %(trigger_revision)s AND t.content_digest = %(trigger_digest)s
            AND t.enabled) AS trigger_ok,
           coalesce(k.task_revision = %(task_revision)s AND k.content_digest = %(task_digest)s
                    AND tr.content_digest = k.content_digest
                    AND tr.content_digest
                        = 'sha256:' || encode(sha256(convert_to(tr.payload_json, 'UTF8')), 'hex'),
                    false) AS task_ok,
           -- the task head moved to another revision since the claim (a legitimate edit)
           (k.task_revision <> %(task_revision)s) AS task_moved,
           (tr.task_revision IS NOT NULL) AS task_revision_found,
           coalesce(e.content_digest = 'sha256:' || encode(sha256(convert_to(e.spec_json, 'UTF8')), 'hex'),
                    false) AS execution_ok,
           e.content_digest AS execution_digest,
           (s.trigger_revision = %(trigger_revision)s AND s.state_version = %(state_version)s
            AND s.next_fire_at_ms IS NOT DISTINCT FROM %(expected_next_ms)s::bigint) AS schedule_ok,
           (s.claim_owner IS NOT DISTINCT FROM %(owner)s AND s.claim_token IS NOT DISTINCT FROM %(token)s::uuid
            AND s.claim_version = %(claim_version)s AND s.claim_expires_at_ms > clock.now_ms) AS fence_ok,
           (%(observed_at_ms)s::bigint = s.updated_at_ms AND %(observed_at_ms)s::bigint <= clock.now_ms
            AND CASE WHEN %(kind)s = 'fire'
                     THEN %(scheduled_for_ms)s::bigint = %(expected_next_ms)s::bigint
                          AND %(scheduled_for_ms)s::bigint <= %(observed_at_ms)s::bigint
                          AND %(next_fire_at_ms)s::bigint > %(scheduled_for_ms)s::bigint
                     WHEN %(kind)s = 'misfire_fire_once'
                     THEN %(scheduled_for_ms)s::bigint >= %(expected_next_ms)s::bigint
                          AND %(scheduled_for_ms)s::bigint <= %(observed_at_ms)s::bigint
                          AND %(next_fire_at_ms)s::bigint > %(observed_at_ms)s::bigint
                     WHEN %(kind)s = 'initialize'
                     THEN %(scheduled_for_ms)s::bigint IS NULL
                          AND %(next_fire_at_ms)s::bigint
                              > least(coalesce(s.published_at_ms, %(observed_at_ms)s::bigint),
                                      %(observed_at_ms)s::bigint)
                     WHEN %(kind)s = 'misfire_skip'
                     THEN %(scheduled_for_ms)s::bigint IS NULL
                          AND %(next_fire_at_ms)s::bigint > %(observed_at_ms)s::bigint
                     WHEN %(kind)s = 'release'
                     THEN %(scheduled_for_ms)s::bigint IS NULL
                          AND %(next_fire_at_ms)s::bigint IS NOT DISTINCT FROM %(expected_next_ms)s::bigint
                     ELSE false END) AS decision_ok,
           (%(keep_claim)s::boolean AND %(kind)s IN ('fire', 'initialize')
            AND %(next_fire_at_ms)s::bigint <= clock.now_ms) AS keep_claim
    FROM qinglong.trigger_schedules s
    CROSS JOIN clock
    JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
    JOIN qinglong.projects p ON p.project_id = t.project_id
    JOIN qinglong.tasks k ON k.project_id = t.project_id AND k.task_id = t.task_id
    LEFT JOIN qinglong.task_revisions tr
      ON tr.project_id = k.project_id AND tr.task_id = k.task_id AND tr.task_revision = k.task_revision
    LEFT JOIN qinglong.execution_revisions e
      ON e.project_id = k.project_id AND e.task_id = k.task_id AND e.task_revision = k.task_revision
     AND e.executor = 'remote_worker'
    WHERE s.trigger_id = %(trigger_id)s
    FOR UPDATE OF s
),
advanced AS (
    UPDATE qinglong.trigger_schedules s
    SET next_fire_at_ms = %(next_fire_at_ms)s::bigint,
        last_scheduled_at_ms = coalesce(%(scheduled_for_ms)s::bigint, s.last_scheduled_at_ms),
        state_version = s.state_version + 1,
        claim_owner = CASE WHEN c.keep_claim THEN s.claim_owner END,
        claim_token = CASE WHEN c.keep_claim THEN s.claim_token END,
        claim_expires_at_ms = CASE WHEN c.keep_claim THEN s.claim_expires_at_ms END,
        updated_at_ms = clock.now_ms
    FROM checked c, clock
    WHERE s.trigger_id = c.trigger_id
      AND c.project_ok AND c.trigger_ok AND c.task_ok AND c.execution_ok AND c.schedule_ok
      AND c.fence_ok AND c.decision_ok
      -- the whole fence again, on the row being written
      AND s.claim_owner = %(owner)s AND s.claim_token = %(token)s::uuid
      AND s.claim_version = %(claim_version)s AND s.claim_expires_at_ms > clock.now_ms
    RETURNING s.trigger_id, s.project_id, clock.now_ms AS now_ms, c.keep_claim AS kept
),
run AS (
    INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                               task_revision, executor, execution_digest, scheduled_for_ms,
                               admitted_at_ms, queued_at_ms, state, owned_by, cancelled,
                               idempotency_key, admitted_by)
    SELECT %(run_id)s::uuid, a.project_id, a.trigger_id, %(trigger_revision)s, %(task_id)s,
           %(task_revision)s, 'remote_worker', c.execution_digest, %(scheduled_for_ms)s::bigint,
           a.now_ms, a.now_ms, 'queued', 'runtime', false, %(idempotency_key)s, %(owner)s
    FROM advanced a CROSS JOIN checked c
    WHERE %(scheduled_for_ms)s::bigint IS NOT NULL
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
skip AS (
    INSERT INTO qinglong.schedule_skips (skip_id, project_id, trigger_id, trigger_revision, policy,
                                         first_skipped_ms, last_skipped_ms, skipped_count,
                                         count_exact, recorded_at_ms)
    SELECT gen_random_uuid(), a.project_id, a.trigger_id, %(trigger_revision)s, %(policy)s,
           %(skip_first_ms)s::bigint, %(skip_last_ms)s::bigint, %(skip_count)s::bigint,
           %(skip_count_exact)s::boolean, a.now_ms
    FROM advanced a
    WHERE %(skip_first_ms)s::bigint IS NOT NULL
    RETURNING skip_id
),
tally AS (
    SELECT (SELECT count(*) FROM advanced) AS advanced_rows,
           (SELECT count(*) FROM run) AS run_rows,
           (SELECT count(*) FROM attempt) AS attempt_rows,
           (SELECT count(*) FROM events) AS event_rows,
           (SELECT count(*) FROM skip) AS skip_rows
)
SELECT c.project_ok, c.trigger_ok, c.task_ok, c.execution_ok, c.schedule_ok, c.fence_ok,
       c.decision_ok, (c.trigger_id IS NOT NULL) AS schedule_found, clock.now_ms,
       tally.advanced_rows, tally.run_rows,
       -- the guard: an advanced cursor must come with exactly the rows the decision implies
       CASE WHEN tally.advanced_rows = 0
              OR (tally.run_rows = CASE WHEN %(scheduled_for_ms)s::bigint IS NULL THEN 0 ELSE 1 END
                  AND tally.attempt_rows = tally.run_rows
                  AND tally.event_rows = 2 * tally.run_rows
                  AND tally.skip_rows = CASE WHEN %(skip_first_ms)s::bigint IS NULL THEN 0 ELSE 1 END)
            THEN true
            ELSE ('admission incomplete: runs=' || tally.run_rows || ' attempts=' || tally.attempt_rows
                  || ' events=' || tally.event_rows || ' skips=' || tally.skip_rows)::boolean
       END AS complete,
       coalesce((SELECT kept FROM advanced), false) AS claim_kept,
       c.task_moved, c.task_revision_found
FROM clock CROSS JOIN tally LEFT JOIN checked c ON true
