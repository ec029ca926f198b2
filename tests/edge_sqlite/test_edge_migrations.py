"""Migration stream: fresh install, forward migration, and fail-closed refusals that write nothing."""

from __future__ import annotations

import sqlite3

import pytest

from edge_helpers import open_backend, query
from qinglong.contracts.errors import NotOurDatabase, SchemaCorrupt, SchemaNotReady, UserError
from qinglong.plugins.edge_sqlite import create_backend, migrations
from edge_helpers import make_context
from tests.support.aio import closing


def _make_database_with(path, count: int) -> None:
    """A database as an older version left it: only the first ``count`` migrations applied."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        known = migrations.load_migrations()[:count]
        migrations.apply_pending(conn, known, str(path), 1)
        conn.execute("INSERT INTO projects (project_id, name, active, created_at_ms) "
                     "VALUES ('old', 'made by 0001', 1, 1)")
    finally:
        conn.close()


def test_migration_stream_is_ordered_and_has_at_least_two_steps():
    """Without an ordered stream of several files, forward migration would be untested."""
    known = migrations.load_migrations()
    assert [m.version for m in known] == list(range(1, len(known) + 1))
    assert len(known) >= 2
    assert all(m.checksum.startswith("sha256:") for m in known)


async def test_fresh_database_is_migrated_and_ready(db_path, clock, backends):
    """A fresh file must become ready with every migration recorded; otherwise nothing can start."""
    backend = backends.track(await open_backend(db_path, clock))
    states = await backend.migration_status()
    assert {s.status for s in states} == {"applied"}
    assert query(db_path, "PRAGMA journal_mode") == [("wal",)]
    rows = query(db_path, "SELECT version, name, checksum, applied_at_ms FROM schema_migrations")
    assert [(r[0], r[1]) for r in rows] == [(m.version, m.name) for m in backend.migrations]
    assert all(r[3] == clock.ms for r in rows)


async def test_database_of_an_older_version_is_migrated_forward_in_place(db_path, clock, backends):
    """An upgrade must keep the data of a database made by 0001 alone and add what 0002 brings."""
    _make_database_with(db_path, 1)
    backend = backends.track(create_backend(make_context(db_path, clock)))
    await backend.open()
    with pytest.raises(SchemaNotReady, match="0002_schedule_skips"):
        await backend.check_readiness()
    await backend.migrate()
    await backend.check_readiness()
    assert query(db_path, "SELECT project_id FROM projects") == [("old",)]
    assert query(db_path, "SELECT count(*) FROM schedule_skips") == [(0,)]


async def test_migrate_twice_applies_nothing_twice(db_path, clock):
    """A second migrate at restart must be a no-op, not a duplicate ledger row or a failure."""
    backend = await open_backend(db_path, clock)
    await backend.close()
    backend = await open_backend(db_path, clock)
    await backend.close()
    assert len(query(db_path, "SELECT * FROM schema_migrations")) == len(migrations.load_migrations())


@pytest.mark.parametrize(
    "tamper, expected",
    [
        ("UPDATE schema_migrations SET checksum = 'sha256:0' WHERE version = 1", "0001_initial was altered"),
        ("INSERT INTO schema_migrations VALUES (99, 'from_the_future', 'sha256:1', 1)",
         "0099_from_the_future is not known"),
        ("DELETE FROM schema_migrations WHERE version = 1", "0001_initial is missing"),
    ],
    ids=["altered", "unknown", "missing"],
)
async def test_untrusted_schema_is_refused_without_touching_the_file(db_path, clock, tamper, expected):
    """Starting on a drifted, newer or gapped schema could corrupt data; refusal must also leave the
    file byte for byte as it was."""
    _make_database_with(db_path, 2)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute(tamper)
    conn.close()
    before = db_path.read_bytes()
    backend = create_backend(make_context(db_path, clock))
    await backend.open()
    async with closing(backend):
        with pytest.raises(SchemaNotReady, match=expected) as refused:
            await backend.migrate()
        assert str(db_path) in str(refused.value)
        with pytest.raises(SchemaNotReady, match=expected):
            await backend.check_readiness()
    assert db_path.read_bytes() == before
    assert not db_path.with_name(db_path.name + "-wal").exists() or \
        db_path.with_name(db_path.name + "-wal").stat().st_size == 0


async def test_readiness_without_auto_migrate_names_the_pending_migration(db_path, clock, backends):
    """With auto_migrate off, an empty file must be refused with a fix, not half-used."""
    backend = backends.track(create_backend(make_context(db_path, clock, auto_migrate=False)))
    assert backend.auto_migrate is False
    await backend.open()
    with pytest.raises(SchemaNotReady, match="0001_initial is not applied"):
        await backend.check_readiness()


async def test_missing_directory_is_a_user_error_naming_the_path(tmp_path, clock):
    """A typo in [backend] path must say which path, instead of creating directories or a traceback."""
    path = tmp_path / "no-such-dir" / "q.db"
    backend = create_backend(make_context(path, clock))
    with pytest.raises(UserError, match="no-such-dir"):
        await backend.open()
    assert not path.parent.exists()
    await backend.close()
    await backend.close()


async def test_a_file_that_is_not_sqlite_is_refused_as_not_ours_and_is_left_alone(db_path, clock):
    """Pointing path at some other file must be refused clearly, never overwritten."""
    db_path.write_bytes(b"not a database at all\n" * 100)
    before = db_path.read_bytes()
    backend = create_backend(make_context(db_path, clock))
    with pytest.raises(NotOurDatabase, match=str(db_path.name)):
        await backend.open()
    await backend.close()
    assert db_path.read_bytes() == before


async def test_older_database_with_a_dropped_table_is_not_migrated_forward(db_path, clock):
    """Migrating forward on top of a damaged older schema would half-apply the new migrations and
    leave a file neither version can read; it must be refused naming the table, writing nothing."""
    _make_database_with(db_path, 1)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("DROP TABLE run_events")
    conn.close()
    before = db_path.read_bytes()
    backend = create_backend(make_context(db_path, clock))
    await backend.open()
    async with closing(backend):
        with pytest.raises(SchemaCorrupt, match="table 'run_events' is missing"):
            await backend.migrate()
    assert db_path.read_bytes() == before


def test_a_migration_applied_meanwhile_by_another_process_is_skipped(db_path):
    """Two processes starting on a new file both see every migration pending; the later one must
    skip what the first applied instead of failing on "table already exists"."""
    known = migrations.load_migrations()
    late = sqlite3.connect(db_path, isolation_level=None)
    try:
        seen = migrations.migration_status(late, known, str(db_path))
        assert {s.status for s in seen} == {"pending"}
        _make_database_with(db_path, len(known))
        for migration in known:
            migrations._apply_one(late, migration, 2)
        assert query(db_path, "SELECT count(*), max(applied_at_ms) FROM schema_migrations") == [(len(known), 1)]
        migrations.check_ready(late, known, str(db_path))
    finally:
        late.close()
