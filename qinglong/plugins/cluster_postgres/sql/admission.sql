-- Admission of a page of claimed schedules. The checks of one row against its schedule row are
-- fragments (below), so the two UPDATEs that advance a row and the read that explains a refusal
-- run the same text. `s` is the schedule row, `arg` the row's arguments, `clock` the statement's
-- clock.

-- fragment: schedule_ok
-- The schedule is still at the revision, state version and cursor the claim read.
s.trigger_revision = arg.trigger_revision AND s.state_version = arg.state_version
AND s.next_fire_at_ms IS NOT DISTINCT FROM arg.expected_next_ms

-- fragment: fence_ok
-- The whole claim fence: owner, token, claim version, and a claim unexpired at the clock.
s.claim_owner = arg.owner AND s.claim_token = arg.token
AND s.claim_version = arg.claim_version AND s.claim_expires_at_ms > clock.now_ms

-- fragment: decision_ok
-- The decision fits the row: observed at the claim's acquisition, and its kind's times.
arg.observed_at_ms = s.updated_at_ms AND arg.observed_at_ms <= clock.now_ms
AND CASE WHEN arg.kind = 'fire'
         THEN arg.scheduled_for_ms = arg.expected_next_ms
              AND arg.scheduled_for_ms <= arg.observed_at_ms
              AND arg.next_fire_at_ms > arg.scheduled_for_ms
         WHEN arg.kind = 'misfire_fire_once'
         THEN arg.scheduled_for_ms >= arg.expected_next_ms
              AND arg.scheduled_for_ms <= arg.observed_at_ms
              AND arg.next_fire_at_ms > arg.observed_at_ms
         WHEN arg.kind = 'initialize'
         THEN arg.scheduled_for_ms IS NULL
              AND arg.next_fire_at_ms
                  > least(coalesce(s.published_at_ms, arg.observed_at_ms), arg.observed_at_ms)
         WHEN arg.kind = 'misfire_skip'
         THEN arg.scheduled_for_ms IS NULL
              AND arg.next_fire_at_ms > arg.observed_at_ms
         WHEN arg.kind = 'release'
         THEN arg.scheduled_for_ms IS NULL
              AND arg.next_fire_at_ms IS NOT DISTINCT FROM arg.expected_next_ms
         ELSE false END

-- fragment: advance_checks
-- Every check a row must pass to advance: the revisions and digests (`checked`), then the
-- schedule, the fence and the decision on the row being written.
arg.project_ok AND arg.trigger_ok AND arg.task_ok AND arg.execution_ok
AND {{schedule_ok}}
AND {{fence_ok}}
AND {{decision_ok}}

-- fragment: advance_cursor
-- The cursor moves on and the state version with it; the claim is cleared unless it is kept.
next_fire_at_ms = arg.next_fire_at_ms,
last_scheduled_at_ms = coalesce(arg.scheduled_for_ms, s.last_scheduled_at_ms),
state_version = s.state_version + 1,
claim_owner = CASE WHEN arg.keep_claim THEN s.claim_owner END,
claim_token = CASE WHEN arg.keep_claim THEN s.claim_token END,
claim_expires_at_ms = CASE WHEN arg.keep_claim THEN s.claim_expires_at_ms END,
updated_at_ms = clock.now_ms

