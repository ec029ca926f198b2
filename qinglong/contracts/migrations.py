"""The one migration-status algorithm: a shipped stream against a database's ledger.

A backend ships an ordered stream of migrations (version 1, 2, 3, ... each with a name and the
checksum of its file) and records each applied one in a ledger. Both backends compare the two the
same way, here; a backend's adapter only lists its shipped files and reads its ledger rows.

Each migration is, in version order:

- ``applied``: recorded with the shipped name and checksum;
- ``drifted``: recorded with another name or checksum (the file was altered after it was applied);
- ``pending``: shipped, not recorded;
- ``unknown``: recorded, not shipped (a newer version migrated the database); listed last.

:func:`verdict` then says whether the database is ready: a migration that is ``altered`` (drifted),
``extra`` (unknown) or ``missing`` (pending although a later one is applied: the stream was edited
or a ledger row removed) makes it unsafe, and nothing may be applied on top of it; ``pending``
migrations after the newest applied one are an older database, which migrating forward fixes.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

from .frozen import record
from .records import MigrationState


class MigrationIdentity(Protocol):
    """What the algorithm reads of a shipped migration or a ledger row."""

    @property
    def version(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def checksum(self) -> str: ...


def migration_states(shipped: Sequence[MigrationIdentity],
                     ledger: Iterable[MigrationIdentity]) -> list[MigrationState]:
    """Every shipped or recorded migration with its status: shipped ones in ``shipped``'s order,
    then the unknown ones by version."""
    recorded = {row.version: row for row in ledger}
    states: list[MigrationState] = []
    for migration in shipped:
        row = recorded.pop(migration.version, None)
        if row is None:
            status = "pending"
        elif row.checksum == migration.checksum and row.name == migration.name:
            status = "applied"
        else:
            status = "drifted"
        states.append(MigrationState(migration.version, migration.name, migration.checksum, status))
    for version in sorted(recorded):
        row = recorded[version]
        states.append(MigrationState(row.version, row.name, row.checksum, "unknown"))
    return states


@record
class MigrationVerdict:
    """What a list of :class:`MigrationState` means for starting and for migrating."""

    altered: tuple[MigrationState, ...]
    """Recorded with another name or checksum than the shipped file."""
    extra: tuple[MigrationState, ...]
    """Recorded but not shipped: a newer version migrated the database."""
    missing: tuple[MigrationState, ...]
    """Not recorded although a later migration is: a gap in the applied stream."""
    pending: tuple[MigrationState, ...]
    """Not recorded, after the newest applied one: migrating forward applies them."""

    @property
    def safe_to_migrate(self) -> bool:
        """True unless something altered, extra or missing makes any write unsafe."""
        return not (self.altered or self.extra or self.missing)

    @property
    def ready(self) -> bool:
        """True when every shipped migration is applied unchanged and nothing else is recorded."""
        return self.safe_to_migrate and not self.pending

    def unsafe(self) -> list[tuple[str, MigrationState]]:
        """``(kind, state)`` of each reason migrating is unsafe, ``kind`` one of ``altered``,
        ``extra``, ``missing``: altered and extra ones in version order, then the missing ones."""
        found = [("altered", s) for s in self.altered] + [("extra", s) for s in self.extra]
        found.sort(key=lambda item: item[1].version)
        return found + [("missing", s) for s in self.missing]


def verdict(states: Sequence[MigrationState]) -> MigrationVerdict:
    """Sort ``states`` (from :func:`migration_states`) into what blocks a start and a migration."""
    newest_applied = max((s.version for s in states if s.status in ("applied", "drifted")),
                         default=0)
    return MigrationVerdict(
        altered=tuple(s for s in states if s.status == "drifted"),
        extra=tuple(s for s in states if s.status == "unknown"),
        missing=tuple(s for s in states if s.status == "pending" and s.version < newest_applied),
        pending=tuple(s for s in states if s.status == "pending" and s.version > newest_applied),
    )


def label(state: MigrationState) -> str:
    """``0003_name``: how messages name a migration."""
    return f"{state.version:04d}_{state.name}"
