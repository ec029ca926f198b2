"""Migrations and readiness: the schema is exactly the shipped stream with exactly its grants."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.cluster import arun
from qinglong.contracts.errors import SchemaNotReady, SettingsError
from qinglong.plugins.cluster_postgres import migrations


async def _ready(backend):
    try:
        await backend.check_readiness()
    finally:
        await backend.close()


def _not_ready(db, *fragments):
    with pytest.raises(SchemaNotReady) as info:
        arun(_ready(db.backend()))
    for fragment in fragments:
        assert fragment in str(info.value)
    return str(info.value)


def test_fresh_database_migrates_to_every_shipped_migration_and_is_ready(fresh_db):
    """Without this a new cluster could start on a partial schema or one readiness rejects."""
    async def body():
        backend = fresh_db.backend()
        try:
            before = await backend.migration_status()
            after = await backend.migrate()
            again = await backend.migrate()  # idempotent: nothing left to apply
            await backend.check_readiness()
            return before, after, again
        finally:
            await backend.close()

    before, after, again = arun(body())
    known = migrations.known_migrations()
    assert [s.status for s in before] == ["pending"] * len(known)
    assert [(s.version, s.status) for s in after] == [(m.version, "applied") for m in known]
    assert after == again
    rows = fresh_db.sql("SELECT version, checksum, capability, applied_by FROM qinglong.schema_migrations ORDER BY 1")
    assert [(r[0], r[1]) for r in rows] == [(m.version, m.checksum) for m in known]
    assert {r[3] for r in rows} == {"qinglong_owner"}
    assert max(r[2] for r in rows) == migrations.capability_version()


def test_readiness_fails_before_migrations(fresh_db):
    """Without this the scheduler could start against an empty database and fail on every round."""
    _not_ready(fresh_db, "not installed")


def test_readiness_fails_on_a_missing_migration(cluster):
    """A schema missing a migration would lack grants or tables the code relies on."""
    cluster.sql("DELETE FROM qinglong.schema_migrations WHERE version = 2")
    _not_ready(cluster, "0002_grants is not applied")


def test_migrate_refuses_a_gap_in_the_applied_stream_and_writes_nothing(cluster):
    """Filling a removed middle migration on top of later ones would run it out of order (here,
    re-granting what a later migration changed); both backends refuse a gap the same way."""
    cluster.sql("DELETE FROM qinglong.schema_migrations WHERE version = 2")

    async def migrate():
        backend = cluster.backend()
        try:
            await backend.migrate()
        finally:
            await backend.close()

    with pytest.raises(SchemaNotReady, match="0002_grants is not applied although a later one is"):
        arun(migrate())
    assert [r[0] for r in cluster.sql("SELECT version FROM qinglong.schema_migrations ORDER BY 1")] \
        == [m.version for m in migrations.known_migrations() if m.version != 2]
    _not_ready(cluster, "0002_grants is not applied although a later one is")


def test_readiness_fails_on_an_unknown_migration(cluster):
    """A schema from a newer version could have changed meanings this code does not know."""
    cluster.sql("INSERT INTO qinglong.schema_migrations VALUES (99, 'future', 'sha256:x', 9, 0, 'x')")
    _not_ready(cluster, "0099_future is applied but unknown")


def test_readiness_fails_on_an_altered_migration(cluster):
    """A migration edited after it was applied means the schema is not what the code expects."""
    cluster.sql("UPDATE qinglong.schema_migrations SET checksum = 'sha256:00' WHERE version = 1")
    _not_ready(cluster, "0001_schema was applied with another checksum")

    async def migrate():
        backend = cluster.backend()
        try:
            await backend.migrate()
        finally:
            await backend.close()

    with pytest.raises(SchemaNotReady):  # nor will migrate build on top of it
        arun(migrate())


def test_readiness_fails_on_a_grant_added_by_hand(cluster):
    """A hand-added INSERT on schedules would let the runtime create schedule rows (drift)."""
    cluster.sql("GRANT INSERT ON qinglong.trigger_schedules TO qinglong_runtime")
    _not_ready(cluster, "unexpected privilege: INSERT on table trigger_schedules for qinglong_runtime")


def test_readiness_fails_on_a_revoked_grant_column_grant_or_public_grant(cluster):
    """Missing privileges, column grants and PUBLIC grants are all drift, not just extra table grants."""
    cluster.sql("REVOKE INSERT ON qinglong.run_events FROM qinglong_runtime")
    cluster.sql("GRANT SELECT (trigger_id) ON qinglong.trigger_schedules TO qinglong_gateway")
    cluster.sql("GRANT SELECT ON qinglong.runs TO PUBLIC")
    _not_ready(cluster, "missing privilege: INSERT on table run_events for qinglong_runtime",
               "on column trigger_schedules.trigger_id for qinglong_gateway",
               "SELECT on table runs for PUBLIC")


def test_readiness_fails_on_an_extra_table_or_foreign_owner(cluster):
    """An object created by hand in the schema is drift the migrations do not account for."""
    cluster.sql("CREATE TABLE qinglong.hand_made (x int)")
    _not_ready(cluster, "unexpected relation qinglong.hand_made", "owned by postgres")


def test_missing_dsn_is_a_settings_error_naming_the_key(cluster):
    """A backend without runtime_dsn must say which key is missing, before connecting anywhere."""
    backend = cluster.backend(settings=cluster.settings(runtime_dsn=None))
    with pytest.raises(SettingsError, match="runtime_dsn"):
        arun(backend.open())
    backend = cluster.backend(settings=cluster.settings(owner_dsn=None))
    with pytest.raises(SettingsError, match="owner_dsn"):
        arun(backend.migrate())


def test_connection_errors_never_show_the_password(cluster):
    """A DSN password in an error message would leak into logs and terminals. A server that cannot
    be reached, or refuses the login, is StoreUnavailable (exit 5) naming where it connected."""
    from qinglong.contracts.errors import StoreUnavailable
    from qinglong.plugins.cluster_postgres.db import BackendUnavailable

    secret = "runtime-secret-Pw3"
    port = cluster.server.port
    cases = [
        (cluster.dsn("qinglong_runtime").replace("dbname=", "dbname=nosuchdb_"),
         f"port={port} dbname=nosuchdb_"),
        (f"postgresql://qinglong_runtime:{secret}@127.0.0.1:1/x?connect_timeout=1",
         "host=127.0.0.1 port=1 dbname=x user=qinglong_runtime"),
        (cluster.dsn("qinglong_runtime").replace(secret, "wrong-" + secret),
         f"port={port} dbname={cluster.dbname} user=qinglong_runtime"),
    ]
    for dsn, target in cases:
        backend = cluster.backend(settings=cluster.settings(runtime_dsn=dsn, pool_timeout_ms=300))
        with pytest.raises(BackendUnavailable) as info:
            arun(backend.open())
        assert isinstance(info.value, StoreUnavailable)
        assert secret not in str(info.value)
        assert target in str(info.value), str(info.value)
        assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("dsn", [
    "host=127.0.0.1 password=runtime-secret-Pw3 = broken",
    "host=127.0.0.1 user=qinglong_runtime password=runtime secret-Pw3 dbname=x",
    "postgresql://qinglong_runtime:runtime@secret-Pw3@127.0.0.1:5432/x",
    "postgresql://qinglong_runtime:runtime secret-Pw3@127.0.0.1:5432/x",
])
def test_a_dsn_libpq_cannot_parse_is_refused_without_quoting_it(cluster, dsn):
    """libpq's parse errors quote the token where they stopped, and an unencoded '@' in a URI
    password turns the rest of the password into the host name a connection error prints: either
    would leak part of the password. Refused before libpq connects, naming only the key."""
    backend = cluster.backend(settings=cluster.settings(runtime_dsn=dsn, pool_timeout_ms=300))
    with pytest.raises(SettingsError, match="runtime_dsn") as info:
        arun(backend.open())
    for fragment in ("secret", "Pw3", "broken"):
        assert fragment not in str(info.value)



def test_start_steps_ride_out_connections_the_server_terminated(cluster):
    """A replica starting while its database restarts (or a DBA terminates its sessions) lost
    its connection in the middle of the readiness check or the recovery scan and exited 5 (the
    chaos soak saw it under load); under a supervisor it restarts, but until then that replica
    admits nothing and an operator sees a crash for a restart PostgreSQL took in stride. Each of
    those reads now runs once more on a new connection. Here the read is held on a lock, its
    session terminated mid-statement, and the read must then finish on a new one."""
    import psycopg

    def waiting_runtime_pids() -> list[int]:
        return [r[0] for r in cluster.sql(
            "SELECT pid FROM pg_stat_activity WHERE usename = 'qinglong_runtime' "
            "AND datname = current_database() AND wait_event_type = 'Lock'")]

    async def until(condition, what: str):
        deadline = asyncio.get_running_loop().time() + 60
        while not (value := condition()):
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.02)
        return value

    async def body():
        backend = cluster.backend()
        try:
            await backend.open()
            for step, table in ((backend.check_readiness, "schema_migrations"), (backend.recover, "runs")):
                with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as holder:
                    holder.execute("BEGIN")
                    holder.execute(f"LOCK TABLE qinglong.{table} IN ACCESS EXCLUSIVE MODE")
                    task = asyncio.create_task(step())
                    first = await until(waiting_runtime_pids, f"{step.__name__} waiting on {table}")
                    cluster.sql("SELECT pg_terminate_backend(%s)", (first[0],))
                    await until(lambda: task.done() or [p for p in waiting_runtime_pids() if p != first[0]],
                                f"{step.__name__} on a new connection")
                    holder.execute("COMMIT")
                await task  # raised BackendUnavailable before: the read was not run again
        finally:
            await backend.close()

    arun(body())


@pytest.mark.parametrize("statement, fragment", [
    ("ALTER ROLE qinglong_runtime IN DATABASE {db} SET session_replication_role = replica",
     "role qinglong_runtime in database {db} sets session_replication_role=replica"),
    ("ALTER DATABASE {db} SET synchronous_commit = off", "database {db} sets synchronous_commit=off"),
    ("ALTER ROLE qinglong_gateway IN DATABASE {db} SET default_transaction_read_only = on",
     "sets default_transaction_read_only=on"),
])
def test_readiness_fails_on_a_role_or_database_setting_we_do_not_ship(cluster, statement, fragment):
    """``session_replication_role = replica`` on the runtime role switches off every foreign key
    and trigger for its writes (as DISABLE TRIGGER ALL would, which readiness catches);
    ``synchronous_commit = off`` on the database (its owner may set that) silently weakens the
    durability of every admission and completion. A replica that started anyway would break its
    guarantees without a word; readiness names the setting and how to reset it."""
    db = cluster.dbname
    cluster.sql(statement.format(db=db))
    _not_ready(cluster, fragment.format(db=db), "RESET")


def test_readiness_accepts_logging_settings_and_every_session_pins_durability(cluster):
    """A DBA's logging setting is not drift (readiness must not refuse it); ``synchronous_commit
    = off`` set on a role in a database it is not ours to reset is overridden in every session
    the plugin opens: if a session took the role's setting, a committed admission could be lost
    in a crash."""
    db = cluster.dbname
    cluster.sql(f"ALTER DATABASE {db} SET log_min_duration_statement = 1000")
    arun(_ready(cluster.backend()))
    cluster.sql(f"ALTER ROLE qinglong_runtime IN DATABASE {db} SET synchronous_commit = off")

    async def body():
        backend = cluster.backend()
        try:
            pool = await backend.runtime_pool()
            async with pool.connection() as conn:
                cur = await conn.execute("SHOW synchronous_commit")
                return (await cur.fetchone())[0]
        finally:
            await backend.close()

    assert arun(body()) == "on"


@pytest.mark.parametrize("statement, where", [
    ("ALTER ROLE ALL SET synchronous_commit = off", "every role (ALTER ROLE ALL)"),
    # the same row as ALTER DATABASE ... SET: the database's RESET removes it
    ("ALTER ROLE ALL IN DATABASE {db} SET synchronous_commit = local", "database {db}"),
    ("ALTER ROLE qinglong_owner SET synchronous_commit = remote_write", "role qinglong_owner"),
    ("ALTER ROLE qinglong_admin IN DATABASE {db} SET default_transaction_isolation = 'read uncommitted'",
     "role qinglong_admin in database {db}"),
    ("ALTER DATABASE {db} SET lock_timeout = '1ms'", "database {db}"),
])
def test_the_reset_readiness_names_removes_the_setting_wherever_it_was_made(cluster, statement, where):
    """``ALTER ROLE ALL SET synchronous_commit = off`` reaches our roles too (every role on the
    server), but readiness described it as ``database  sets ...`` (no name) and told the operator
    to run ``ALTER DATABASE  RESET synchronous_commit``, a syntax error: an operator could not
    learn where the weakened durability came from nor how to remove it, and the replicas stayed
    down. The RESET readiness names, run as written, must make it ready again, wherever the
    setting was made."""
    db = cluster.dbname
    cluster.sql(statement.format(db=db))
    try:
        message = _not_ready(cluster, where.format(db=db) + " sets ")
        (problem,) = [p for p in message.split("; ") if " sets " in p]
        undo = problem[problem.rindex("(") + 1:problem.rindex(")")]
        assert undo.startswith("ALTER ") and " RESET " in undo, problem
        cluster.sql(undo)
        arun(_ready(cluster.backend()))
    finally:
        # role settings outlive the test's database: never leave them to the next test
        cluster.sql("ALTER ROLE ALL RESET ALL")
        for role in ("qinglong_owner", "qinglong_admin", "qinglong_runtime", "qinglong_gateway"):
            cluster.sql(f"ALTER ROLE {role} RESET ALL")
