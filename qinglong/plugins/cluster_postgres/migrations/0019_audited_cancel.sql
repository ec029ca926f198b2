-- capability: 17
-- A Run cancelled through the management API is cancelled by the runtime role (`qinglong api`
-- cancels as the replicas do), which cannot write the audit log. This function cancels and
-- appends the request's audit entry in the one transaction of its caller: both commit or
-- neither. It writes only a `run.cancel` entry for the Run it cancelled, and only when the Run
-- exists; any other audit entry still needs the admin role.
CREATE FUNCTION qinglong.request_cancel_audited(p_run_id uuid, p_reason text, p_at_ms bigint, p_actor text,
                                                p_token_id text, p_source text, p_detail jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_state text;
BEGIN
    v_state := qinglong.request_cancel(p_run_id, p_reason);
    IF v_state IS NOT NULL THEN
        INSERT INTO qinglong.audit_log (at_ms, actor, token_id, source, action, object, result, detail)
        VALUES (p_at_ms, p_actor, p_token_id, p_source, 'run.cancel', p_run_id::text, 'ok',
                COALESCE(p_detail, '{}'::jsonb));
    END IF;
    RETURN v_state;
END $$;

REVOKE ALL ON FUNCTION qinglong.request_cancel_audited(uuid, text, bigint, text, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qinglong.request_cancel_audited(uuid, text, bigint, text, text, text, jsonb)
TO {{runtime}};
