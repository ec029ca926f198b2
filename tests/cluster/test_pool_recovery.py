"""The runtime pool survives terminated idle backends and a server restart."""

from __future__ import annotations

import asyncio

from tests.support.aio import closing
from tests.support.cluster import arun, seed, set_cursor

SECRET = "runtime-secret-Pw3"


def test_pool_recovers_after_its_idle_backends_are_terminated(cluster):
    """Without the pool's check, the next round would fail on a dead connection (and the next,
    for every connection the pool held), leaving occurrences unadmitted."""
    seed(cluster, 2)

    async def body():
        backend = cluster.backend("r1", settings=cluster.settings(pool_min_size=2, pool_max_size=2))
        async with closing(backend):
            await backend.open()
            assert (await backend.run_round()).initialized == 2
            pool = await backend.runtime_pool()
            await pool.wait()
            killed = cluster.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND usename = 'qinglong_runtime'", (cluster.dbname,))
            assert len(killed) == 2 and all(r[0] for r in killed)
            set_cursor(cluster, None, -500)
            report = await backend.run_round()
            return report, backend.context.diagnostics.codes()

    report, codes = arun(body())
    assert report.errors == 0 and report.admitted == 2
    assert cluster.count("runs") == 2


def test_round_survives_a_server_restart_and_reports_the_outage(cluster):
    """A round meeting a stopped server must report (without secrets) and not kill the loop; the
    round after the restart must work again with fresh connections."""
    seed(cluster, 1)
    server = cluster.server

    async def body():
        # the pool's bound on a checkout must let a loaded machine connect again after the
        # restart (the round after it is asserted to work at once); it also bounds the down round
        backend = cluster.backend("r1", settings=cluster.settings(pool_timeout_ms=5000))
        async with closing(backend):
            await backend.open()
            assert (await backend.run_round()).initialized == 1
            await asyncio.to_thread(server.stop, "fast")
            try:
                down = await backend.run_round()
            finally:
                await asyncio.to_thread(server.start)
            set_cursor(cluster, None, -500)
            up = await backend.run_round()
            return down, up, backend.context.diagnostics.events

    down, up, events = arun(body())
    assert down.errors == 1 and down.admitted == 0
    failures = [e for e in events if e.code == "cluster_postgres.round_failed"]
    assert failures and all(SECRET not in e.message for e in failures)
    assert up.errors == 0 and up.admitted == 1
    assert cluster.count("runs") == 1


def test_pool_connections_notice_a_dead_peer_unless_the_dsn_says_otherwise(cluster):
    """Without keepalives and tcp_user_timeout a connection to a vanished host is never noticed
    by the kernel, and whatever waits on it waits forever; an operator's own settings in the DSN
    must still win."""
    from qinglong.plugins.cluster_postgres.db import TCP_DEFAULTS, tcp_defaults

    assert tcp_defaults("host=db.example dbname=q") == TCP_DEFAULTS
    assert tcp_defaults("postgresql://u@db.example/q?keepalives_idle=60&tcp_user_timeout=0") == {
        k: v for k, v in TCP_DEFAULTS.items() if k not in ("keepalives_idle", "tcp_user_timeout")}

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            pool = await backend.runtime_pool()
            async with pool.connection() as conn:
                return dict(p.split("=", 1) for p in conn.info.dsn.split() if "=" in p)

    dsn = arun(body())  # what libpq actually connected with
    for key, value in TCP_DEFAULTS.items():
        assert dsn.get(key) == value
