-- capability: 24
-- Skip records age out: schedule_skips and run_skips grew without bound (a per-second trigger of
-- a 'forbid' task that runs long writes ~86,000 run_skips a day). The runtime role, which may not
-- DELETE either table, calls qinglong.prune_skips from every replica's skip retention loop
-- ([execution] skip_retention_days, in bounded batches).
--
-- * The cutoff is the caller's (contracts.execution.skip_cutoff_ms in database time), never
--   later than an hour ago (MIN_SKIP_RETENTION_MS: the window of the recent-skips figures), and
--   the limit is 1 to 10000 per kind (MAX_SKIP_PRUNE_BATCH); a test holds the copies equal.
-- * A run_skips record holding a manual Run's key stays: the key refuses a second admission
--   (qinglong._runs_key_kept), and a manual key admits one Run, ever. Occurrence keys go, as an
--   occurrence's cursor has passed it.
-- * Rows another transaction holds are left for the next call (SKIP LOCKED).

CREATE FUNCTION qinglong.prune_skips(p_older_than_ms bigint, p_limit integer,
                                     OUT occurrences integer, OUT runs integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_before bigint;
BEGIN
    IF p_older_than_ms IS NULL OR p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'prune_skips: expected a time and a limit of 1 to 10000' USING ERRCODE = 'QL003';
    END IF;
    v_before := least(p_older_than_ms, qinglong._now_ms() - 3600000::bigint);
    WITH old AS (
        SELECT k.skip_id FROM qinglong.schedule_skips k
        WHERE k.recorded_at_ms < v_before
        ORDER BY k.recorded_at_ms
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM qinglong.schedule_skips k USING old WHERE k.skip_id = old.skip_id
        RETURNING 1
    )
    SELECT count(*)::integer INTO occurrences FROM gone;
    WITH old AS (
        SELECT k.skip_seq FROM qinglong.run_skips k
        WHERE k.recorded_at_ms < v_before AND k.idempotency_key NOT LIKE 'ql3:manual:%'
        ORDER BY k.recorded_at_ms
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM qinglong.run_skips k USING old WHERE k.skip_seq = old.skip_seq
        RETURNING 1
    )
    SELECT count(*)::integer INTO runs FROM gone;
END $$;

REVOKE ALL ON FUNCTION qinglong.prune_skips(bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.prune_skips(bigint, integer) TO {{runtime}};
