"""The migration stream: ordered SQL files with sha256 checksums and a capability version.

Files are ``migrations/NNNN_<name>.sql``. The first line of each is ``-- capability: N``: the schema
capability the code can rely on once this migration is applied. Files may name the four roles as
``{{owner}}``, ``{{admin}}``, ``{{runtime}}`` and ``{{gateway}}``; they are replaced by the
configured, quoted role names when applied. Files shipped before the gateway had its own role name
it ``{{worker_ingress}}``: that legacy placeholder renders as the gateway role, so a fresh install
grants straight to it. The checksum is the sha256 of the file as shipped
(placeholders unreplaced), so it does not depend on the role names.

Applying runs as the owner role, all pending migrations in ONE transaction, after locking the
``schema_migrations`` table so two migrators serialise instead of interleaving. An applied stream
that is not a prefix of the known stream (a missing, unknown or altered migration) is refused; the
comparison is the contracts' one algorithm (:mod:`qinglong.contracts.migrations`), this module only
lists the shipped files and reads the ledger.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from importlib import resources
from typing import Mapping, Sequence

from qinglong.contracts.frozen import record
from qinglong.contracts.errors import PackagingError, SchemaNotReady
from qinglong.contracts.migrations import label, migration_states, verdict
from qinglong.contracts.records import MigrationState

SCHEMA = "qinglong"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_CAPABILITY = re.compile(r"^--\s*capability:\s*(\d+)\s*$")
_PLACEHOLDER = re.compile(r"\{\{(owner|admin|runtime|gateway|worker_ingress)\}\}")
#: Placeholders of shipped (immutable) files that now name another role function.
_LEGACY_PLACEHOLDERS = {"worker_ingress": "gateway"}

BOOTSTRAP_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_migrations (
    version        integer PRIMARY KEY,
    name           text NOT NULL,
    checksum       text NOT NULL,
    capability     integer NOT NULL,
    applied_at_ms  bigint NOT NULL,
    applied_by     text NOT NULL
);
"""


@record
class Migration:
    """One shipped migration file."""

    version: int
    name: str
    text: str
    checksum: str
    capability: int

    def render(self, role_identifiers: Mapping[str, str]) -> str:
        """The SQL with role placeholders replaced by already-quoted identifiers."""
        return _PLACEHOLDER.sub(lambda m: role_identifiers[_LEGACY_PLACEHOLDERS.get(m[1], m[1])], self.text)


@record
class AppliedMigration:
    """One row of ``schema_migrations``."""

    version: int
    name: str
    checksum: str
    capability: int


def checksum(text: str) -> str:
    """``sha256:<hex>`` of a migration file's text."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def known_migrations() -> tuple[Migration, ...]:
    """The shipped stream, ordered; versions must be 1, 2, 3, ... without gaps."""
    found: list[Migration] = []
    folder = resources.files(__package__).joinpath("migrations")
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if not match:
            continue
        text = entry.read_text("utf-8")
        first = text.splitlines()[0] if text else ""
        cap = _CAPABILITY.match(first)
        if not cap:
            raise PackagingError(f"migration {entry.name} must start with '-- capability: N'")
        found.append(Migration(int(match[1]), match[2], text, checksum(text), int(cap[1])))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise PackagingError(f"migration stream has a gap: expected version {expected:04d}")
    return tuple(found)


def capability_version() -> int:
    """The capability the code needs: that of the last shipped migration."""
    stream = known_migrations()
    return stream[-1].capability if stream else 0


def compare(known: Sequence[Migration], applied: Sequence[AppliedMigration]) -> list[MigrationState]:
    """Every known or applied migration with its status (the contracts' one algorithm,
    :func:`qinglong.contracts.migrations.migration_states`)."""
    return migration_states(known, applied)


_PROBLEM = {
    "altered": "was applied with another checksum",
    "extra": "is applied but unknown to this version",
    "missing": "is not applied although a later one is",
    "pending": "is not applied",
}


def readiness_problems(states: Sequence[MigrationState]) -> list[str]:
    """Why a migration state is not ready (empty when every shipped migration is applied), in
    version order."""
    found = verdict(states)
    problems = found.unsafe() + [("pending", s) for s in found.pending]
    problems.sort(key=lambda item: item[1].version)
    return [f"migration {label(state)} {_PROBLEM[kind]}" for kind, state in problems]


async def read_applied(conn) -> list[AppliedMigration] | None:
    """The recorded stream, or None when the schema has never been migrated."""
    cur = await conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.schema_migrations",)
    )
    if not (await cur.fetchone())[0]:
        return None
    cur = await conn.execute(
        f"SELECT version, name, checksum, capability FROM {SCHEMA}.schema_migrations ORDER BY version"
    )
    return [AppliedMigration(*row) for row in await cur.fetchall()]


async def status(conn) -> list[MigrationState]:
    """Every known or applied migration with its status (see :func:`compare`)."""
    applied = await read_applied(conn) or []
    return compare(known_migrations(), applied)


async def apply_pending(conn, roles: Mapping[str, str]) -> list[MigrationState]:
    """Apply every pending migration in one transaction, as the connected (owner) role.

    ``roles`` maps ``owner``/``admin``/``runtime``/``gateway`` to role names. Raises
    :class:`SchemaNotReady` when the recorded stream is drifted or contains unknown migrations:
    nothing is applied on top of a schema this code does not know.
    """
    from psycopg import sql

    identifiers = {key: sql.Identifier(name).as_string(conn) for key, name in roles.items()}
    known = known_migrations()
    async with conn.transaction():
        await conn.execute(BOOTSTRAP_SQL)
        # Serialise concurrent migrators: the second waits, then sees the first one's rows.
        await conn.execute(f"LOCK TABLE {SCHEMA}.schema_migrations IN EXCLUSIVE MODE")
        applied = await read_applied(conn) or []
        states = compare(known, applied)
        found = verdict(states)
        if not found.safe_to_migrate:
            raise SchemaNotReady("; ".join(
                f"migration {label(state)} {_PROBLEM[kind]}" for kind, state in found.unsafe()))
        pending = {s.version for s in found.pending}
        for migration in known:
            if migration.version not in pending:
                continue
            await conn.execute(migration.render(identifiers))
            await conn.execute(
                f"INSERT INTO {SCHEMA}.schema_migrations "
                "(version, name, checksum, capability, applied_at_ms, applied_by) VALUES "
                "(%s, %s, %s, %s, floor(extract(epoch FROM clock_timestamp()) * 1000::numeric)::bigint, current_user)",
                (migration.version, migration.name, migration.checksum, migration.capability),
            )
    return await status(conn)
