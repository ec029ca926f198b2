"""The ordered, checksummed migration stream in ``migrations/NNNN_name.sql``.

Each applied migration is recorded in ``schema_migrations`` with the SHA-256 of its file. Readiness
fails closed: a database with a pending, missing (a gap before an applied one), unknown (newer than
this version) or altered (checksum differs) migration is refused, and a refusal writes nothing.
A database made by an older version, whose migrations are a prefix of ours, is migrated forward
in place, each migration in its own transaction.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from qinglong.contracts.errors import SchemaNotReady
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


@dataclass(frozen=True, slots=True)
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
            raise RuntimeError(f"migration file {path.name!r} is not named NNNN_name.sql")
        data = path.read_bytes()
        found.append(Migration(int(number), name, data.decode("utf-8"),
                               "sha256:" + hashlib.sha256(data).hexdigest()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must be 1..n without gaps, found {versions}")
    return tuple(found)


def _applied(conn: sqlite3.Connection) -> list[tuple[int, str, str]]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if exists is None:
        return []
    return conn.execute(
        "SELECT version, name, checksum FROM schema_migrations ORDER BY version"
    ).fetchall()


def migration_status(conn: sqlite3.Connection, known: Sequence[Migration]) -> list[MigrationState]:
    """Every known or applied migration: ``applied``, ``pending``, ``drifted`` or ``unknown``."""
    applied = {version: (name, checksum) for version, name, checksum in _applied(conn)}
    states: list[MigrationState] = []
    for migration in known:
        row = applied.pop(migration.version, None)
        if row is None:
            status = "pending"
        elif row[1] != migration.checksum or row[0] != migration.name:
            status = "drifted"
        else:
            status = "applied"
        states.append(MigrationState(migration.version, migration.name, migration.checksum, status))
    for version, (name, checksum) in sorted(applied.items()):
        states.append(MigrationState(version, name, checksum, "unknown"))
    return states


def _label(state: MigrationState) -> str:
    return f"{state.version:04d}_{state.name}"


def refuse_unsafe(states: Sequence[MigrationState], path: str) -> None:
    """Raise :class:`SchemaNotReady` for a drifted, unknown or missing migration.

    Pending migrations after the newest applied one are fine (an older database, migrated forward);
    a pending migration *before* an applied one means the stream was edited: refuse it.
    """
    for state in states:
        if state.status == "drifted":
            raise SchemaNotReady(
                f"database {path!r}: migration {_label(state)} was altered after it was applied "
                "(checksum differs from this version's file); refusing to start"
            )
        if state.status == "unknown":
            raise SchemaNotReady(
                f"database {path!r}: migration {_label(state)} is not known to this version of "
                "qinglong (the database was migrated by a newer version); refusing to start"
            )
    newest_applied = max((s.version for s in states if s.status == "applied"), default=0)
    for state in states:
        if state.status == "pending" and state.version < newest_applied:
            raise SchemaNotReady(
                f"database {path!r}: migration {_label(state)} is missing although a later one "
                "was applied; refusing to start"
            )


def check_ready(conn: sqlite3.Connection, known: Sequence[Migration], path: str) -> None:
    """Raise :class:`SchemaNotReady` unless every known migration is applied unchanged."""
    states = migration_status(conn, known)
    refuse_unsafe(states, path)
    pending = [s for s in states if s.status == "pending"]
    if pending:
        raise SchemaNotReady(
            f"database {path!r}: migration {_label(pending[0])} is not applied "
            f"({len(pending)} pending); run 'qinglong db migrate' or set auto_migrate = true"
        )


def apply_pending(
    conn: sqlite3.Connection, known: Sequence[Migration], path: str, now_ms: int
) -> list[MigrationState]:
    """Apply the pending migrations in order, each in one transaction with its ledger row.

    Refuses (writing nothing) when the database is not a prefix of ``known``.
    """
    states = migration_status(conn, known)
    refuse_unsafe(states, path)
    pending = [m for m, s in zip(known, states) if s.status == "pending"]
    if pending:
        # WAL lets readers (an operator's CLI) run beside the scheduler; it is a property of the
        # file, so it is set once, here, where we write anyway.
        conn.execute("PRAGMA journal_mode = WAL")
    for migration in pending:
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_CREATE_LEDGER)
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
    return migration_status(conn, known)


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
        raise RuntimeError("migration ends with an incomplete statement")
    return statements
