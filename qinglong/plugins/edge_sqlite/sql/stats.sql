-- The store-derived figures behind /metrics and `qinglong status`, read in one read transaction
-- (see stats.py). Each block reads an index whose size is the backlog or the recent window, except
-- the totals, which are counts.

-- name: stats_figures
-- The scalar figures at :now: schedules (all; of enabled triggers of active projects: all less
-- those of disabled triggers and of inactive projects, each read through its own index), the due
-- backlog and its oldest occurrence (a range of the due index: next_fire_at_ms <= :now excludes
-- the NULL cursors awaiting initialization), skips recorded and Attempts lost since :recent_since,
-- running Attempts, and how many trigger Runs were admitted since :lag_since. A partial index
-- serves a query only when its predicate is repeated word for word (attempts_active).
SELECT (SELECT count(*) FROM trigger_schedules) AS schedules_total,
       (SELECT count(*) FROM trigger_schedules)
       - (SELECT count(*) FROM triggers AS t INDEXED BY triggers_disabled
           CROSS JOIN trigger_schedules AS s ON s.trigger_id = t.trigger_id
           WHERE t.enabled = 0)
       - (SELECT count(*) FROM projects AS p
           CROSS JOIN triggers AS t INDEXED BY triggers_by_project ON t.project_id = p.project_id
           CROSS JOIN trigger_schedules AS s ON s.trigger_id = t.trigger_id
           WHERE p.active = 0 AND t.enabled = 1) AS schedules_enabled,
       due.n AS schedules_due,
       due.oldest AS oldest_due_ms,
       (SELECT COALESCE(sum(k.count), 0) FROM schedule_skips AS k INDEXED BY schedule_skips_by_recorded
         WHERE k.recorded_at_ms >= :recent_since)
       + (SELECT count(*) FROM run_skips AS k INDEXED BY run_skips_by_recorded
           WHERE k.recorded_at_ms >= :recent_since) AS skipped_recent,
       (SELECT count(*) FROM attempts AS a INDEXED BY attempts_lost
         WHERE a.state = 'lost' AND a.finished_at_ms >= :recent_since) AS lost_recent,
       (SELECT count(*) FROM attempts AS a INDEXED BY attempts_active
         WHERE a.state IN ('dispatching', 'running') AND a.state = 'running') AS running,
       (SELECT count(*) FROM runs AS r INDEXED BY runs_by_admission
         WHERE r.trigger_revision >= 1 AND r.admitted_at_ms >= :lag_since) AS admitted_in_window
  FROM (SELECT count(*) AS n, min(s.next_fire_at_ms) AS oldest
          FROM trigger_schedules AS s INDEXED BY trigger_schedules_due
         CROSS JOIN triggers AS t ON t.trigger_id = s.trigger_id
                                 AND t.trigger_revision = s.trigger_revision
         CROSS JOIN projects AS p ON p.project_id = s.project_id
         WHERE s.next_fire_at_ms <= :now AND t.enabled = 1 AND p.active = 1) AS due;

-- name: stats_runs_by_state
-- Runs by state: a total, counted from the narrow state index (migration 0006), not the table.
SELECT state, count(*) AS n FROM runs INDEXED BY runs_by_state GROUP BY state;

-- name: stats_lag_at_ranks
-- The admission lags (admitted minus scheduled) at the 1-based ranks :rank_a and :rank_b of the
-- trigger Runs (revision >= 1; a manual Run has 0) admitted since :lag_since, in ascending lag order (the nearest-rank percentiles).
SELECT rn, lag
  FROM (SELECT r.admitted_at_ms - r.scheduled_for_ms AS lag,
               row_number() OVER (ORDER BY r.admitted_at_ms - r.scheduled_for_ms) AS rn
          FROM runs AS r INDEXED BY runs_by_admission
         WHERE r.trigger_revision >= 1 AND r.admitted_at_ms >= :lag_since)
 WHERE rn IN (:rank_a, :rank_b);

-- name: stats_queued_by_task
-- Runs waiting to start, per task: the deepest :limit queues (the in-flight index's range).
SELECT project_id, task_id, count(*) AS n
  FROM runs INDEXED BY runs_by_state
 WHERE state = 'queued'
 GROUP BY project_id, task_id
 ORDER BY n DESC, project_id, task_id
 LIMIT :limit;
