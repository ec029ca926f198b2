"""Readiness compares the whole catalog with the shipped fingerprint and names each difference."""

from __future__ import annotations

import itertools
import os

import psycopg
import pytest

from tests.support.cluster import arun, migrate
from qinglong.contracts.errors import SchemaNotReady
from qinglong.plugins.cluster_postgres import fingerprint
from tests.support.aio import closing

_roles = itertools.count(1)


async def _collect(backend):
    async with closing(backend):
        pool = await backend.runtime_pool()
        async with pool.connection() as conn:
            return await fingerprint.collect(conn, backend.settings.roles())


def test_shipped_fingerprint_matches_a_freshly_migrated_database(fresh_db):
    """A stale shipped fingerprint would make readiness refuse every correctly migrated database
    (or accept the drift it was regenerated over). Regenerate with
    ``python tests/cluster/regenerate_fingerprint.py``."""
    migrate(fresh_db)
    actual = arun(_collect(fresh_db.backend()))
    assert fingerprint.differences(actual, fingerprint.expected(), limit=1000) == [], (
        "the shipped fingerprint is stale: run python tests/cluster/regenerate_fingerprint.py")


def test_fingerprint_does_not_depend_on_role_names(pg_server, fresh_db):
    """Operators may name the roles as they like; the shipped fingerprint must hold for any names."""
    from tests.support.pg import create_database, create_roles, drop_database, ROLE_PASSWORDS
    from tests.support.cluster import ClusterDb

    suffix = f"{os.getpid()}_{next(_roles)}"
    names = {f: f"alt_{f}_{suffix}" for f in ("owner", "admin", "runtime", "gateway")}
    passwords = {names[f]: ROLE_PASSWORDS[f"qinglong_{f}"] for f in names}
    create_roles(pg_server, passwords)
    dbname = f"ql_alt_{suffix}"
    try:
        create_database(pg_server, dbname, owner=names["owner"],
                        connect_roles=(names["admin"], names["runtime"], names["gateway"]))
        db = ClusterDb(pg_server, dbname)
        settings = db.settings(
            runtime_dsn=pg_server.dsn(names["runtime"], passwords[names["runtime"]], dbname),
            admin_dsn=pg_server.dsn(names["admin"], passwords[names["admin"]], dbname),
            owner_dsn=pg_server.dsn(names["owner"], passwords[names["owner"]], dbname),
            owner_role=names["owner"], admin_role=names["admin"], runtime_role=names["runtime"],
            gateway_role=names["gateway"])

        async def body():
            backend = db.backend(settings=settings)
            async with closing(backend):
                await backend.migrate()
                await backend.check_readiness()

        arun(body())
    finally:
        drop_database(pg_server, dbname)
        with psycopg.connect(pg_server.superuser_dsn(), autocommit=True) as conn:
            for name in names.values():
                conn.execute(f"DROP ROLE IF EXISTS {name}")


def _not_ready(db, *fragments) -> str:
    backend = db.backend()

    async def body():
        async with closing(backend):
            await backend.check_readiness()

    with pytest.raises(SchemaNotReady) as info:
        arun(body())
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, text
    return text


