"""The ordered, checksummed migration stream in ``migrations/NNNN_name.sql``.

Each applied migration is recorded in ``schema_migrations`` with the SHA-256 of its file. Readiness
fails closed: a database with a pending, missing (a gap before an applied one), unknown (newer than
this version) or altered (checksum differs) migration is refused, and a refusal writes nothing.
A database made by an older version, whose migrations are a prefix of ours, is migrated forward
in place, each migration in its own transaction.

The ledger alone is not trusted. Before anything is read or written, a non-empty database without
our ledger is refused as another application's (:class:`NotOurDatabase`), so it never gets our
tables or WAL mode. Readiness then compares the live schema (``sqlite_master`` and the table,
column, index and foreign-key pragmas) with the schema the applied migrations produce when run on
an in-memory database, so a dropped table, index or column, or an extra trigger, is refused as
:class:`SchemaCorrupt` naming the object, whatever the ledger says. :func:`quick_check` runs
SQLite's page-level check within a time budget.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from qinglong.contracts.frozen import record
from qinglong.contracts.errors import NotOurDatabase, PackagingError, SchemaCorrupt, SchemaNotReady
from qinglong.contracts.migrations import label, migration_states, verdict
from qinglong.contracts.records import MigrationState

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version       INTEGER PRIMARY KEY,
    name          TEXT NOT NULL,
    checksum      TEXT NOT NULL,
    applied_at_ms INTEGER NOT NULL
)
"""


@record
class Migration:
    """One migration file: ``version`` from its number, ``name`` from the rest of its file name."""

    version: int
    name: str
    sql: str
    checksum: str


