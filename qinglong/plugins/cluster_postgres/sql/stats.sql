-- The store-derived figures behind /metrics and `qinglong status`: one statement, run in a READ
-- ONLY transaction under a local statement timeout (see stats.py), in database time.

-- name: store_stats
-- Every figure at one instant of the database clock (clock_timestamp() read once, MATERIALIZED),
-- from one snapshot. Cost: the backlog is a range of trigger_schedules_due (next_fire_at_ms <=
-- now: the due part only; the cursors awaiting initialisation are the NULL range, not read), the
-- lag percentiles read runs_recent over the last %(lag_window_ms)s ms, recent skips
-- schedule_skips_recent over %(recent_window_ms)s ms, running Runs the in-flight partial index;
-- the totals (schedules, Runs by state) are counts. Live replicas: a completed round within
-- %(live_window_ms)s ms. No Attempt is lost on this store (no worker runs one yet), and no
-- worker registers yet: those figures are absent here, not zero-by-query.
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
),
due AS (
    SELECT count(*) AS n, min(s.next_fire_at_ms) AS oldest
    FROM qinglong.trigger_schedules s
    JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
    JOIN qinglong.projects p ON p.project_id = t.project_id
    WHERE s.next_fire_at_ms <= (SELECT now_ms FROM clock)
      AND p.active
      AND t.enabled
      AND t.trigger_revision = s.trigger_revision
),
lag AS (
    SELECT count(*) AS n,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY r.admitted_at_ms - r.scheduled_for_ms) AS p50,
           percentile_disc(0.99) WITHIN GROUP (ORDER BY r.admitted_at_ms - r.scheduled_for_ms) AS p99
    FROM qinglong.runs r
    WHERE r.admitted_at_ms >= (SELECT now_ms FROM clock) - %(lag_window_ms)s::bigint
      AND r.trigger_revision >= 1
),
by_state AS (
    SELECT coalesce(json_object_agg(x.state, x.n), '{}'::json) AS runs
    FROM (SELECT state, count(*) AS n FROM qinglong.runs GROUP BY state) x
),
replicas AS (
    SELECT count(*) FILTER (WHERE r.last_round_at_ms
                                  >= (SELECT now_ms FROM clock) - %(live_window_ms)s::bigint) AS live,
           max(r.last_round_at_ms) AS last_round_at_ms
    FROM qinglong.scheduler_replicas r
)
SELECT clock.now_ms,
       (SELECT count(*) FROM qinglong.trigger_schedules) AS schedules_total,
       (SELECT count(*)
        FROM qinglong.trigger_schedules s
        JOIN qinglong.triggers t ON t.trigger_id = s.trigger_id
        JOIN qinglong.projects p ON p.project_id = t.project_id
        WHERE p.active AND t.enabled AND t.trigger_revision = s.trigger_revision) AS schedules_enabled,
       due.n AS schedules_due,
       due.oldest AS oldest_due_ms,
       by_state.runs AS runs_by_state,
       lag.n AS admitted_in_window,
       lag.p50 AS admission_lag_p50_ms,
       lag.p99 AS admission_lag_p99_ms,
       (SELECT coalesce(sum(k.skipped_count), 0)
        FROM qinglong.schedule_skips k
        WHERE k.recorded_at_ms >= clock.now_ms - %(recent_window_ms)s::bigint) AS skipped_recent,
       (SELECT count(*) FROM qinglong.runs r
        WHERE r.state IN ('queued', 'dispatching', 'running') AND r.state = 'running') AS running,
       replicas.live AS live_schedulers,
       replicas.last_round_at_ms
FROM clock, due, lag, by_state, replicas
