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
-- read), the lag percentiles read runs_recent over the last %(lag_window_ms)s ms, recent skips
-- schedule_skips_recent over %(recent_window_ms)s ms, running Runs the in-flight partial index;
-- the totals are counts: schedules and those of enabled triggers of active projects in one scan
-- of the trigger heads (each head has exactly one schedule row), Runs by state. Live replicas: a
-- completed round within %(live_window_ms)s ms. No Attempt is lost on this store (no worker runs one yet), and no
-- worker registers yet: those figures are absent here, not zero-by-query.
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
           percentile_disc(0.5) WITHIN GROUP (ORDER BY r.admitted_at_ms - r.scheduled_for_ms) AS p50,
           percentile_disc(0.99) WITHIN GROUP (ORDER BY r.admitted_at_ms - r.scheduled_for_ms) AS p99
    FROM qinglong.runs r
    WHERE r.admitted_at_ms >= %(now_ms)s::bigint - %(lag_window_ms)s::bigint
      AND r.trigger_revision >= 1
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
        WHERE k.recorded_at_ms >= %(now_ms)s::bigint - %(recent_window_ms)s::bigint) AS skipped_recent,
       (SELECT count(*) FROM qinglong.runs r
        WHERE r.state IN ('queued', 'dispatching', 'running') AND r.state = 'running') AS running,
       replicas.live AS live_schedulers,
       replicas.last_round_at_ms,
       queued.by_task AS queued_by_task
FROM heads, due, lag, by_state, queued, replicas
