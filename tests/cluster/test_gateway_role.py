"""The worker gateway's own role: created NOLOGIN by the bootstrap, accepted by readiness with or
without LOGIN, and (migration 0025) the only role but the owner that may execute a worker
function, also on a database upgraded from the shared worker login."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from qinglong.contracts.errors import SchemaNotReady
from qinglong.plugins.cluster_postgres import migrations
from qinglong.plugins.cluster_postgres.gateway import PostgresWorkerGateway
from qinglong.plugins.cluster_postgres.roles import (
    GATEWAY_FUNCTIONS, WORKER_FUNCTIONS, bootstrap_statements, gateway_login_statement,
)
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
from tests.support.cluster import arun
from tests.support.pg import drop_database
from tests.support.postgres import fresh_name

GATEWAY = "qinglong_gateway"
FORMS_SQL = """
SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'qinglong' AND p.proname = ANY (%s) ORDER BY 1
"""


async def _ready(backend):
    try:
        await backend.check_readiness()
    finally:
        await backend.close()


async def _gateway_problems(dsn: str) -> list[str]:
    gateway = PostgresWorkerGateway(dsn, "gateway role test", 1)
    try:
        return await gateway.check()
    finally:
        await gateway.close()


def _executes(db, role: str) -> dict[str, bool]:
    """``{signature: may execute}`` of every form of every worker and gateway function."""
    forms = [r[0] for r in db.sql(FORMS_SQL, (list(WORKER_FUNCTIONS + GATEWAY_FUNCTIONS),))]
    # every function, in each form the migrations applied so far made (worker_complete: several)
    assert {f.split("(")[0].removeprefix("qinglong.") for f in forms} == set(WORKER_FUNCTIONS + GATEWAY_FUNCTIONS)
    return {f: db.sql("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, f))[0][0] for f in forms}


def test_a_database_upgraded_from_the_shared_login_moves_every_worker_grant_to_the_gateway_role(
        fresh_db, monkeypatch):
    """Without 0025 an upgraded database would keep the old shared login able to execute every
    worker function (whoever held its password could still act as any worker), the new role could
    execute nothing, and the old role could not be dropped."""
    old = fresh_name("old_ingress")
    db = fresh_db
    db.sql(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION "
                   "NOBYPASSRLS CONNECTION LIMIT 64 PASSWORD 'old-secret-Pw9'").format(sql.Identifier(old)))
    try:
        # the database as the release before made it: the old login in the gateway's place
        db.sql(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(sql.Identifier(db.dbname),
                                                                       sql.Identifier(GATEWAY)))
        db.sql(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(db.dbname),
                                                                    sql.Identifier(old)))
        stream = migrations.known_migrations()
        before = tuple(m for m in stream if m.version <= 24)
        assert stream[len(before)].name == "gateway_role"
        with monkeypatch.context() as patch:
            patch.setattr(migrations, "known_migrations", lambda: before)
            arun(db.backend(settings=db.settings(gateway_role=old)).migrate())
        old_dsn = db.server.dsn(old, "old-secret-Pw9", db.dbname)
        with psycopg.connect(old_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM qinglong.worker_identity('\\x00'::bytea)").fetchone() == (0,)
        assert set(_executes(db, old).values()) == {True}
        assert set(_executes(db, GATEWAY).values()) == {False}

        arun(db.backend().migrate())  # 0025 alone

        assert set(_executes(db, old).values()) == {False}
        assert set(_executes(db, GATEWAY).values()) == {True}
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(old_dsn, autocommit=True).close()
        with psycopg.connect(db.superuser_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(old)))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM qinglong.worker_identity('\\x00'::bytea)")
        arun(_ready(db.backend()))
        assert arun(_gateway_problems(db.dsn(GATEWAY))) == []
        db.sql(sql.SQL("DROP ROLE {}").format(sql.Identifier(old)))
        assert db.sql("SELECT count(*) FROM pg_roles WHERE rolname = %s", (old,)) == [(0,)]
    finally:
        drop_database(db.server, db.dbname)  # its grants would keep the role
        with psycopg.connect(db.server.superuser_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(old)))


def test_a_freshly_bootstrapped_gateway_role_cannot_log_in_until_the_operator_allows_it(pg_server):
    """Before, the bootstrap gave the gateway's role a password and LOGIN everywhere: any host
    pg_hba.conf let through could log in as it. Now it logs in only once an operator allows it."""
    name = fresh_name("gw_boot")
    roles = dict(ClusterPostgresSettings().roles(), gateway=name)
    (create,) = [line for line in bootstrap_statements(roles, "unused") if line.endswith("-- gateway")]
    assert "NOLOGIN" in create and "PASSWORD" not in create and "CONNECTION LIMIT 64" in create
    with psycopg.connect(pg_server.superuser_dsn(), autocommit=True) as conn:
        conn.execute(create)
    try:
        password = "gw-boot-secret-Pw5"
        with psycopg.connect(pg_server.superuser_dsn(), autocommit=True) as conn:
            # even holding a password set by someone, it may not log in
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
        with pytest.raises(psycopg.OperationalError, match="is not permitted to log in"):
            psycopg.connect(pg_server.dsn(name, password, "postgres")).close()
        statement = gateway_login_statement(roles)
        assert statement == f"ALTER ROLE \"{name}\" LOGIN PASSWORD '...';"
        with psycopg.connect(pg_server.superuser_dsn(), autocommit=True) as conn:
            conn.execute(statement.replace("'...'", sql.Literal(password).as_string(conn)))
        with psycopg.connect(pg_server.dsn(name, password, "postgres")) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (name,)
    finally:
        with psycopg.connect(pg_server.superuser_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def test_readiness_accepts_the_gateway_role_with_login_on_or_off(cluster):
    """The bootstrap leaves the role NOLOGIN and gateway hosts' operators give it LOGIN: a
    fingerprint demanding either would refuse half the correct installations."""
    arun(_ready(cluster.backend()))
    cluster.sql(f"ALTER ROLE {GATEWAY} NOLOGIN")
    try:
        arun(_ready(cluster.backend()))
    finally:
        cluster.sql(f"ALTER ROLE {GATEWAY} LOGIN")
    arun(_ready(cluster.backend()))


@pytest.mark.parametrize("change, undo, fragments", [
    ("CREATEDB", "NOCREATEDB", ["has CREATEDB", "createdb=t login=any"]),
    ("INHERIT", "NOINHERIT", ["inherit=t"]),
    ("SUPERUSER", "NOSUPERUSER", ["has SUPERUSER"]),
])
def test_every_other_attribute_of_the_gateway_role_is_still_checked(cluster, change, undo, fragments):
    cluster.sql(f"ALTER ROLE {GATEWAY} {change}")
    try:
        with pytest.raises(SchemaNotReady) as info:
            arun(_ready(cluster.backend()))
    finally:
        cluster.sql(f"ALTER ROLE {GATEWAY} {undo}")
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("change, undo, fragment", [
    ("ALTER ROLE qinglong_gateway CONNECTION LIMIT -1", "ALTER ROLE qinglong_gateway CONNECTION LIMIT 64",
     "the gateway's role has no CONNECTION LIMIT"),
    ("ALTER ROLE qinglong_gateway SUPERUSER", "ALTER ROLE qinglong_gateway NOSUPERUSER",
     "the gateway's role is a superuser"),
    ("GRANT qinglong_admin TO qinglong_gateway", "REVOKE qinglong_admin FROM qinglong_gateway",
     "the gateway's role is a member of qinglong_admin"),
    ("GRANT qinglong_gateway TO qinglong_runtime", "REVOKE qinglong_gateway FROM qinglong_runtime",
     "the gateway's role has member(s) qinglong_runtime"),
    ("GRANT EXECUTE ON FUNCTION qinglong.worker_identity(bytea) TO qinglong_runtime",
     "REVOKE EXECUTE ON FUNCTION qinglong.worker_identity(bytea) FROM qinglong_runtime",
     "qinglong_runtime may execute qinglong.worker_identity, which only the gateway's role may"),
])
def test_the_gateways_readiness_still_fails_on_its_roles_drift(cluster, change, undo, fragment):
    """Login is the one attribute left to the operator: a role without a connection bound, a
    superuser, a member of another role, or a worker function another role can call still fails
    the gateway's readiness."""
    assert arun(_gateway_problems(cluster.dsn(GATEWAY))) == []
    cluster.sql(change)
    try:
        problems = arun(_gateway_problems(cluster.dsn(GATEWAY)))
    finally:
        cluster.sql(undo)
    assert any(fragment in p for p in problems), problems
