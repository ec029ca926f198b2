-- The store-derived figures behind /metrics and `qinglong status`: the database clock, then one
-- statement of every figure at that instant, in one READ ONLY transaction under a local statement
-- timeout (see stats.py).

-- name: stats_clock
-- The database clock now, in epoch milliseconds: the instant every figure is read at.
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms

-- name: store_stats
-- Every figure at %(now_ms)s (the database clock, read by stats_clock just before), from one
-- snapshot. `now` is a bound value, not a subquery, so the planner sees how selective each range
-- is and reads it by its index. Cost: the backlog is a range of trigger_schedules_due
-- (next_fire_at_ms <= now: the due part only; the NULL range awaiting initialization is not
-- read), the lag percentiles read runs_recent over the last %(lag_window_ms)s ms (a lag counted
-- from the admitting replica's first round for what it caught up at its start: occurrences due
-- while it did not run yet, admitted late as the misfire policy allowed), recent skips
-- schedule_skips_recent and run_skips_recorded over %(recent_window_ms)s ms, running Runs the in-flight partial index;
-- the totals are counts: schedules and those of enabled triggers of active projects in one scan
-- of the trigger heads (each head has exactly one schedule row), Runs by state. Live replicas: a
-- completed round within %(live_window_ms)s ms. Workers: one session row per worker id (a
-- handful); live ones are open with a lease still running, expired and closed ones are counted
-- when that happened within %(recent_window_ms)s ms; a live session's free slots are its capacity
-- less its leased Attempts (attempts_by_session). Queued Runs nobody can take: the queued Runs
-- (runs_dispatchable) grouped by their required labels, a group counted when no live session
-- offers every label of it. Ended Attempts by outcome are a count of the table (the totals behind
-- qinglong_attempts_finished_total), with those ended lost within the recent window.
WITH due AS (
    SELECT count(*) AS n, min(s.next_fire_at_ms) AS oldest
    FROM qinglong.trigger_schedules s
    JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
    JOIN qinglong.projects p ON p.project_id = t.project_id
    WHERE s.next_fire_at_ms <= %(now_ms)s::bigint
      AND p.active
      AND t.enabled
      AND t.trigger_revision = s.trigger_revision
),
lag AS (
    SELECT count(*) AS n,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY x.lag) AS p50,
           percentile_disc(0.99) WITHIN GROUP (ORDER BY x.lag) AS p99
    FROM (SELECT r.admitted_at_ms - CASE WHEN k.first_round_at_ms IS NOT NULL
                                          AND r.scheduled_for_ms < k.first_round_at_ms
                                         THEN least(k.first_round_at_ms, r.admitted_at_ms)
                                         ELSE r.scheduled_for_ms END AS lag
          FROM qinglong.runs r
          LEFT JOIN qinglong.scheduler_replicas k ON k.owner = r.admitted_by
          WHERE r.admitted_at_ms >= %(now_ms)s::bigint - %(lag_window_ms)s::bigint
            AND r.trigger_revision >= 1) x
),
by_state AS (
    SELECT coalesce(json_object_agg(x.state, x.n), '{}'::json) AS runs
    FROM (SELECT state, count(*) AS n FROM qinglong.runs GROUP BY state) x
),
queued AS (
    SELECT coalesce(json_object_agg(x.project_id || '/' || x.task_id, x.n), '{}'::json) AS by_task
    FROM (SELECT project_id, task_id, count(*) AS n FROM qinglong.runs
          WHERE state IN ('queued', 'dispatching', 'running') AND state = 'queued'
          GROUP BY project_id, task_id ORDER BY count(*) DESC, project_id, task_id
          LIMIT %(queued_tasks)s) x
),
replicas AS (
    SELECT count(*) FILTER (WHERE r.last_round_at_ms
                                  >= %(now_ms)s::bigint - %(live_window_ms)s::bigint) AS live,
           max(r.last_round_at_ms) AS last_round_at_ms
    FROM qinglong.scheduler_replicas r
),
heads AS (
    SELECT count(*) AS total, count(*) FILTER (WHERE t.enabled AND p.active) AS enabled
    FROM qinglong.triggers t
    JOIN qinglong.projects p ON p.project_id = t.project_id
),
live_sessions AS (
    SELECT w.session_id, w.generation, w.labels, w.capacity
    FROM qinglong.worker_sessions w
    WHERE w.closed_at_ms IS NULL AND w.lease_expires_at_ms > %(now_ms)s::bigint
),
workers AS (
    SELECT (SELECT count(*) FROM live_sessions) AS live,
           count(*) FILTER (WHERE w.closed_at_ms IS NULL
                            AND w.lease_expires_at_ms <= %(now_ms)s::bigint
                            AND w.lease_expires_at_ms
                                > %(now_ms)s::bigint - %(recent_window_ms)s::bigint) AS expired,
           count(*) FILTER (WHERE w.closed_at_ms
                            > %(now_ms)s::bigint - %(recent_window_ms)s::bigint) AS closed,
           (SELECT coalesce(sum(greatest(0, l.capacity - (
                SELECT count(*) FROM qinglong.attempts a
                WHERE a.session_id = l.session_id AND a.session_generation = l.generation
                  AND a.state IN ('dispatching', 'running')))), 0)
            FROM live_sessions l) AS free_slots
    FROM qinglong.worker_sessions w
),
unserved AS (
    SELECT coalesce(sum(q.n), 0) AS n
    FROM (SELECT coalesce(r.required_labels, '{}'::text[]) AS labels, count(*) AS n
          FROM qinglong.runs r
          WHERE r.state IN ('queued', 'retry_wait') AND r.state = 'queued'
          GROUP BY 1) q
    WHERE NOT EXISTS (SELECT 1 FROM live_sessions l WHERE q.labels <@ l.labels)
),
ended AS (
    SELECT coalesce(json_object_agg(x.state, x.n), '{}'::json) AS by_outcome,
           coalesce(sum(x.lost_recent), 0) AS lost_recent
    FROM (SELECT a.state, count(*) AS n,
                 count(*) FILTER (WHERE a.state = 'lost' AND a.finished_at_ms
                                  >= %(now_ms)s::bigint - %(recent_window_ms)s::bigint) AS lost_recent
          FROM qinglong.attempts a
          WHERE a.state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
          GROUP BY a.state) x
)
SELECT %(now_ms)s::bigint AS now_ms,
       heads.total AS schedules_total,
       heads.enabled AS schedules_enabled,
       due.n AS schedules_due,
       due.oldest AS oldest_due_ms,
       by_state.runs AS runs_by_state,
       lag.n AS admitted_in_window,
       lag.p50 AS admission_lag_p50_ms,
       lag.p99 AS admission_lag_p99_ms,
       (SELECT coalesce(sum(k.skipped_count), 0)
        FROM qinglong.schedule_skips k
        WHERE k.recorded_at_ms >= %(now_ms)s::bigint - %(recent_window_ms)s::bigint)
       + (SELECT count(*) FROM qinglong.run_skips k
          WHERE k.recorded_at_ms >= %(now_ms)s::bigint - %(recent_window_ms)s::bigint) AS skipped_recent,
       (SELECT count(*) FROM qinglong.runs r
        WHERE r.state IN ('queued', 'dispatching', 'running') AND r.state = 'running') AS running,
       replicas.live AS live_schedulers,
       replicas.last_round_at_ms,
       workers.live AS workers_live,
       workers.expired AS workers_expired,
       workers.closed AS workers_closed,
       workers.free_slots AS worker_free_slots,
       unserved.n AS runs_without_worker,
       ended.by_outcome AS attempts_finished,
       ended.lost_recent,
       queued.by_task AS queued_by_task
