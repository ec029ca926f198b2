-- name: admit_occurrence
-- The per-occurrence form of admit_page below (which the backend sends: a page of claims per
-- transaction), kept as the reference of one row's checks and as the single-row statement the
-- drain benchmark's pgbench ceiling runs. Commits one decision for one claimed schedule, in one statement run inside a SERIALIZABLE
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

-- name: admit_page
-- Commits the decisions of a page of claimed schedules in one statement run inside one
-- SERIALIZABLE transaction: the per-row form of admit_occurrence above, for every row of the
-- page at once. The page arrives as parallel arrays (one element per row, row i of each array
-- belongs together, numbered by `ord`); each row is checked under its own whole fence and its own
-- decision exactly as admit_occurrence checks one, the rows that pass advance their cursors and
-- get their Run, Attempt, run.created and run.queued and skip record, and a row that fails a
-- check writes nothing and is reported by its flags. A failed write (constraint, guard) fails the
-- statement and so the whole page: never a partial occurrence. The result is ONE row: the clock,
-- the guard, and the per-row flags as a JSON array in `ord` order, so the message's final
-- CommandComplete is "SELECT 1" whatever the page size.
-- The schedule rows are read by the UPDATE itself, each checked (its revision, state, cursor,
-- whole fence and the decision's part that depends on it) and written in one step, in key order
-- (`checked` is ordered): PostgreSQL drops a transaction's SIRead lock on a tuple once it writes
-- that tuple, so each row's read lock lives only until its own write. Reading all the page's rows
-- first (a locking SELECT, then the UPDATE) held them all at once: a page's rows lie a few to a
-- heap page, beyond max_pred_locks_per_page (2) the tuple locks became page locks, and beyond the
-- per-relation bound (32 page locks) one lock on the whole of trigger_schedules, which every
-- other replica's admission then conflicted with (measured: 2 to 8 pages failed per 5,000-row
-- burst, each of up to 256 rows). The rows are located by the claim's ctid (`advanced_at`), not
-- through trigger_schedules_pkey, whose leaf pages neighbouring pages share and whose page-level
-- SIRead locks still failed 0 to 3 pages a burst; with both, 0 were measured. Only the rows that
-- did not advance are read again (`flags`, the same snapshot) to say why.
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
),
input AS MATERIALIZED (
    SELECT *
    FROM unnest(%(trigger_id)s::text[], %(task_id)s::text[], %(trigger_revision)s::bigint[],
                %(trigger_digest)s::text[], %(task_revision)s::bigint[], %(task_digest)s::text[],
                %(state_version)s::bigint[], %(expected_next_ms)s::bigint[], %(owner)s::text[],
                %(token)s::uuid[], %(claim_version)s::bigint[], %(observed_at_ms)s::bigint[],
                %(kind)s::text[], %(next_fire_at_ms)s::bigint[], %(scheduled_for_ms)s::bigint[],
                %(idempotency_key)s::text[], %(policy)s::text[], %(skip_first_ms)s::bigint[],
                %(skip_last_ms)s::bigint[], %(skip_count)s::bigint[], %(skip_count_exact)s::boolean[],
                %(keep_claim)s::boolean[], %(run_id)s::uuid[], %(attempt_id)s::uuid[],
                %(row_tid)s::tid[])
         WITH ORDINALITY AS i (trigger_id, task_id, trigger_revision, trigger_digest, task_revision,
                               task_digest, state_version, expected_next_ms, owner, token,
                               claim_version, observed_at_ms, kind, next_fire_at_ms,
                               scheduled_for_ms, idempotency_key, policy, skip_first_ms,
                               skip_last_ms, skip_count, skip_count_exact, keep_claim, run_id,
                               attempt_id, row_tid, ord)
),
checked AS MATERIALIZED (
    -- with the row's own arguments, so the UPDATE below joins this alone to the schedule row (a
    -- second join with `input` is planned, generically, as a nested loop over both)
    SELECT i.ord, i.trigger_revision, i.state_version, i.expected_next_ms, i.owner, i.token,
           i.claim_version, i.observed_at_ms, i.kind, i.next_fire_at_ms, i.scheduled_for_ms,
           i.row_tid,
           t.trigger_id,
           t.project_id,
           p.active AS project_ok,
           (t.trigger_revision = i.trigger_revision AND t.content_digest = i.trigger_digest
            AND t.enabled) AS trigger_ok,
           coalesce(k.task_revision = i.task_revision AND k.content_digest = i.task_digest
                    AND tr.content_digest = k.content_digest
                    AND tr.content_digest
                        = 'sha256:' || encode(sha256(convert_to(tr.payload_json, 'UTF8')), 'hex'),
                    false) AS task_ok,
           (k.task_revision <> i.task_revision) AS task_moved,
           (tr.task_revision IS NOT NULL) AS task_revision_found,
           coalesce(e.content_digest = 'sha256:' || encode(sha256(convert_to(e.spec_json, 'UTF8')), 'hex'),
                    false) AS execution_ok,
           e.content_digest AS execution_digest,
           (i.keep_claim AND i.kind IN ('fire', 'initialize')
            AND i.next_fire_at_ms <= clock.now_ms) AS keep_claim
    FROM input i
    CROSS JOIN clock
    JOIN qinglong.triggers t ON t.trigger_id = i.trigger_id
    JOIN qinglong.projects p ON p.project_id = t.project_id
    JOIN qinglong.tasks k ON k.project_id = t.project_id AND k.task_id = t.task_id
    LEFT JOIN qinglong.task_revisions tr
      ON tr.project_id = k.project_id AND tr.task_id = k.task_id AND tr.task_revision = k.task_revision
    LEFT JOIN qinglong.execution_revisions e
      ON e.project_id = k.project_id AND e.task_id = k.task_id AND e.task_revision = k.task_revision
     AND e.executor = 'remote_worker'
    ORDER BY t.trigger_id
),
-- each schedule row located by where the claim left it (a TID scan: no index read, so none of
-- the SIRead locks on shared index pages that neighbouring pages conflicted on) ...
advanced_at AS (
    UPDATE qinglong.trigger_schedules s
    SET next_fire_at_ms = c.next_fire_at_ms,
        last_scheduled_at_ms = coalesce(c.scheduled_for_ms, s.last_scheduled_at_ms),
        state_version = s.state_version + 1,
        claim_owner = CASE WHEN c.keep_claim THEN s.claim_owner END,
        claim_token = CASE WHEN c.keep_claim THEN s.claim_token END,
        claim_expires_at_ms = CASE WHEN c.keep_claim THEN s.claim_expires_at_ms END,
        updated_at_ms = clock.now_ms
    FROM checked c, clock
    WHERE s.ctid = c.row_tid AND s.trigger_id = c.trigger_id
      AND c.project_ok AND c.trigger_ok AND c.task_ok AND c.execution_ok
      -- schedule_ok, fence_ok and decision_ok of `flags` below, on the row being written
      AND s.trigger_revision = c.trigger_revision AND s.state_version = c.state_version
      AND s.next_fire_at_ms IS NOT DISTINCT FROM c.expected_next_ms
      AND s.claim_owner = c.owner AND s.claim_token = c.token
      AND s.claim_version = c.claim_version AND s.claim_expires_at_ms > clock.now_ms
      AND c.observed_at_ms = s.updated_at_ms AND c.observed_at_ms <= clock.now_ms
      AND CASE WHEN c.kind = 'fire'
               THEN c.scheduled_for_ms = c.expected_next_ms
                    AND c.scheduled_for_ms <= c.observed_at_ms
                    AND c.next_fire_at_ms > c.scheduled_for_ms
               WHEN c.kind = 'misfire_fire_once'
               THEN c.scheduled_for_ms >= c.expected_next_ms
                    AND c.scheduled_for_ms <= c.observed_at_ms
                    AND c.next_fire_at_ms > c.observed_at_ms
               WHEN c.kind = 'initialize'
               THEN c.scheduled_for_ms IS NULL
                    AND c.next_fire_at_ms
                        > least(coalesce(s.published_at_ms, c.observed_at_ms), c.observed_at_ms)
               WHEN c.kind = 'misfire_skip'
               THEN c.scheduled_for_ms IS NULL
                    AND c.next_fire_at_ms > c.observed_at_ms
               WHEN c.kind = 'release'
               THEN c.scheduled_for_ms IS NULL
                    AND c.next_fire_at_ms IS NOT DISTINCT FROM c.expected_next_ms
               ELSE false END
    RETURNING c.ord, s.trigger_id, s.project_id, clock.now_ms AS now_ms, c.keep_claim AS kept,
              s.ctid::text AS row_tid
),
-- ... and by key only for a row that is no longer there (it changed since the claim, or the
-- table was rewritten): the same checks, so it advances only if it still passes them
advanced_by_key AS (
    UPDATE qinglong.trigger_schedules s
    SET next_fire_at_ms = c.next_fire_at_ms,
        last_scheduled_at_ms = coalesce(c.scheduled_for_ms, s.last_scheduled_at_ms),
        state_version = s.state_version + 1,
        claim_owner = CASE WHEN c.keep_claim THEN s.claim_owner END,
        claim_token = CASE WHEN c.keep_claim THEN s.claim_token END,
        claim_expires_at_ms = CASE WHEN c.keep_claim THEN s.claim_expires_at_ms END,
        updated_at_ms = clock.now_ms
    FROM checked c, clock
    WHERE s.trigger_id = c.trigger_id AND c.ord NOT IN (SELECT t.ord FROM advanced_at t)
      AND c.project_ok AND c.trigger_ok AND c.task_ok AND c.execution_ok
      -- schedule_ok, fence_ok and decision_ok of `flags` below, on the row being written
      AND s.trigger_revision = c.trigger_revision AND s.state_version = c.state_version
      AND s.next_fire_at_ms IS NOT DISTINCT FROM c.expected_next_ms
      AND s.claim_owner = c.owner AND s.claim_token = c.token
      AND s.claim_version = c.claim_version AND s.claim_expires_at_ms > clock.now_ms
      AND c.observed_at_ms = s.updated_at_ms AND c.observed_at_ms <= clock.now_ms
      AND CASE WHEN c.kind = 'fire'
               THEN c.scheduled_for_ms = c.expected_next_ms
                    AND c.scheduled_for_ms <= c.observed_at_ms
                    AND c.next_fire_at_ms > c.scheduled_for_ms
               WHEN c.kind = 'misfire_fire_once'
               THEN c.scheduled_for_ms >= c.expected_next_ms
                    AND c.scheduled_for_ms <= c.observed_at_ms
                    AND c.next_fire_at_ms > c.observed_at_ms
               WHEN c.kind = 'initialize'
               THEN c.scheduled_for_ms IS NULL
                    AND c.next_fire_at_ms
                        > least(coalesce(s.published_at_ms, c.observed_at_ms), c.observed_at_ms)
               WHEN c.kind = 'misfire_skip'
               THEN c.scheduled_for_ms IS NULL
                    AND c.next_fire_at_ms > c.observed_at_ms
               WHEN c.kind = 'release'
               THEN c.scheduled_for_ms IS NULL
                    AND c.next_fire_at_ms IS NOT DISTINCT FROM c.expected_next_ms
               ELSE false END
    RETURNING c.ord, s.trigger_id, s.project_id, clock.now_ms AS now_ms, c.keep_claim AS kept,
              s.ctid::text AS row_tid
),
advanced AS (
    SELECT * FROM advanced_at UNION ALL SELECT * FROM advanced_by_key
),
run AS (
    INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                               task_revision, executor, execution_digest, scheduled_for_ms,
                               admitted_at_ms, queued_at_ms, state, owned_by, cancelled,
                               idempotency_key, admitted_by)
    SELECT i.run_id, a.project_id, a.trigger_id, i.trigger_revision, i.task_id,
           i.task_revision, 'remote_worker', c.execution_digest, i.scheduled_for_ms,
           a.now_ms, a.now_ms, 'queued', 'runtime', false, i.idempotency_key, i.owner
    FROM advanced a
    JOIN input i ON i.ord = a.ord
    JOIN checked c ON c.ord = a.ord
    WHERE i.scheduled_for_ms IS NOT NULL
    RETURNING run_id, admitted_at_ms
),
attempt AS (
    INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor, created_at_ms)
    SELECT i.attempt_id, r.run_id, 1, 'claimed', 'remote_worker', r.admitted_at_ms
    FROM run r JOIN input i ON i.run_id = r.run_id
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
    SELECT gen_random_uuid(), a.project_id, a.trigger_id, i.trigger_revision, i.policy,
           i.skip_first_ms, i.skip_last_ms, i.skip_count, i.skip_count_exact, a.now_ms
    FROM advanced a JOIN input i ON i.ord = a.ord
    WHERE i.skip_first_ms IS NOT NULL
    RETURNING skip_id
),
tally AS (
    SELECT (SELECT count(*) FROM advanced) AS advanced_rows,
           (SELECT count(*) FROM advanced a JOIN input i ON i.ord = a.ord
            WHERE i.scheduled_for_ms IS NOT NULL) AS expected_runs,
           (SELECT count(*) FROM advanced a JOIN input i ON i.ord = a.ord
            WHERE i.skip_first_ms IS NOT NULL) AS expected_skips,
           (SELECT count(*) FROM run) AS run_rows,
           (SELECT count(*) FROM attempt) AS attempt_rows,
           (SELECT count(*) FROM events) AS event_rows,
           (SELECT count(*) FROM skip) AS skip_rows
),
flags AS (
    -- why a row did not advance, read from the schedule only for those rows (the statement's
    -- snapshot, as the update saw it); an advanced row passed every check
    SELECT i.ord,
           (c.ord IS NOT NULL AND s.trigger_id IS NOT NULL) AS schedule_found,
           (s.trigger_revision = i.trigger_revision AND s.state_version = i.state_version
            AND s.next_fire_at_ms IS NOT DISTINCT FROM i.expected_next_ms) AS schedule_ok,
           (s.claim_owner IS NOT DISTINCT FROM i.owner AND s.claim_token IS NOT DISTINCT FROM i.token
            AND s.claim_version = i.claim_version AND s.claim_expires_at_ms > clock.now_ms) AS fence_ok,
           (i.observed_at_ms = s.updated_at_ms AND i.observed_at_ms <= clock.now_ms
            AND CASE WHEN i.kind = 'fire'
                     THEN i.scheduled_for_ms = i.expected_next_ms
                          AND i.scheduled_for_ms <= i.observed_at_ms
                          AND i.next_fire_at_ms > i.scheduled_for_ms
                     WHEN i.kind = 'misfire_fire_once'
                     THEN i.scheduled_for_ms >= i.expected_next_ms
                          AND i.scheduled_for_ms <= i.observed_at_ms
                          AND i.next_fire_at_ms > i.observed_at_ms
                     WHEN i.kind = 'initialize'
                     THEN i.scheduled_for_ms IS NULL
                          AND i.next_fire_at_ms
                              > least(coalesce(s.published_at_ms, i.observed_at_ms), i.observed_at_ms)
                     WHEN i.kind = 'misfire_skip'
                     THEN i.scheduled_for_ms IS NULL
                          AND i.next_fire_at_ms > i.observed_at_ms
                     WHEN i.kind = 'release'
                     THEN i.scheduled_for_ms IS NULL
                          AND i.next_fire_at_ms IS NOT DISTINCT FROM i.expected_next_ms
                     ELSE false END) AS decision_ok
    FROM input i
    CROSS JOIN clock
    LEFT JOIN checked c ON c.ord = i.ord
    LEFT JOIN qinglong.trigger_schedules s ON s.trigger_id = i.trigger_id
    -- a hashed subplan: an anti-join is planned, generically, as a nested loop over both
    WHERE i.ord NOT IN (SELECT a.ord FROM advanced a)
),
per_row AS (
    SELECT i.ord, c.project_ok, c.trigger_ok, c.task_ok, c.execution_ok,
           coalesce(f.schedule_ok, a.ord IS NOT NULL) AS schedule_ok,
           coalesce(f.fence_ok, a.ord IS NOT NULL) AS fence_ok,
           coalesce(f.decision_ok, a.ord IS NOT NULL) AS decision_ok,
           coalesce(f.schedule_found, a.ord IS NOT NULL) AS schedule_found,
           (a.ord IS NOT NULL) AS advanced, coalesce(a.kept, false) AS claim_kept,
           a.row_tid, c.task_moved, c.task_revision_found
    FROM input i
    LEFT JOIN checked c ON c.ord = i.ord
    LEFT JOIN advanced a ON a.ord = i.ord
    LEFT JOIN flags f ON f.ord = i.ord
)
SELECT clock.now_ms, tally.advanced_rows, tally.run_rows,
       -- the guard: every advanced cursor must come with exactly the rows its decision implies
       CASE WHEN tally.run_rows = tally.expected_runs
                 AND tally.attempt_rows = tally.run_rows
                 AND tally.event_rows = 2 * tally.run_rows
                 AND tally.skip_rows = tally.expected_skips
            THEN true
            ELSE ('admission incomplete: runs=' || tally.run_rows || ' attempts=' || tally.attempt_rows
                  || ' events=' || tally.event_rows || ' skips=' || tally.skip_rows)::boolean
       END AS complete,
       (SELECT json_agg(r ORDER BY r.ord) FROM per_row r) AS results
FROM clock CROSS JOIN tally