-- name: admit_page
-- Commits a page of claimed schedules' decisions in one statement (one SERIALIZABLE transaction),
-- the page as parallel arrays numbered `ord`: a row passing every check advances its cursor and
-- gets its Run, Attempt, two events and skip record; a failing row writes nothing and is reported
-- by its flags; a failed write fails the page. ONE result row (clock, guard, per-row flags as JSON)
-- so the message's last tag is "SELECT 1". Each schedule row is checked by the UPDATE that writes
-- it: read first, a page's SIRead locks grew to relation locks (2-8 failed pages a 5,000-row burst).
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
                %(row_tid)s::tid[], %(jitter_ms)s::bigint[], %(max_queued)s::integer[])
         WITH ORDINALITY AS i (trigger_id, task_id, trigger_revision, trigger_digest, task_revision,
                               task_digest, state_version, expected_next_ms, owner, token,
                               claim_version, observed_at_ms, kind, next_fire_at_ms,
                               scheduled_for_ms, idempotency_key, policy, skip_first_ms,
                               skip_last_ms, skip_count, skip_count_exact, keep_claim, run_id,
                               attempt_id, row_tid, jitter_ms, max_queued, ord)
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
                    -- digests are of the payload in clear: a text with sealed env values is
                    -- checked by their AEAD tags when the gateway opens them instead
                    AND (tr.content_digest
                         = 'sha256:' || encode(sha256(convert_to(tr.payload_json, 'UTF8')), 'hex')
                         OR strpos(tr.payload_json, '"ql-sealed:v1:') > 0),
                    false) AS task_ok,
           (k.task_revision <> i.task_revision) AS task_moved,
           (tr.task_revision IS NOT NULL) AS task_revision_found,
           coalesce(e.content_digest = 'sha256:' || encode(sha256(convert_to(e.spec_json, 'UTF8')), 'hex')
                    OR strpos(e.spec_json, '"ql-sealed:v1:') > 0,
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
-- each row located by the claim's ctid (a TID scan: index-page SIRead locks still failed 0-3
-- pages a burst), ...
advanced_at AS (
    UPDATE qinglong.trigger_schedules s
    SET {{advance_cursor}}
    FROM checked arg, clock
    WHERE s.ctid = arg.row_tid AND s.trigger_id = arg.trigger_id
      AND {{advance_checks}}
    RETURNING arg.ord, s.trigger_id, s.project_id, clock.now_ms AS now_ms, arg.keep_claim AS kept,
              s.ctid::text AS row_tid
),
-- ... and by key only for a row no longer there (changed since the claim, or the table rewritten)
advanced_by_key AS (
    UPDATE qinglong.trigger_schedules s
    SET {{advance_cursor}}
    FROM checked arg, clock
    WHERE s.trigger_id = arg.trigger_id AND arg.ord NOT IN (SELECT t.ord FROM advanced_at t)
      AND {{advance_checks}}
    RETURNING arg.ord, s.trigger_id, s.project_id, clock.now_ms AS now_ms, arg.keep_claim AS kept,
              s.ctid::text AS row_tid
),
advanced AS (
    SELECT * FROM advanced_at UNION ALL SELECT * FROM advanced_by_key
),
run AS (
    INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                               task_revision, executor, execution_digest, scheduled_for_ms,
                               admitted_at_ms, queued_at_ms, state, owned_by, cancelled,
                               idempotency_key, admitted_by, jitter_ms, max_queued)
    SELECT i.run_id, a.project_id, a.trigger_id, i.trigger_revision, i.task_id,
           i.task_revision, 'remote_worker', c.execution_digest, i.scheduled_for_ms,
           a.now_ms, a.now_ms, 'queued', 'runtime', false, i.idempotency_key, i.owner, i.jitter_ms,
           i.max_queued
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
    -- why a row did not advance, read only for those rows (the statement's snapshot)
    SELECT arg.ord,
           (c.ord IS NOT NULL AND s.trigger_id IS NOT NULL) AS schedule_found,
           ({{schedule_ok}}) AS schedule_ok,
           ({{fence_ok}}) AS fence_ok,
           ({{decision_ok}}) AS decision_ok
    FROM input arg
    CROSS JOIN clock
    LEFT JOIN checked c ON c.ord = arg.ord
    LEFT JOIN qinglong.trigger_schedules s ON s.trigger_id = arg.trigger_id
    -- a hashed subplan: an anti-join is planned, generically, as a nested loop over both
    WHERE arg.ord NOT IN (SELECT a.ord FROM advanced a)
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
