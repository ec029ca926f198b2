-- capability: 23
-- The worker gateway has a role of its own ({{gateway}}, created NOLOGIN by the bootstrap and
-- given LOGIN only where a gateway runs) instead of the shared worker login. On a fresh install the
-- earlier migrations already granted to it; on an upgraded database this grants it what the
-- gateway needs (the schema's USAGE, EXECUTE on every form of the worker functions and of the
-- gateway's token lookup, CONNECT on the database) and takes the same from every other role that
-- still holds them (the old login, whatever its name), so that role can execute nothing and can
-- be dropped. The owner, and for USAGE and CONNECT the admin and runtime roles, keep theirs.

GRANT USAGE ON SCHEMA qinglong TO {{gateway}};

DO $$
DECLARE
    gateway oid := '{{gateway}}'::regrole::oid;
    owner_role oid := '{{owner}}'::regrole::oid;
    keep oid[] := ARRAY['{{owner}}'::regrole::oid, '{{admin}}'::regrole::oid,
                        '{{runtime}}'::regrole::oid, '{{gateway}}'::regrole::oid];
    functions text[] := ARRAY['worker_open_session', 'worker_heartbeat', 'worker_claim',
                              'worker_started', 'worker_append_log', 'worker_complete',
                              'worker_complete_late', 'worker_close_session', 'worker_identity'];
    found record;
BEGIN
    -- every form of each function: the gateway's EXECUTE, nobody else's but the owner's
    FOR found IN
        SELECT p.oid::pg_catalog.regprocedure::text AS signature FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'qinglong' AND p.proname = ANY (functions)
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO {{gateway}}', found.signature);
    END LOOP;
    FOR found IN
        SELECT DISTINCT p.oid::pg_catalog.regprocedure::text AS signature, a.grantee
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        CROSS JOIN LATERAL pg_catalog.aclexplode(
            coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
        WHERE n.nspname = 'qinglong' AND p.proname = ANY (functions)
          AND a.grantee <> p.proowner AND a.grantee <> gateway AND a.grantee <> owner_role
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %s CASCADE', found.signature,
            CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(found.grantee)) END);
    END LOOP;

    -- the schema's USAGE: only our four roles
    FOR found IN
        SELECT DISTINCT a.grantee FROM pg_catalog.pg_namespace n
        CROSS JOIN LATERAL pg_catalog.aclexplode(
            coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) a
        WHERE n.nspname = 'qinglong' AND a.grantee <> n.nspowner AND NOT (a.grantee = ANY (keep))
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA qinglong FROM %s CASCADE',
            CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(found.grantee)) END);
    END LOOP;

    -- the database's CONNECT: the gateway's, and nobody's but our four roles'
    EXECUTE pg_catalog.format('GRANT CONNECT ON DATABASE %I TO {{gateway}}',
                              pg_catalog.current_database());
    FOR found IN
        SELECT DISTINCT a.grantee FROM pg_catalog.pg_database d
        CROSS JOIN LATERAL pg_catalog.aclexplode(
            coalesce(d.datacl, pg_catalog.acldefault('d', d.datdba))) a
        WHERE d.datname = pg_catalog.current_database() AND a.grantee <> d.datdba
          AND a.privilege_type = 'CONNECT' AND NOT (a.grantee = ANY (keep))
    LOOP
        EXECUTE pg_catalog.format('REVOKE CONNECT ON DATABASE %I FROM %s CASCADE',
            pg_catalog.current_database(),
            CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(found.grantee)) END);
    END LOOP;
END
$$;
