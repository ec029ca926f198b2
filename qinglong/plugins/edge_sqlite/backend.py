"""The ``edge_sqlite`` :class:`~qinglong.contracts.store.SchedulerBackend`.

Lifecycle, as the host drives it: :meth:`open`, :meth:`migrate` when ``auto_migrate`` (the edge
default), :meth:`check_readiness`, :meth:`recover`, :meth:`run_round` at the cadence, :meth:`close`.

Only a scheduler recovers, so :meth:`recover` is where this process becomes the file's owner: it
takes the owner lock (a second ``qinglong run`` on the file is refused naming the first one's pid)
and runs SQLite's page-level check before the first round. :meth:`migrate` holds the lock while
it applies anything, so a schema is never migrated beneath a running scheduler. Publishing and read
commands otherwise never take the lock. A backend opened with ``create=False`` (read commands) neither creates nor migrates.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.records import MigrationState, RecoveryReport, RoundReport, canonical_json
from qinglong.contracts.secrets import (
    check_keys_loaded,
    is_sealed,
    is_secret_key,
    key_ids_in,
    opened_env_payload,
    payload_needs_sealing,
    sealed_env_payload,
    sealed_trigger_spec,
    spec_key_ids,
    spec_needs_sealing,
)
from qinglong.contracts.store import BackendContext

from . import migrations
from .events import SqliteEventOutbox
from .execution import SqliteExecutionStore
from .reader import SqliteReader
from .recovery import recover_in_thread
from .scheduler import BeforeCommit, run_round
from .scheduler_holds import HeldSchedules
from .settings import EdgeSqliteSettings
from .queries import query
from .store import SqliteStore, named_cursor, named_rows, transaction

if TYPE_CHECKING:  # imported when first asked for: `qinglong run` publishes nothing itself
    from .publisher import SqlitePublisher
    from .tokens import SqliteTokens


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
        self._publisher: SqlitePublisher | None = None
        self._reader = SqliteReader(self.store, context.clock_ms)
        self._execution = SqliteExecutionStore(self.store, sealer=context.sealer)
        self._outbox = SqliteEventOutbox(self.store, context.clock_ms, sealer=context.sealer)
        self._may_create = True
        # Held (undecidable) schedules, remembered across this backend's rounds.
        self._held = HeldSchedules()

    async def open(self, *, create: bool = True, read_only: bool = False) -> None:
        """Connect (the directory of ``path`` must exist). Writes nothing to an existing file.

        ``create=False`` is for commands that only read: a missing file is
        :class:`~qinglong.contracts.errors.StoreMissing` (nothing is created) and :meth:`migrate`
        applies nothing. ``create=True`` (``run``, ``db migrate``, publishing) may create the file
        and refuses a read-only one at once with :class:`~qinglong.contracts.errors.StoreReadOnly`.
        ``read_only`` (with ``create=False``): the file is opened read-only, and read on a read-only
        file or directory and on a full disk.
        """
        self._may_create = create and not read_only
        await self.store.open(create=create, read_only=read_only)

    async def migrate(self) -> Sequence[MigrationState]:
        """Apply pending migrations; refuse another application's database, a drifted, unknown or
        missing migration, or a schema that differs from its migrations, writing nothing.

        On a backend opened with ``create=False`` nothing is applied: the status is returned and
        :meth:`check_readiness` names what is pending.
        """
        states = await self.store.call(migrations.migration_status, self.migrations, self.store.path)
        if not self._may_create or all(s.status != "pending" for s in states):
            return states
        if self.store.placing:  # a new database no other process can see yet: no lock needed
            now = self.context.clock_ms()
            states = await self.store.call(migrations.apply_pending, self.migrations, self.store.path, now)
            await self.store.place()
            return states
        # Something is to be applied: never under a scheduler that is running on this file (an
        # upgraded binary migrating the schema beneath an older running one). The owner lock is
        # held only for the migration, unless this process already owns the file.
        lock = self.store.owner_lock
        owned_before = lock.held
        lock.acquire()
        try:
            now = self.context.clock_ms()
            return await self.store.call(migrations.apply_pending, self.migrations, self.store.path, now)
        finally:
            if not owned_before:
                lock.release()

    async def migration_status(self) -> Sequence[MigrationState]:
        """Every known or applied migration with its status. Unless a migration drifted or is
        unknown (which the statuses show), the live schema is compared with the migrations' and
        the pages are checked (bounded by ``quick_check_ms``): damage is
        :class:`~qinglong.contracts.errors.SchemaCorrupt`, not a clean status."""
        def status(conn) -> tuple[Sequence[MigrationState], bool]:
            states = migrations.migration_status(conn, self.migrations, self.store.path)
            complete = True
            if all(s.status in ("applied", "pending") for s in states):
                migrations.check_schema(conn, self.migrations, self.store.path)
                complete = self._page_check(conn)
            return states, complete
        states, complete = await self.store.call(status)
        self._report_page_check(complete)
        return states

    async def check_readiness(self) -> None:
        """Raise :class:`~qinglong.contracts.errors.SchemaNotReady` unless every migration is applied
        exactly as shipped and the live schema is exactly what they make."""
        await self.store.call(migrations.check_ready, self.migrations, self.store.path)

    async def check_secrets(self) -> None:
        """At start: refuse (:class:`~qinglong.contracts.errors.SecretsError`) when a stored env
        value or trigger secret is sealed under a key that is not loaded; then seal, in one
        transaction, any value still in clear (a store written before values were sealed), unless opened to read."""
        sealer = self.context.sealer
        key_ids, in_clear = await self.store.call(self._secrets_census)
        check_keys_loaded(sealer, key_ids, f"the store {self.store.path}")
        if sealer is not None and self._may_create and in_clear:
            await self.reseal_secrets(sealer)

    @classmethod
    def _secrets_census(cls, conn) -> tuple[set[str], bool]:
        """The key ids the stored sealed values name, and whether any secret is still in clear.
        Streamed row by row: every trigger is read, and holding them all at once cost a router
        3 MiB of resident memory for 10,000 triggers, kept for the life of the process."""
        key_ids: set[str] = set()
        in_clear = False
        for *_, payload in cls._secrets_rows(conn):
            key_ids |= key_ids_in((payload,))
            in_clear = in_clear or any(not is_sealed(v) for v in payload["env"].values() if isinstance(v, str))
        for *_, spec in cls._iter_secret_specs(conn):
            key_ids |= spec_key_ids((spec,))
            in_clear = in_clear or any(not is_sealed(v) for k, v in spec.items() if is_secret_key(k))
        return key_ids, in_clear

    @staticmethod
    def _secrets_rows(conn) -> list[tuple[str, str, str, int, dict]]:
        rows = []
        for row in named_rows(conn, query("secrets_task_payloads")):
            payload = json.loads(row["payload_json"])
            rows.append((row["kind"], row["project_id"], row["task_id"], row["task_revision"], payload))
        return rows

    @classmethod
    def _secret_specs(cls, conn) -> list[tuple[str, str, dict]]:
        """``(project, trigger, spec)`` of every trigger whose spec holds a secret key."""
        return list(cls._iter_secret_specs(conn))

    @staticmethod
    def _iter_secret_specs(conn) -> Iterator[tuple[str, str, dict]]:
        """:meth:`_secret_specs` one at a time, from a cursor that reads a row per step."""
        cur = named_cursor(conn)
        try:
            for row in cur.execute(query("secrets_trigger_specs")):
                spec = json.loads(row["spec_json"])
                if isinstance(spec, dict) and any(is_secret_key(k) and isinstance(v, str) for k, v in spec.items()):
                    yield row["project_id"], row["trigger_id"], spec
        finally:
            cur.close()

    async def reseal_secrets(self, sealer: Any) -> int:
        """Seal every stored env value and trigger secret under ``sealer``'s current key, in one
        transaction: values in clear and values under another loaded key; values under the
        current key are left as they are, so running it again (after an interruption) finishes
        the job. Returns the rows rewritten."""
        def work(conn) -> int:
            changed = 0
            # the text replaced is zeroed in the file, not left in a page's free space
            secure = conn.execute("PRAGMA secure_delete").fetchone()[0]
            conn.execute("PRAGMA secure_delete = ON")
            try:
                with transaction(conn):
                    for kind, project_id, task_id, revision, payload in self._secrets_rows(conn):
                        if not payload_needs_sealing(sealer, payload):
                            continue
                        plain = opened_env_payload(sealer, project_id, task_id, payload)
                        _, stored = sealed_env_payload(sealer, project_id, task_id, plain)
                        conn.execute(query(f"secrets_update_{kind}"), {
                            "payload": canonical_json(stored), "project_id": project_id, "task_id": task_id,
                            "task_revision": revision})
                        changed += 1
                    for project_id, trigger_id, spec in self._secret_specs(conn):
                        if not spec_needs_sealing(sealer, spec):
                            continue
                        stored = sealed_trigger_spec(sealer, project_id, trigger_id, spec)
                        # the digest is of the spec in clear: it stays
                        conn.execute(query("secrets_update_trigger"), {
                            "spec": canonical_json(stored), "trigger_id": trigger_id})
                        changed += 1
            finally:
                conn.execute(f"PRAGMA secure_delete = {int(secure)}")
            if changed:  # nor in the write-ahead log's old frames
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return changed

        return await self.store.call(work)

    async def recover(self) -> RecoveryReport:
        """Start as the file's scheduler: take the owner lock
        (:class:`~qinglong.contracts.errors.StoreLocked` naming the holder's pid if another
        ``qinglong run`` has it), check the pages (bounded by ``quick_check_ms``), then count
        pristine queued attempts and report other in-flight work without modifying it."""
        self.store.owner_lock.acquire()
        self._report_page_check(await self.store.call(self._page_check))
        return await self.store.call(recover_in_thread)

    def _page_check(self, conn) -> bool:
        """On the connection's thread: True unless the bounded check did not finish."""
        budget = self.settings.quick_check_ms
        return budget <= 0 or migrations.quick_check(conn, self.store.path, budget)

    def _report_page_check(self, complete: bool) -> None:
        if not complete:
            budget = self.settings.quick_check_ms
            self.context.diagnostics.emit(DiagnosticEvent(
                "warning", "store.quick_check_incomplete",
                f"the page check of the database did not finish within {budget} ms "
                "(quick_check_ms); the part checked is sound", {"path": self.store.path}))

    async def run_round(self, *, before_commit: BeforeCommit | None = None) -> RoundReport:
        """One bounded round (one page). ``before_commit`` is a test seam run between the page's
        decisions and its first commit, on the connection's thread."""
        return await run_round(self.store, self.context.clock_ms, self.context.limits.page_size,
                               self.context.providers, self.context.diagnostics, self._held,
                               before_commit)

    def publisher(self) -> SqlitePublisher:
        """The admin side (its module, and the apply contract it brings, imported on first use)."""
        if self._publisher is None:
            from .publisher import SqlitePublisher

            self._publisher = SqlitePublisher(self.store, self.context)
        return self._publisher

    def reader(self) -> SqliteReader:
        """The read side."""
        return self._reader

    def tokens(self) -> SqliteTokens:
        """The management API's tokens and the audit log, on this backend's connection."""
        from .tokens import SqliteTokens

        return SqliteTokens(self.store)

    def execution(self) -> SqliteExecutionStore:
        """The execution side (:class:`~qinglong.contracts.execution.ExecutionStore`): the local
        dispatcher's and the run commands' one store, on this backend's connection."""
        return self._execution

    def occurrences(self) -> SqliteExecutionStore:
        """Admission of event sources' occurrences
        (:class:`~qinglong.contracts.event_sources.OccurrenceAdmission`)."""
        return self._execution

    def outbox(self) -> SqliteEventOutbox:
        """The events out (:class:`~qinglong.contracts.events.EventOutbox`), on this backend's
        connection."""
        return self._outbox

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        await self.store.close()
