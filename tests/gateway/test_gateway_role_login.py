"""The gateway's role as the bootstrap creates it (NOLOGIN) cannot reach the database; once the
operator's ALTER ROLE gives it LOGIN, a real ``qinglong api`` serves a real worker through it."""

from __future__ import annotations

import signal

import psycopg
import pytest
from psycopg import sql

from qinglong.plugins.cluster_postgres.roles import bootstrap_statements, gateway_login_statement
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
from tests.gateway.helpers import ApiGateway, plane_settings, register, start_gateway_worker
from tests.support.cluster import arun
from tests.support.pg import drop_database
from tests.support.postgres import fresh_name
from tests.worker.helpers import admit, attempts, publish_task, py_job, wait_run_state


def test_the_bootstrapped_gateway_role_logs_in_only_after_the_operators_alter(fresh_db, tmp_path):
    """Before, the bootstrap gave the gateway's role LOGIN and a password wherever pg_hba.conf let
    a host through; now a role nobody enabled is refused, and enabling it is the one step a
    gateway host needs."""
    db, name, password = fresh_db, fresh_name("gw_login"), "gw-login-secret-Pw6"
    roles = dict(ClusterPostgresSettings().roles(), gateway=name)
    statements = bootstrap_statements(roles, db.dbname)
    (create,) = [line for line in statements if line.endswith("-- gateway")]
    (grant,) = [line for line in statements if line.startswith("GRANT CONNECT")]
    api = worker = None
    with psycopg.connect(db.server.superuser_dsn(), autocommit=True) as conn:
        conn.execute(create)
        conn.execute(grant)
    try:
        arun(db.backend(settings=db.settings(gateway_role=name)).migrate())
        dsn = db.server.dsn(name, password, db.dbname)
        # as bootstrapped it has no password; given one, it still may not log in
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn).close()
        with psycopg.connect(db.server.superuser_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
        with pytest.raises(psycopg.OperationalError, match="is not permitted to log in"):
            psycopg.connect(dsn).close()
        with psycopg.connect(db.server.superuser_dsn(), autocommit=True) as conn:
            conn.execute(gateway_login_statement(roles).replace("'...'", sql.Literal(password).as_string(conn)))

        settings = plane_settings(db, tmp_path, gateway_dsn=dsn)
        settings.write_text(settings.read_text().replace("[backend]\n", f'[backend]\ngateway_role = "{name}"\n'))
        token = register(settings, "w-role")
        api = ApiGateway(settings, tmp_path / "api.stderr")
        trigger = publish_task(db, "hello", {"command": py_job("print('served')"), "timeout_ms": 60_000})
        run_id = admit(db, trigger)
        worker = start_gateway_worker(api.url, token, tmp_path, "w-role")
        assert wait_run_state(db, run_id) == "succeeded", api.text()
        (attempt,) = attempts(db, run_id)
        assert attempt["exit_code"] == 0
        sessions = db.sql("SELECT usename FROM pg_stat_activity WHERE datname = %s AND usename = %s",
                          (db.dbname, name))
        assert sessions, "the gateway's connections are its own role's"
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        if worker is not None:
            worker.stop()
        if api is not None:
            api.stop()
        drop_database(db.server, db.dbname)  # its grants would keep the role
        with psycopg.connect(db.server.superuser_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
