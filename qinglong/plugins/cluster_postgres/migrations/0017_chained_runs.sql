-- capability: 15
-- Chained Runs: a trigger of kind 'after' ({"task": <upstream task>, "on": success | failure |
-- any}) admits a Run of its own task when a Run of the upstream task ends with a matching
-- outcome. A row trigger on runs admits it in the transaction that records the upstream outcome,
-- whichever path records it (a worker's completion, the control plane's expiry, a cancel, a
-- closed session), keyed ql3:chain:v1:<upstream run>:<trigger> (contracts.chain), so a crash
-- between the two can neither lose nor double it. The downstream Run pins its task's head
-- revision, as a cron admission does; a deleted task or an inactive project admits nothing.

CREATE FUNCTION qinglong._chain_after_end() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    v_now bigint := coalesce(NEW.finished_at_ms, qinglong._now_ms());
    v_run uuid;
BEGIN
    FOR t IN
        SELECT tr.trigger_id, tr.trigger_revision, tr.task_id, k.task_revision, e.content_digest
        FROM qinglong.triggers tr
        JOIN qinglong.projects p ON p.project_id = tr.project_id
        JOIN qinglong.tasks k ON k.project_id = tr.project_id AND k.task_id = tr.task_id
        JOIN qinglong.execution_revisions e
          ON e.project_id = k.project_id AND e.task_id = k.task_id
         AND e.task_revision = k.task_revision AND e.executor = 'remote_worker'
        WHERE tr.project_id = NEW.project_id AND tr.kind = 'after' AND tr.enabled
          AND tr.spec_json ->> 'task' = NEW.task_id
          AND CASE coalesce(tr.spec_json ->> 'on', 'success')
                  WHEN 'success' THEN NEW.state = 'succeeded'
                  WHEN 'failure' THEN NEW.state IN ('failed', 'timed_out', 'lost')
                  WHEN 'any' THEN true
                  ELSE false END
          AND p.active AND p.deleted_at_ms IS NULL AND k.deleted_at_ms IS NULL
        ORDER BY tr.trigger_id
    LOOP
        v_run := pg_catalog.gen_random_uuid();
        INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                   task_revision, executor, execution_digest, scheduled_for_ms,
                                   admitted_at_ms, queued_at_ms, state, owned_by, cancelled,
                                   idempotency_key, admitted_by)
        VALUES (v_run, NEW.project_id, t.trigger_id, t.trigger_revision, t.task_id,
                t.task_revision, 'remote_worker', t.content_digest, v_now, v_now, v_now, 'queued',
                'runtime', false, 'ql3:chain:v1:' || NEW.run_id::text || ':' || t.trigger_id,
                'chain')
        ON CONFLICT (idempotency_key) DO NOTHING;
        IF FOUND THEN
            INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor,
                                           created_at_ms)
            VALUES (pg_catalog.gen_random_uuid(), v_run, 1, 'claimed', 'remote_worker', v_now);
            INSERT INTO qinglong.run_events (event_id, run_id, seq, event_type, at_ms)
            VALUES (pg_catalog.gen_random_uuid(), v_run, 1, 'run.created', v_now),
                   (pg_catalog.gen_random_uuid(), v_run, 2, 'run.queued', v_now);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_chain_on_end AFTER UPDATE OF state ON qinglong.runs
FOR EACH ROW
WHEN (NEW.state IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')
      AND OLD.state NOT IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'lost'))
EXECUTE FUNCTION qinglong._chain_after_end();

REVOKE ALL ON FUNCTION qinglong._chain_after_end() FROM PUBLIC;