def load_migrations(directory: Path = MIGRATIONS_DIR) -> tuple[Migration, ...]:
    """Every migration file of ``directory`` in version order; a malformed name is a packaging bug."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        number, _, name = path.stem.partition("_")
        if not number.isdigit() or not name:
            raise PackagingError(f"migration file {path.name!r} is not named NNNN_name.sql")
        data = path.read_bytes()
        found.append(Migration(int(number), name, data.decode("utf-8"),
                               "sha256:" + hashlib.sha256(data).hexdigest()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise PackagingError(f"migration versions must be 1..n without gaps, found {versions}")
    return tuple(found)


#: The ledger's columns as :data:`_CREATE_LEDGER` makes them: another application's
#: ``schema_migrations`` (Rails, Django and many others keep one) has other columns.
_LEDGER_COLUMNS = ("version", "name", "checksum", "applied_at_ms")


def _user_tables(conn: sqlite3.Connection) -> list[str]:
    return [name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
        "ORDER BY name")]


def refuse_foreign(conn: sqlite3.Connection, path: str) -> bool:
    """Raise :class:`NotOurDatabase` for a non-empty database that is not ours; True if empty.

    Ours means: our ledger ``schema_migrations`` with our columns. An empty database (no table at
    all) is ours to create. Reads only.
    """
    tables = _user_tables(conn)
    if not tables:
        return True
    if "schema_migrations" not in tables:
        listed = ", ".join(repr(t) for t in tables[:3]) + (", ..." if len(tables) > 3 else "")
        raise NotOurDatabase(
            f"database {path!r} belongs to another application: it holds table(s) {listed} and no "
            "qinglong migration ledger (schema_migrations); qinglong neither adds its tables to it "
            "nor changes its journal mode. Point [backend] path at a new file"
        )
    columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(schema_migrations)"))
    if columns != _LEDGER_COLUMNS:
        raise NotOurDatabase(
            f"database {path!r} belongs to another application: its table 'schema_migrations' has "
            f"columns {list(columns)}, not qinglong's {list(_LEDGER_COLUMNS)}; qinglong leaves it "
            "alone. Point [backend] path at a new file"
        )
    return False


def _applied(conn: sqlite3.Connection) -> list[tuple[int, str, str]]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if exists is None:
        return []
    return conn.execute(
        "SELECT version, name, checksum FROM schema_migrations ORDER BY version"
    ).fetchall()


def migration_status(conn: sqlite3.Connection, known: Sequence[Migration],
                     path: str = "") -> list[MigrationState]:
    """Every known or applied migration: ``applied``, ``pending``, ``drifted`` or ``unknown``
    (the contracts' one algorithm, :func:`qinglong.contracts.migrations.migration_states`).

    Raises :class:`NotOurDatabase` for another application's database.
    """
    refuse_foreign(conn, path)
    return migration_states(known, [_LedgerRow(*row) for row in _applied(conn)])


@record
class _LedgerRow:
    version: int
    name: str
    checksum: str


_REFUSAL = {
    "altered": "was altered after it was applied (checksum differs from this version's file)",
    "extra": "is not known to this version of qinglong (the database was migrated by a newer version)",
    "missing": "is missing although a later one was applied",
}


def refuse_unsafe(states: Sequence[MigrationState], path: str) -> None:
    """Raise :class:`SchemaNotReady` for a drifted, unknown or missing migration.

    Pending migrations after the newest applied one are fine (an older database, migrated forward);
    a pending migration *before* an applied one means the stream was edited: refuse it.
    """
    unsafe = verdict(states).unsafe()
    if unsafe:
        kind, state = unsafe[0]
        raise SchemaNotReady(f"database {path!r}: migration {label(state)} {_REFUSAL[kind]}; "
                             "refusing to start")


def check_ready(conn: sqlite3.Connection, known: Sequence[Migration], path: str) -> None:
    """Raise :class:`SchemaNotReady` unless every known migration is applied unchanged and the live
    schema is exactly the one they make (:class:`SchemaCorrupt` naming the difference)."""
    states = migration_status(conn, known, path)
    refuse_unsafe(states, path)
    pending = [s for s in states if s.status == "pending"]
    if pending:
        raise SchemaNotReady(
            f"database {path!r}: migration {label(pending[0])} is not applied "
            f"({len(pending)} pending); run 'qinglong db migrate' or set auto_migrate = true"
        )
    check_schema(conn, known, path)


# --------------------------------------------------------------------------- the live schema

#: One schema object: (type, name, table, sql, details from the pragmas).
SchemaObject = tuple


def schema_of(conn: sqlite3.Connection) -> dict[str, SchemaObject]:
    """Every schema object by name, with its SQL and what the pragmas say of it.

    The pragmas matter beside the SQL text: they are what SQLite actually parsed, so a table whose
    stored SQL was edited in place (``writable_schema``) or damaged shows up too. Statistics tables
    (``sqlite_stat*``, written by ANALYZE) are not schema.
    """
    found: dict[str, SchemaObject] = {}
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE name NOT LIKE 'sqlite\\_stat%' ESCAPE '\\' ORDER BY type, name").fetchall()
    for kind, name, table, sql in rows:
        details: tuple = ()
        if kind == "table":
            quoted = '"' + name.replace('"', '""') + '"'
            details = (
                tuple(conn.execute(f"PRAGMA table_xinfo({quoted})").fetchall()),
                tuple(sorted(conn.execute(f"PRAGMA index_list({quoted})").fetchall(),
                             key=lambda r: r[1])),
                tuple(conn.execute(f"PRAGMA foreign_key_list({quoted})").fetchall()),
            )
            details = tuple(tuple(tuple(r[1:]) if i == 1 else r for r in part)
                            for i, part in enumerate(details))
        elif kind == "index":
            quoted = '"' + name.replace('"', '""') + '"'
            details = (tuple(conn.execute(f"PRAGMA index_xinfo({quoted})").fetchall()),)
        found[name] = (kind, name, table, sql, details)
    return found


@lru_cache(maxsize=8)
def expected_schema(known: tuple[Migration, ...]) -> dict[str, SchemaObject]:
    """The schema ``known`` makes: the migrations applied to a fresh in-memory database."""
    # every statement runs once: keeping its prepared form would only hold memory
    conn = sqlite3.connect(":memory:", isolation_level=None, cached_statements=0)
    try:
        for migration in known:
            _apply_one(conn, migration, 0)
        return schema_of(conn)
    finally:
        conn.close()


def _describe_difference(live: dict[str, SchemaObject], expected: dict[str, SchemaObject]) -> str | None:
    """The first difference, most telling first: a missing object, an unexpected one, then a
    changed definition."""
    order = {"table": 0, "index": 1}

    def ranked(objects: dict[str, SchemaObject]) -> list[SchemaObject]:
        return sorted(objects.values(), key=lambda o: (order.get(o[0], 2), o[1]))

    for want in ranked(expected):
        if want[1] not in live:
            return f"{want[0]} {want[1]!r} is missing"
    for have in ranked(live):
        if have[1] not in expected:
            return f"unexpected {have[0]} {have[1]!r} (on table {have[2]!r}) that qinglong did not make"
    for want in ranked(expected):
        have = live[want[1]]
        if have[:4] != want[:4]:
            return f"{want[0]} {want[1]!r} is defined differently from this version's migrations"
        if have[4] != want[4]:
            return (f"{want[0]} {want[1]!r} does not have the columns, indexes or foreign keys this "
                    "version's migrations give it")
    return None


def check_schema(conn: sqlite3.Connection, known: Sequence[Migration], path: str) -> None:
    """Raise :class:`SchemaCorrupt` unless the live schema is exactly the one the migrations
    applied to this database make. Reads only; costs a few pragmas, whatever the data size."""
    applied = {version for version, _, _ in _applied(conn)}
    prefix = tuple(m for m in known if m.version in applied)
    difference = _describe_difference(schema_of(conn), expected_schema(prefix))
    if difference is not None:
        raise SchemaCorrupt(
            f"database {path!r}: its schema is not the one its migrations make: {difference}; "
            "it was changed outside qinglong or damaged. Restore it from a backup"
        )


def quick_check(conn: sqlite3.Connection, path: str, budget_ms: int) -> bool:
    """Run ``PRAGMA quick_check`` for at most ``budget_ms``; raise :class:`SchemaCorrupt` with its
    first findings when it finds damage.

    Returns True when the whole file was checked and is sound, False when the budget ran out first
    (nothing was found in the part checked). ``budget_ms <= 0`` skips the check (False). The check
    reads every page, so its cost grows with the file (about 1 s per 500 MB from the page cache).
    """
    if budget_ms <= 0:
        return False
    deadline = time.monotonic() + budget_ms / 1000
    # The handler runs every N virtual-machine steps; a non-zero return interrupts the statement.
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    try:
        rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    except sqlite3.OperationalError as exc:
        if "interrupt" in str(exc).lower():
            return False
        raise
    finally:
        conn.set_progress_handler(None, 0)
    findings = [str(row[0]) for row in rows]
    if findings == ["ok"]:
        return True
    findings = [line.strip() for finding in findings for line in finding.splitlines()
                if line.strip() and not line.startswith("***")]
    raise SchemaCorrupt(
        f"database {path!r} is damaged: SQLite's quick_check found: " + "; ".join(findings[:5])
        + ". Restore it from a backup, or move it aside and start with a new file"
    )


def apply_pending(
    conn: sqlite3.Connection, known: Sequence[Migration], path: str, now_ms: int
) -> list[MigrationState]:
    """Apply the pending migrations in order, each in one transaction with its ledger row.

    Refuses (writing nothing) another application's database, a database that is not a prefix
    of ``known``, and one whose live schema is not what its applied migrations make.
    """
    states = migration_status(conn, known, path)
    refuse_unsafe(states, path)
    pending = [m for m, s in zip(known, states) if s.status == "pending"]
    if not pending:
        return states
    check_schema(conn, known, path)
    # WAL lets readers (an operator's CLI) run beside the scheduler; it is a property of the
    # file, so it is set once, here, where we write anyway.
    conn.execute("PRAGMA journal_mode = WAL")
    for migration in pending:
        _apply_one(conn, migration, now_ms)
    return migration_status(conn, known, path)


def _apply_one(conn: sqlite3.Connection, migration: Migration, now_ms: int) -> None:
    """Apply one migration and its ledger row in one transaction, unless another process applied
    it since we looked (two processes starting on a new file at once)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_CREATE_LEDGER)
        if conn.execute("SELECT 1 FROM schema_migrations WHERE version = ?",
                        (migration.version,)).fetchone() is not None:
            conn.execute("ROLLBACK")
            return
        # executescript would commit our transaction first; run statement by statement instead.
        for statement in _statements(migration.sql):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at_ms) "
            "VALUES (?, ?, ?, ?)",
            (migration.version, migration.name, migration.checksum, now_ms),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """Split a migration script into complete statements (sqlite3.complete_statement decides)."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if not buffer and line.lstrip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(l.lstrip().startswith("--") or not l.strip() for l in buffer.splitlines()):
        raise PackagingError("migration ends with an incomplete statement")
    return statements
