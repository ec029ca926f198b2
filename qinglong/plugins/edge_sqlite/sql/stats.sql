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

-- name: stats_failing_tasks
-- The tasks (not deleted, of active projects) whose newest ended Run failed, timed out or was
-- lost, with their outcome figures, longest failure streak first, at most :shown of them, each
-- row carrying how many there are in all and how many of them failed :periods Runs in a row or more. Every figure is a seek or a short range of
-- runs_ended_by_task (migration 0009); cancelled Runs count in no figure.
WITH per_task AS (
    SELECT t.project_id, t.task_id,
           (SELECT r.state FROM runs AS r INDEXED BY runs_ended_by_task
             WHERE r.project_id = t.project_id AND r.task_id = t.task_id
               AND r.finished_at_ms IS NOT NULL AND r.state <> 'cancelled'
             ORDER BY r.finished_at_ms DESC LIMIT 1) AS last_outcome,
           (SELECT max(r.finished_at_ms) FROM runs AS r INDEXED BY runs_ended_by_task
             WHERE r.project_id = t.project_id AND r.task_id = t.task_id
               AND r.finished_at_ms IS NOT NULL AND r.state <> 'cancelled') AS last_finished_at_ms,
           (SELECT max(r.finished_at_ms) FROM runs AS r INDEXED BY runs_ended_by_task
             WHERE r.project_id = t.project_id AND r.task_id = t.task_id
               AND r.finished_at_ms IS NOT NULL AND r.state = 'succeeded') AS last_success_at_ms
      FROM tasks AS t
     CROSS JOIN projects AS p ON p.project_id = t.project_id
     WHERE t.deleted_at_ms IS NULL AND p.active = 1
),
failing AS (
    SELECT f.*,
           (SELECT count(*) FROM runs AS r INDEXED BY runs_ended_by_task
             WHERE r.project_id = f.project_id AND r.task_id = f.task_id
               AND r.finished_at_ms IS NOT NULL
               AND r.finished_at_ms > COALESCE(f.last_success_at_ms, -1)
               AND r.state IN ('failed', 'timed_out', 'lost')) AS failure_streak,
           (SELECT count(*) FROM runs AS r INDEXED BY runs_ended_by_task
             WHERE r.project_id = f.project_id AND r.task_id = f.task_id
               AND r.finished_at_ms IS NOT NULL AND r.finished_at_ms >= :window_since
               AND r.state <> 'cancelled') AS ended_in_window,
           (SELECT count(*) FROM runs AS r INDEXED BY runs_ended_by_task
             WHERE r.project_id = f.project_id AND r.task_id = f.task_id
               AND r.finished_at_ms IS NOT NULL AND r.finished_at_ms >= :window_since
               AND r.state = 'succeeded') AS succeeded_in_window
      FROM per_task AS f
     WHERE f.last_outcome IN ('failed', 'timed_out', 'lost')
)
SELECT project_id, task_id, last_outcome, last_finished_at_ms, last_success_at_ms, failure_streak,
       ended_in_window, succeeded_in_window, count(*) OVER () AS failing_total,
       sum(CASE WHEN failure_streak >= :periods THEN 1 ELSE 0 END) OVER () AS not_succeeding_total
  FROM failing
 ORDER BY failure_streak DESC, project_id, task_id
 LIMIT :shown;

-- name: stats_queued_by_task
-- Runs waiting to start, per task: the deepest :limit queues (the in-flight index's range).
SELECT project_id, task_id, count(*) AS n
  FROM runs INDEXED BY runs_by_state
 WHERE state = 'queued'
 GROUP BY project_id, task_id
 ORDER BY n DESC, project_id, task_id
 LIMIT :limit;