FROM heads, due, lag, by_state, queued, replicas, workers, unserved, ended

-- name: failing_tasks
-- The tasks (not deleted, of active projects) whose newest ended Run failed, timed out or was
-- lost, with their outcome figures, longest failure streak first, at most %(shown)s of them, each
-- row carrying how many there are in all and how many of them failed %(periods)s Runs in a row or more. Every figure is a short read of runs_ended_by_task
-- (migration 0011); cancelled Runs count in no figure.
WITH per_task AS (
    SELECT t.project_id, t.task_id, last.state AS last_outcome, last.finished_at_ms AS last_finished_at_ms,
           (SELECT max(r.finished_at_ms) FROM qinglong.runs r
            WHERE r.project_id = t.project_id AND r.task_id = t.task_id
              AND r.finished_at_ms IS NOT NULL AND r.state = 'succeeded') AS last_success_at_ms
    FROM qinglong.tasks t
    JOIN qinglong.projects p ON p.project_id = t.project_id
    CROSS JOIN LATERAL (
        SELECT r.state, r.finished_at_ms FROM qinglong.runs r
        WHERE r.project_id = t.project_id AND r.task_id = t.task_id
          AND r.finished_at_ms IS NOT NULL AND r.state <> 'cancelled'
        ORDER BY r.finished_at_ms DESC LIMIT 1) last
    WHERE t.deleted_at_ms IS NULL AND p.active
      AND last.state IN ('failed', 'timed_out', 'lost')
),
failing AS (
    SELECT f.*,
           (SELECT count(*) FROM qinglong.runs r
            WHERE r.project_id = f.project_id AND r.task_id = f.task_id
              AND r.finished_at_ms IS NOT NULL
              AND r.finished_at_ms > coalesce(f.last_success_at_ms, -1)
              AND r.state IN ('failed', 'timed_out', 'lost')) AS failure_streak,
           (SELECT count(*) FROM qinglong.runs r
            WHERE r.project_id = f.project_id AND r.task_id = f.task_id
              AND r.finished_at_ms IS NOT NULL
              AND r.finished_at_ms >= %(now_ms)s::bigint - %(window_ms)s::bigint
              AND r.state <> 'cancelled') AS ended_in_window,
           (SELECT count(*) FROM qinglong.runs r
            WHERE r.project_id = f.project_id AND r.task_id = f.task_id
              AND r.finished_at_ms IS NOT NULL
              AND r.finished_at_ms >= %(now_ms)s::bigint - %(window_ms)s::bigint
              AND r.state = 'succeeded') AS succeeded_in_window
    FROM per_task f
)
SELECT project_id, task_id, last_outcome, last_finished_at_ms, last_success_at_ms, failure_streak,
       ended_in_window, succeeded_in_window, count(*) OVER () AS failing_total,
       sum(CASE WHEN failure_streak >= %(periods)s THEN 1 ELSE 0 END) OVER () AS not_succeeding_total
FROM failing
ORDER BY failure_streak DESC, project_id, task_id
LIMIT %(shown)s
