-- capability: 8
-- The reasons table gained the words of a skipped Run whose task already has [execution]
-- max_queued Runs waiting to start (overlap_queue_full); qinglong._reason is generated again
-- from qinglong/contracts/reasons.py so both profiles keep one table of words.

-- generated: reasons.sql_reason_function() (do not edit by hand)
CREATE OR REPLACE FUNCTION qinglong._reason(p_key text, p_args text[] DEFAULT '{}')
RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer := coalesce(pg_catalog.array_length(p_args, 1), 0);
    v_text text;
BEGIN
    v_text := CASE p_key
        WHEN 'retry_succeeded' THEN
            CASE WHEN v_count = 0 THEN 'the process exited 0' END
        WHEN 'retry_cancelled' THEN
            CASE WHEN v_count = 0 THEN 'cancelled runs are not retried' END
        WHEN 'retry_not_started' THEN
            CASE WHEN v_count = 0 THEN 'the process could not be started' END
        WHEN 'retry_none_configured' THEN
            CASE WHEN v_count = 0 THEN 'no retry configured' END
        WHEN 'retry_attempts_used' THEN
            CASE WHEN v_count = 1 THEN 'all ' || p_args[1] || ' attempts used' END
        WHEN 'retry_lost_not_idempotent' THEN
            CASE WHEN v_count = 0 THEN 'a lost attempt may have run to the end; retried only for an idempotent task' END
        WHEN 'retry_timeout_not_retried' THEN
            CASE WHEN v_count = 0 THEN 'timeouts are not retried (retry.on_timeout = false)' END
        WHEN 'retry_exit_not_listed' THEN
            CASE WHEN v_count = 1 THEN 'exit status ' || p_args[1] || ' is not in retry.exit_codes' END
        WHEN 'retry_exit_by_signal' THEN
            CASE WHEN v_count = 0 THEN 'by signal' END
        WHEN 'overlap_max_running' THEN
            CASE WHEN v_count = 2 THEN p_args[1] || ' of this task running (concurrency.max_running = ' || p_args[2] || ')' END
        WHEN 'overlap_forbid' THEN
            CASE WHEN v_count = 1 THEN 'skipped: concurrency ''forbid'' and run ' || p_args[1] || ' of this task is still running' END
        WHEN 'overlap_replace_older' THEN
            CASE WHEN v_count = 0 THEN 'concurrency ''replace'': an older run of this task starts first' END
        WHEN 'overlap_replacing' THEN
            CASE WHEN v_count = 0 THEN 'replacing the running run of this task' END
        WHEN 'overlap_queue_full' THEN
            CASE WHEN v_count = 2 THEN 'skipped: ' || p_args[1] || ' runs of this task already wait to start ([execution] max_queued = ' || p_args[2] || ')' END
        WHEN 'overlap_replace_waiting' THEN
            CASE WHEN v_count = 1 THEN 'concurrency ''replace'': waiting for the replaced run ' || p_args[1] || ' to end' END
        WHEN 'overlap_queue' THEN
            CASE WHEN v_count = 0 THEN 'concurrency ''queue'': waiting for the earlier run' END
        WHEN 'cancel_timeout' THEN
            CASE WHEN v_count = 0 THEN 'the timeout expired' END
        WHEN 'cancel_operator' THEN
            CASE WHEN v_count = 0 THEN 'cancelled by an operator' END
        WHEN 'cancel_replaced' THEN
            CASE WHEN v_count = 0 THEN 'replaced by a newer run of the task' END
        WHEN 'cancel_shutdown' THEN
            CASE WHEN v_count = 0 THEN 'stopped with the control plane' END
        WHEN 'cancelled_before_start' THEN
            CASE WHEN v_count = 1 THEN p_args[1] || ' before the process started' END
        WHEN 'spec_missing' THEN
            CASE WHEN v_count = 0 THEN 'the task revision was published without an execution spec for workers; publish the task again' END
        WHEN 'spec_no_command' THEN
            CASE WHEN v_count = 0 THEN 'the task has no command' END
        WHEN 'spec_invalid' THEN
            CASE WHEN v_count = 0 THEN 'invalid execution spec: the stored spec lacks a key or has a key of the wrong type; publish the task again' END
        WHEN 'lease_expired' THEN
            CASE WHEN v_count = 2 THEN 'the lease of worker ' || p_args[1] || ' (session generation ' || p_args[2] || ') expired while the job was running' END
        WHEN 'deadline_unreported' THEN
            CASE WHEN v_count = 0 THEN 'the timeout expired and the worker did not report the end of the job' END
        WHEN 'session_closed' THEN
            CASE WHEN v_count = 0 THEN 'the worker closed its session while the job was running' END
        WHEN 'status_exit' THEN
            CASE WHEN v_count = 1 THEN 'exit status ' || p_args[1] END
        WHEN 'status_signal' THEN
            CASE WHEN v_count = 1 THEN 'killed by signal ' || p_args[1] END
        WHEN 'retry_scheduled' THEN
            CASE WHEN v_count = 5 THEN 'attempt ' || p_args[1] || ' ' || p_args[2] || ' (' || p_args[3] || '); attempt ' || p_args[4] || ' not before ' || p_args[5] END
    END;
    IF v_text IS NULL THEN
        RAISE EXCEPTION 'reason %: unknown key, or a missing or NULL value', p_key
            USING ERRCODE = 'QL003';
    END IF;
    RETURN v_text;
END $$;


REVOKE ALL ON FUNCTION qinglong._reason(text, text[]) FROM PUBLIC;
