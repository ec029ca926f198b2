"""The ``edge_sqlite`` :class:`~qinglong.contracts.store.SchedulerBackend`.

Lifecycle, as the host drives it: :meth:`open`, :meth:`migrate` when ``auto_migrate`` (the edge
default), :meth:`check_readiness`, :meth:`recover`, :meth:`run_round` at the cadence, :meth:`close`.
"""

from __future__ import annotations

from typing import Sequence

from qinglong.contracts.records import MigrationState, RecoveryReport, RoundReport
from qinglong.contracts.store import BackendContext

from . import migrations
from .publisher import SqlitePublisher
from .reader import SqliteReader
from .recovery import recover_in_thread
from .scheduler import BeforeCommit, run_round
from .settings import EdgeSqliteSettings
from .store import SqliteStore


class EdgeSqliteBackend:
    """One SQLite file, owned by this process; a single-page cursor scanner."""

    name = "edge_sqlite"

    def __init__(self, context: BackendContext) -> None:
        settings = context.settings
        if settings is None:
            settings = EdgeSqliteSettings()
        elif not isinstance(settings, EdgeSqliteSettings):
            settings = EdgeSqliteSettings.model_validate(settings)
        self.settings = settings
        self.context = context
        self.auto_migrate = settings.auto_migrate
        self.store = SqliteStore(settings)
        self.migrations = migrations.load_migrations()
        self._publisher = SqlitePublisher(self.store, context)
        self._reader = SqliteReader(self.store)

    async def open(self) -> None:
        """Connect (the directory of ``path`` must exist). Writes nothing to an existing file."""
        await self.store.open()

    async def migrate(self) -> Sequence[MigrationState]:
        """Apply pending migrations; refuse a drifted, unknown or missing one, writing nothing."""
        now = self.context.clock_ms()
        return await self.store.call(migrations.apply_pending, self.migrations, self.store.path, now)

    async def migration_status(self) -> Sequence[MigrationState]:
        """Every known or applied migration with its status."""
        return await self.store.call(migrations.migration_status, self.migrations)

    async def check_readiness(self) -> None:
        """Raise :class:`~qinglong.contracts.errors.SchemaNotReady` unless every migration is applied
        exactly as shipped."""
        await self.store.call(migrations.check_ready, self.migrations, self.store.path)

    async def recover(self) -> RecoveryReport:
        """Count pristine queued attempts; report other in-flight work without modifying it."""
        return await self.store.call(recover_in_thread)

    async def run_round(self, *, before_commit: BeforeCommit | None = None) -> RoundReport:
        """One bounded round (one page). ``before_commit`` is a test seam run between the page's
        decisions and its first commit, on the connection's thread."""
        return await run_round(self.store, self.context.clock_ms, self.context.limits.page_size,
                               self.context.providers, self.context.diagnostics, before_commit)

    def publisher(self) -> SqlitePublisher:
        """The admin side."""
        return self._publisher

    def reader(self) -> SqliteReader:
        """The read side."""
        return self._reader

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        await self.store.close()