#: (drift, statements run as the superuser, fragments readiness must name). ``{db}`` is the
#: database, ``{other}`` a throw-away login role.
DRIFT = [
    ("grant_with_grant_option",
     ["GRANT SELECT ON qinglong.runs TO qinglong_runtime WITH GRANT OPTION"],
     ["unexpected privilege: SELECT WITH GRANT OPTION on table runs for qinglong_runtime",
      "catalog drift: unexpected relation-acl name=runs grantee_role={{runtime}} privilege=SELECT grantable=t"]),
    ("column_grant_with_grant_option",
     ["GRANT UPDATE (claim_owner) ON qinglong.trigger_schedules TO qinglong_runtime WITH GRANT OPTION"],
     ["catalog drift: unexpected column-acl relation=trigger_schedules name=claim_owner "
      "grantee_role={{runtime}} privilege=UPDATE grantable=t"]),
    ("another_login_member_of_our_role",
     ["CREATE ROLE {other} LOGIN", "GRANT qinglong_runtime TO {other}"],
     ["role qinglong_runtime (runtime) has member(s) {other}",
      "catalog drift: unexpected membership member_role={other} of_role={{runtime}}"]),
    ("our_role_member_of_another",
     ["CREATE ROLE {other} NOLOGIN", "GRANT {other} TO qinglong_admin"],
     ["catalog drift: unexpected membership member_role={{admin}} of_role={other}"]),
    ("database_connect_for_public",
     ["GRANT CONNECT ON DATABASE {db} TO PUBLIC"],
     ["catalog drift: unexpected database-acl grantee_role=PUBLIC privilege=CONNECT"]),
    ("database_temp_for_runtime",
     ["GRANT TEMPORARY ON DATABASE {db} TO qinglong_runtime"],
     ["database {db} grants TEMPORARY to qinglong_runtime",
      "catalog drift: unexpected database-acl grantee_role={{runtime}} privilege=TEMPORARY"]),
    ("security_definer_function_in_our_schema",
     ["SET ROLE qinglong_owner",
      "CREATE FUNCTION qinglong.as_owner() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'"],
     ["catalog drift: unexpected function signature=qinglong.as_owner() owner_role={{owner}} kind=f "
      "security_definer=t",
      "catalog drift: unexpected function-acl signature=qinglong.as_owner() grantee_role=PUBLIC privilege=EXECUTE"]),
    ("security_definer_function_elsewhere",
     ["CREATE FUNCTION public.as_superuser() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'"],
     ["catalog drift: unexpected function signature=public.as_superuser() owner_role=postgres kind=f security_definer=t"]),
    ("trigger_on_our_table",
     ["CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'",
      "CREATE TRIGGER sneaky BEFORE INSERT ON qinglong.runs FOR EACH ROW EXECUTE FUNCTION public.noop()"],
     ["catalog drift: unexpected trigger relation=runs name=sneaky definition=CREATE TRIGGER sneaky "
      "BEFORE INSERT ON qinglong.runs"]),
    ("foreign_key_triggers_disabled",
     ["ALTER TABLE qinglong.attempts DISABLE TRIGGER ALL"],
     ["catalog drift: unexpected internal-trigger relation=attempts constraint_name=attempts_run_id_fkey "
      'function="RI_FKey_check_ins" type=5 enabled=D']),
    ("rule_on_our_table",
     ["CREATE RULE swallow AS ON INSERT TO qinglong.schedule_skips DO INSTEAD NOTHING"],
     ["catalog drift: unexpected rule relation=schedule_skips name=swallow"]),
    ("row_level_security",
     ["ALTER TABLE qinglong.trigger_schedules ENABLE ROW LEVEL SECURITY",
      "CREATE POLICY hide ON qinglong.trigger_schedules FOR SELECT TO qinglong_runtime USING (false)"],
     ["catalog drift: unexpected relation name=trigger_schedules kind=r owner_role={{owner}} persistence=p "
      "row_security=t",
      "catalog drift: unexpected policy relation=trigger_schedules name=hide command=r permissive=t "
      "to_roles=[{{runtime}}]"]),
    ("dropped_unique_on_idempotency_key",
     ["ALTER TABLE qinglong.runs DROP CONSTRAINT runs_idempotency_key_key"],
     ["catalog drift: missing constraint relation=runs name=runs_idempotency_key_key type=u "
      "definition=UNIQUE (idempotency_key)",
      "catalog drift: missing index relation=runs name=runs_idempotency_key_key"]),
    ("changed_column_type",
     ["ALTER TABLE qinglong.runs ALTER COLUMN queued_at_ms TYPE numeric"],
     ["catalog drift: unexpected column relation=runs name=queued_at_ms position=11 type=numeric",
      "catalog drift: missing column relation=runs name=queued_at_ms position=11 type=bigint"]),
    ("dropped_not_null",
     ["ALTER TABLE qinglong.trigger_schedules ALTER COLUMN project_id DROP NOT NULL"],
     ["catalog drift: unexpected column relation=trigger_schedules name=project_id position=2 type=text "
      "not_null=f"]),
    ("changed_check_constraint",
     ["ALTER TABLE qinglong.triggers DROP CONSTRAINT triggers_misfire_grace_ms_check",
      "ALTER TABLE qinglong.triggers ADD CONSTRAINT triggers_misfire_grace_ms_check CHECK (misfire_grace_ms >= -1)"],
     ["catalog drift: unexpected constraint relation=triggers name=triggers_misfire_grace_ms_check type=c "
      "definition=CHECK ((misfire_grace_ms >= '-1'::integer))"]),
    ("extra_index",
     ["CREATE INDEX runs_by_state ON qinglong.runs (state)"],
     ["catalog drift: unexpected index relation=runs name=runs_by_state definition=CREATE INDEX "
      "runs_by_state ON qinglong.runs USING btree (state)"]),
    ("unlogged_table",
     ["ALTER TABLE qinglong.schedule_skips SET UNLOGGED"],
     ["catalog drift: unexpected relation name=schedule_skips kind=r owner_role={{owner}} persistence=u"]),
    ("default_privileges_for_the_owner",
     ["ALTER DEFAULT PRIVILEGES FOR ROLE qinglong_owner IN SCHEMA qinglong "
      "GRANT SELECT ON TABLES TO qinglong_gateway"],
     ["catalog drift: unexpected default-acl for_role={{owner}} schema=qinglong object_type=r "
      "grantee_role={{gateway}} privilege=SELECT"]),
    ("grant_to_our_role_outside_our_schema",
     ["CREATE TABLE public.loot (x int)", "GRANT SELECT ON public.loot TO qinglong_gateway"],
     ["catalog drift: unexpected depends-on-role dependency=a object=table public.loot "
      "on_role={{gateway}}"]),
]


@pytest.mark.parametrize("drift, statements, fragments", DRIFT, ids=[d[0] for d in DRIFT])
def test_readiness_fails_closed_naming_each_kind_of_catalog_drift(cluster, drift, statements, fragments):
    """Each drift here changes what the roles can do or what the schema guarantees (a grantable
    privilege hands itself on; a member acts as our role; a TEMP or SECURITY DEFINER function runs
    someone's code with our rights; a trigger, rule or policy silently rewrites or hides rows; no
    UNIQUE on idempotency_key lets a Run be admitted twice; a changed column or an extra index is a
    schema this code was not written for). Readiness must refuse each, naming it."""
    other = f"drift_{os.getpid()}_{next(_roles)}"

    def fill(text: str) -> str:  # not str.format: fragments hold {{runtime}} placeholders
        return text.replace("{db}", cluster.dbname).replace("{other}", other)

    try:
        with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as conn:
            for statement in statements:
                conn.execute(fill(statement))
        _not_ready(cluster, *(fill(f) for f in fragments))
    finally:
        with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (other,)).fetchone()
            if exists:
                conn.execute(f"DROP OWNED BY {other} CASCADE")
                conn.execute(f"DROP ROLE {other}")
