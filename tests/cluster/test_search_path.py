"""Name resolution: no object planted in a schema others can create in ever runs in our sessions.

The attack: a role that may CREATE in ``public`` (the default before PostgreSQL 15, kept by
pg_upgrade and by restores) plants ``public.*(numeric, integer)``. Our SQL computes
``extract(...) * 1000``, numeric times integer, which pg_catalog only matches through a cast, so
on a default search_path the planted operator is the better match and runs with the privileges of
whoever evaluates it: the runtime or admin role.
"""

from __future__ import annotations

import itertools
import os
import time

import psycopg
import pytest

from tests.support.cluster import arun, seed
from qinglong.contracts.errors import SchemaNotReady
from tests.support.aio import closing

_roles = itertools.count(1)

PLANT = """
CREATE TABLE public.executions (who text NOT NULL, what text NOT NULL);
GRANT SELECT, INSERT ON public.executions TO PUBLIC;
CREATE FUNCTION public.planted_times(numeric, integer) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.executions VALUES (current_user, 'operator');
    RETURN $1 OPERATOR(pg_catalog.*) $2::numeric;
END $$;
CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.planted_times);
CREATE FUNCTION public.convert_to(text, text) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.executions VALUES (current_user, 'convert_to');
    RETURN pg_catalog.convert_to($1, $2::name);
END $$;
"""


@pytest.fixture
def planter(cluster):
    """A role that may CREATE in ``public`` and has planted an operator and a function there,
    each recording who ran it; dropped afterwards (roles are cluster-wide)."""
    name = f"planter_{os.getpid()}_{next(_roles)}"
    cluster.sql(f"CREATE ROLE {name} NOLOGIN")
    try:
        cluster.sql(f"GRANT CREATE ON SCHEMA public TO {name}")
        with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as conn:
            conn.execute(f"SET ROLE {name}")
            conn.execute(PLANT)
        yield name
    finally:
        cluster.sql(f"DROP OWNED BY {name} CASCADE")
        cluster.sql(f"DROP ROLE {name}")


def _make_due(cluster) -> None:
    """Wait until every schedule's own cursor is due in database time (as the superuser, on a
    pinned path: the harness's own sessions must not run the planted code either).

    The cursors are left as the scheduler wrote them: moving one back would hand the backlog drain
    an occurrence that an earlier round already admitted, and its commit would then fail on the
    idempotency key. A per-second cron is due within a second; the bound only catches a hang.
    """
    deadline = time.monotonic() + 120
    with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as conn:
        conn.execute("SET search_path = pg_catalog, pg_temp")
        while True:
            (due,) = conn.execute(
                "SELECT bool_and(next_fire_at_ms <= floor(extract(epoch FROM clock_timestamp()) "
                "* 1000::numeric)::bigint) FROM qinglong.trigger_schedules").fetchone()
            if due:
                return
            assert time.monotonic() < deadline, "schedules never became due in database time"
            time.sleep(0.05)


def _executions(cluster) -> list[tuple]:
    return cluster.sql("SELECT who, what FROM public.executions ORDER BY 1, 2")


def test_planted_operator_never_runs_in_our_sessions_and_readiness_refuses(cluster, planter):
    """Without the pinned path the runtime role would run the planter's code on every claim and
    admission (reading task payloads, forging Runs with the runtime's INSERT), and the admin role
    on every publish; readiness would call such a database ready."""
    # The attack is real: a runtime session on the default search_path runs the planted code.
    with psycopg.connect(cluster.dsn("qinglong_runtime"), autocommit=True) as conn:
        conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")
        conn.execute("SELECT convert_to('x', 'UTF8')")
    assert _executions(cluster) == [("qinglong_runtime", "convert_to"), ("qinglong_runtime", "operator")]
    cluster.sql("TRUNCATE public.executions")

    backend = cluster.backend()

    async def readiness():
        async with closing(backend):
            await backend.check_readiness()

    with pytest.raises(SchemaNotReady) as info:
        arun(readiness())
    assert f"schema public grants CREATE to {planter}" in str(info.value)

    # Every statement the plugin runs, as each role: publish (admin), claim, initialize, admit,
    # read and recover (runtime), migrate (owner).
    seed(cluster, 2, expression="* * * * * *")

    async def work():
        backend = cluster.backend()
        async with closing(backend):
            await backend.migrate()
            first = await backend.run_round()
            _make_due(cluster)
            second = await backend.run_round()
            reader = backend.reader()
            runs = await reader.recent_runs()
            await reader.list_schedules()
            await backend.recover()
            await backend.migration_status()
            return first, second, runs

    first, second, runs = arun(work())
    assert first.errors == 0 and second.errors == 0, (first, second)
    admitted = first.admitted + second.admitted
    assert admitted >= 2 and len(runs) == admitted, (first, second, runs)
    assert _executions(cluster) == []


def test_every_plugin_session_runs_on_the_pinned_search_path(cluster):
    """A session that started on the role's or database's path (ALTER ROLE ... SET search_path)
    would resolve names through schemas readiness never checked."""
    cluster.sql("ALTER ROLE qinglong_runtime IN DATABASE " + cluster.dbname + " SET search_path = public")
    try:
        async def body():
            backend = cluster.backend()
            async with closing(backend):
                pool = await backend.runtime_pool()
                async with pool.connection() as conn:
                    cur = await conn.execute("SELECT current_setting('search_path'), current_schemas(true)")
                    pooled = await cur.fetchone()
                await backend.check_readiness()
                return pooled

        setting, schemas = arun(body())
    finally:
        cluster.sql("ALTER ROLE qinglong_runtime IN DATABASE " + cluster.dbname + " RESET search_path")
    assert setting.replace(" ", "") == "pg_catalog,pg_temp"
    assert schemas == ["pg_catalog"]


@pytest.mark.parametrize("grant, fragment", [
    ("GRANT TEMPORARY ON DATABASE {db} TO PUBLIC", "database {db} grants TEMPORARY to PUBLIC"),
    ("GRANT CREATE ON DATABASE {db} TO qinglong_runtime", "database {db} grants CREATE to qinglong_runtime"),
    ("GRANT CREATE ON SCHEMA public TO PUBLIC", "schema public grants CREATE to PUBLIC"),
    ("ALTER SCHEMA public OWNER TO qinglong_admin", "schema public is owned by qinglong_admin"),
])
def test_readiness_refuses_a_database_where_others_can_create_objects(cluster, grant, fragment):
    """A database or schema that lets roles other than its owner create objects (the defaults of
    PostgreSQL 14 and older, kept by pg_upgrade and restores) is where planted functions and
    operators come from; starting on it would trust whatever was planted there."""
    cluster.sql(grant.format(db=cluster.dbname))
    backend = cluster.backend()

    async def readiness():
        async with closing(backend):
            await backend.check_readiness()

    with pytest.raises(SchemaNotReady) as info:
        arun(readiness())
    assert fragment.format(db=cluster.dbname) in str(info.value)
