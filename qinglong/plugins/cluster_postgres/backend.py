"""``ClusterPostgresBackend``: the :class:`~qinglong.contracts.store.SchedulerBackend` of the
cluster profile.

Two pools, each opened on first need: the runtime pool (claims, admission, reader, recovery,
readiness) and the admin pool (publisher). Migrations use a single owner connection. Nothing
connects in ``__init__``; settings problems (a missing DSN) are raised as
:class:`~qinglong.contracts.errors.SettingsError` naming the key, before any connection.

A round never raises: its errors go to the diagnostic sink (redacted, no DSN) and show in the
report's ``errors``. A connection that died while idle (``pg_terminate_backend``, a server
restart) is discarded by the pool's check when the next round borrows it, so the next round
recovers by itself.

A round is bounded on the client side by the lease: a round still running when the claims it made
have expired can no longer commit any of them, so its connection is severed (the socket shut
down under the pending wait), closed, never handed back to the pool in an unknown state, and the
round reports ``cluster_postgres.round_timed_out``; its claims simply lapse. Without the bound a
connection whose peer went silent (``statement_timeout`` is the server's, and a proxy's kernel
answers keepalives) would stall the replica's loop forever.
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import psycopg
from psycopg_pool import PoolTimeout

from qinglong.contracts.diagnostics import DiagnosticEvent, RoundEvent
from qinglong.contracts.errors import QinglongError, SchemaNotReady, SettingsError
from qinglong.contracts.records import MigrationState, RecoveryReport, RoundReport
from qinglong.contracts.secrets import check_keys_loaded
from qinglong.contracts.store import BackendContext

from . import migrations, recovery, roles
from .claim import effective_budget, next_budget
from .coordinator import RoundStats, run_round
from .db import (
    BackendUnavailable, BackendUnreachable, Secrets, connect, describe_error, make_pool, sever_after,
    unavailable)
from .publisher import ClusterPublisher
from .reader import ClusterReader
from .settings import ClusterPostgresSettings
from .sql import query


#: How long past its bound a round may take to end after its connection was severed.
ROUND_GRACE_S = 15.0


class RoundTimedOut(QinglongError):
    """A round outlived the lease of the claims it made; its connection was discarded."""

    def __init__(self, bound_s: float) -> None:
        super().__init__(
            f"round still waiting on the database after {bound_s * 1000:.0f} ms (the lease): its "
            "connection was discarded and its claims are left to expire")


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    """Whether the error means the connection itself is gone (no SQLSTATE: it closed under the
    query; class 08; or the server shutting down or terminating it, 57P01-57P03), not the
    statement."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class ClusterPostgresBackend:
    """PostgreSQL row-lease scheduler backend (see the package docstring)."""

    name = "cluster_postgres"

    def __init__(self, context: BackendContext) -> None:
        settings = context.settings
        if isinstance(settings, dict):
            settings = ClusterPostgresSettings.model_validate(settings)
        if not isinstance(settings, ClusterPostgresSettings):
            raise SettingsError("cluster_postgres needs ClusterPostgresSettings as its [backend] settings")
        self.context = context
        self.settings = settings
        self.auto_migrate = settings.auto_migrate
        self.owner = context.owner
        self.secrets = Secrets(
            s.get_secret_value() if s is not None else None
            for s in (settings.runtime_dsn, settings.admin_dsn, settings.owner_dsn)
        )
        self._runtime_pool = None
        self._admin_pool = None
        self._lock = asyncio.Lock()
        self._round_lock = asyncio.Lock()
        #: a round ran since the pools opened: the stop gives back what this owner still holds
        self._rounds_run = False
        #: False after ``open(create=False)``: a read command never migrates
        self._may_migrate = True
        #: the next round's claim budget while claims come back full (``claim.next_budget``);
        #: None: the configured one
        self._claim_budget: int | None = None

    # ---- connections ---------------------------------------------------------------------
    def _app_name(self, role: str) -> str:
        return f"qinglong {role} {self.owner}"

    async def _open_pool(self, key: str, purpose: str, name: str, min_size: int, max_size: int):
        dsn = self.settings.require_dsn(key, purpose)
        pool = make_pool(
            dsn, name=name, min_size=min_size, max_size=max_size,
            timeout_ms=self.settings.pool_timeout_ms,
            statement_timeout_ms=self.settings.statement_timeout_ms,
            application_name=self._app_name(name),
        )
        try:
            await pool.open_or_refused(self.settings.pool_timeout_ms / 1000)
        except (PoolTimeout, psycopg.Error) as exc:
            await pool.close()
            raise unavailable(
                f"cannot open the {name} pool ({key}): {describe_error(exc, self.secrets)}",
                pool.last_error or exc) from None
        return pool

    async def runtime_pool(self):
        """The runtime role's pool, opened on first use."""
        async with self._lock:
            if self._runtime_pool is None:
                self._runtime_pool = await self._open_pool(
                    "runtime_dsn", "to run the scheduler and read", "runtime",
                    self.settings.pool_min_size, self.settings.pool_max_size)
            return self._runtime_pool

    async def admin_pool(self):
        """The admin role's pool (publisher), opened on first use."""
        async with self._lock:
            if self._admin_pool is None:
                self._admin_pool = await self._open_pool(
                    "admin_dsn", "to publish projects, tasks and triggers", "admin", 1, 2)
            return self._admin_pool

    async def _with_runtime(self, body):
        """``body(conn)`` on a runtime connection. Every body given here only reads (the start
        steps: migration status, readiness, recovery), so when the connection breaks under it
        (the server restarted, or an administrator terminated it) the read runs once more on a
        new connection, which the pool waits for up to ``pool_timeout_ms``: a replica starting
        while its database restarts rides the restart out. A server still away after that is
        :class:`BackendUnreachable`, an outage the start waits out (``[lifecycle]
        start_wait_ms``); a refused login is :class:`BackendAuthFailed`, which it does not."""
        pool = await self.runtime_pool()
        for last in (False, True):
            try:
                async with pool.connection() as conn:
                    return await body(conn)
            except PoolTimeout as exc:
                raise unavailable(
                    f"no runtime connection within {self.settings.pool_timeout_ms} ms: "
                    f"{describe_error(exc, self.secrets)}", pool.last_error) from None
            except psycopg.OperationalError as exc:
                if _connection_lost(exc):
                    if not last:
                        continue
                    raise BackendUnreachable(describe_error(exc, self.secrets)) from None
                raise BackendUnavailable(describe_error(exc, self.secrets)) from None

    # ---- lifecycle -------------------------------------------------------------------------
    async def open(self, *, create: bool = True) -> None:
        """Open the runtime pool (the admin pool opens when the publisher is first used).

        A server's database is created by its operator, never by opening; ``create=False`` (a
        read command) means :meth:`migrate` applies nothing and returns the status instead.
        """
        self._may_migrate = create
        await self.runtime_pool()

    async def migrate(self) -> Sequence[MigrationState]:
        """Apply pending migrations as the owner role (``owner_dsn``), all in one transaction.

        On a backend opened with ``create=False`` nothing is applied: the status is returned and
        :meth:`check_readiness` names what is pending."""
        if not self._may_migrate:
            return await self.migration_status()
        dsn = self.settings.require_dsn("owner_dsn", "to apply migrations")
        conn = await connect(dsn, statement_timeout_ms=0, application_name=self._app_name("migrate"),
                             secrets=self.secrets)
        try:
            return await migrations.apply_pending(conn, self.settings.roles())
        except psycopg.Error as exc:
            raise SchemaNotReady(f"migration failed: {describe_error(exc, self.secrets)}") from None
        finally:
            await conn.close()

    async def check_secrets(self) -> None:
        """At start: refuse (:class:`~qinglong.contracts.errors.SecretsError`) when a stored env
        value or trigger secret is sealed under a key that is not loaded (read as the runtime
        role). Values still in clear are sealed by ``qinglong secrets rotate``, not here:
        revisions are the owner's to rewrite."""
        async def body(conn):
            cur = await conn.execute(query("secrets_key_ids"))
            return {row[0] for row in await cur.fetchall()}

        try:
            key_ids = await self._with_runtime(body)
        except psycopg.Error as exc:
            raise SchemaNotReady(f"secrets check failed: {describe_error(exc, self.secrets)}") from None
        check_keys_loaded(self.context.sealer, key_ids, "the cluster store")

    async def reseal_secrets(self, sealer) -> int:
        """Seal every stored env value (task and execution revisions) and trigger secret (trigger
        heads) under ``sealer``'s current key, as the owner role (``owner_dsn``), in one
        transaction that holds off publishing: values in clear and values under another loaded
        key; values under the current key are left as they are, so running it again (after an
        interruption) finishes the job. Returns the rows rewritten."""
        import json

        from psycopg.rows import dict_row

        from qinglong.contracts.records import canonical_json
        from qinglong.contracts.secrets import (
            opened_env_payload,
            payload_needs_sealing,
            sealed_env_payload,
            sealed_trigger_spec,
            spec_needs_sealing,
        )

        dsn = self.settings.require_dsn("owner_dsn", "to rotate the secrets key")
        conn = await connect(dsn, statement_timeout_ms=0, application_name=self._app_name("secrets"),
                             secrets=self.secrets)
        changed = 0
        try:
            async with conn.transaction():
                await conn.execute(query("secrets_lock_revisions"))
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(query("secrets_task_payloads"))
                    rows = await cur.fetchall()
                for row in rows:
                    value = json.loads(row["text"])
                    holder = value if row["kind"] == "task" else value["execution"]
                    if not payload_needs_sealing(sealer, holder):
                        continue
                    plain = opened_env_payload(sealer, row["project_id"], row["task_id"], holder)
                    _, sealed = sealed_env_payload(sealer, row["project_id"], row["task_id"], plain)
                    stored = sealed if row["kind"] == "task" else {**value, "execution": sealed}
                    await conn.execute(query(f"secrets_update_{row['kind']}"), {
                        "text": canonical_json(stored), "project_id": row["project_id"],
                        "task_id": row["task_id"], "task_revision": row["task_revision"]})
                    changed += 1
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(query("secrets_trigger_specs"))
                    triggers = await cur.fetchall()
                for row in triggers:
                    spec = json.loads(row["text"])
                    if not isinstance(spec, dict) or not spec_needs_sealing(sealer, spec):
                        continue
                    stored = sealed_trigger_spec(sealer, row["project_id"], row["trigger_id"], spec)
                    await conn.execute(query("secrets_update_trigger"), {
                        "text": canonical_json(stored), "trigger_id": row["trigger_id"]})
                    changed += 1
        except psycopg.Error as exc:
            raise SchemaNotReady(f"secrets rotation failed: {describe_error(exc, self.secrets)}") from None
        finally:
            await conn.close()
        return changed

    async def migration_status(self) -> Sequence[MigrationState]:
        """Every known or applied migration with its status (read as the runtime role)."""
        return await self._with_runtime(migrations.status)

    async def check_readiness(self) -> None:
        """Fail closed unless the migration stream, capability, owners, roles and GRANTs are exact."""
        async def body(conn):
            problems: list[str] = []
            cur = await conn.execute("SELECT current_user")
            user = (await cur.fetchone())[0]
            if user != self.settings.runtime_role:
                problems.append(f"runtime_dsn logs in as {user}, expected {self.settings.runtime_role}")
            applied = await migrations.read_applied(conn)
            if applied is None:
                raise SchemaNotReady(
                    "the cluster schema is not installed (or not visible to the runtime role); "
                    "apply the migrations as the owner role")
            problems += migrations.readiness_problems(migrations.compare(migrations.known_migrations(), applied))
            have = max((a.capability for a in applied), default=0)
            if have != migrations.capability_version():
                problems.append(f"schema capability {have}, this version needs {migrations.capability_version()}")
            problems += await roles.privilege_problems(conn, self.settings.roles())
            return problems

        try:
            problems = await self._with_runtime(body)
        except psycopg.Error as exc:
            raise SchemaNotReady(f"readiness check failed: {describe_error(exc, self.secrets)}") from None
        if problems:
            raise SchemaNotReady("schema not ready: " + "; ".join(problems))

    async def recover(self) -> RecoveryReport:
        """Classify in-flight Runs; candidates are reported, never touched (see ``recovery``).

        Also warns about enabled triggers of a kind this replica has no provider for: its rounds
        never claim them (another replica with the provider may), so without this they would be
        silent here."""
        report = await self._with_runtime(recovery.scan)
        kinds = await self._with_runtime(recovery.enabled_kinds)
        missing = {kind: n for kind, n in kinds.items() if kind not in self.context.providers}
        for kind, n in sorted(missing.items()):
            self._emit("warning", RoundEvent.UNKNOWN_TRIGGER_KIND,
                       f"no loaded provider for trigger kind {kind!r} ({n} enabled trigger(s)); "
                       "this replica never claims them", kind=kind, triggers=n)
        if report.candidates:
            self._emit("warning", "cluster_postgres.recovery_candidates",
                       f"{len(report.candidates)} in-flight run(s) are not pristine and need recovery",
                       candidates=len(report.candidates), pristine=report.pristine_queued)
        return report

    async def run_round(self) -> RoundReport:
        """One bounded round; never raises, never overlaps itself (a second caller waits).

        Bounded by the lease, on the client side (see the module docstring): a round that
        outlives it is severed, its connection discarded, and it reports
        ``cluster_postgres.round_timed_out``.
        """
        async with self._round_lock:
            self._rounds_run = True
            stats = RoundStats()
            limits = self.context.limits
            budget = self._claim_budget or effective_budget(limits.claim_budget)
            # a round that fails in any way starts the next from the configured budget
            self._claim_budget = None
            bound_s = limits.lease_ms / 1000
            deadline = time.monotonic() + bound_s
            try:
                pool = await self.runtime_pool()
                # the last resort if severing did not end the waits (psycopg's own cancellation
                # of a query is bounded, about 10 s)
                async with asyncio.timeout(bound_s + ROUND_GRACE_S):
                    async with pool.connection() as conn:
                        with sever_after(conn, deadline - time.monotonic()) as cut:
                            try:
                                await run_round(
                                    conn, owner=self.owner, claim_budget=budget,
                                    lease_ms=limits.lease_ms, providers=self.context.providers,
                                    diagnostics=self.context.diagnostics,
                                    retries=self.settings.serialization_retries,
                                    secrets=self.secrets, stats=stats,
                                    max_queued=limits.max_queued)
                                self._claim_budget = next_budget(
                                    limits.claim_budget, budget, stats.claimed, stats.more_due)
                                await self._record_round(conn)
                            except psycopg.Error:
                                if cut.severed:
                                    raise RoundTimedOut(bound_s) from None
                                raise
                            finally:
                                if cut.severed:
                                    await conn.close()  # the pool discards a closed connection
            except asyncio.CancelledError:
                raise
            except (RoundTimedOut, TimeoutError) as exc:
                stats.errors += 1
                self._emit("error", "cluster_postgres.round_timed_out",
                           str(exc) if isinstance(exc, RoundTimedOut) else str(RoundTimedOut(bound_s)),
                           lease_ms=limits.lease_ms)
            except QinglongError as exc:
                stats.errors += 1
                self._emit("error", "cluster_postgres.round_failed", str(exc))
            except Exception as exc:  # the loop must survive anything a round meets
                stats.errors += 1
                self._emit("error", "cluster_postgres.round_failed", describe_error(exc, self.secrets))
            self.last_round = stats
            return stats.report()

    async def _record_round(self, conn) -> None:
        """Record this replica's completed round (``scheduler_replicas``, database clock), so
        readers can tell a scheduler is working the store. A failure is reported, never fatal."""
        from .sql import query

        try:
            await conn.execute(query("record_replica_round"), {"owner": self.owner})
        except psycopg.Error as exc:
            if conn.broken or isinstance(exc, psycopg.OperationalError):
                raise
            self._emit("warning", "cluster_postgres.round_not_recorded",
                       describe_error(exc, self.secrets))

    def publisher(self) -> ClusterPublisher:
        """The admin side (admin role); refuses a 'skip' grace the cadence and lease cannot meet."""
        return ClusterPublisher(self.admin_pool, self.context.providers,
                                self.settings.serialization_retries, self.context.limits,
                                sealer=self.context.sealer)

    def reader(self) -> ClusterReader:
        """The read side (runtime role)."""
        return ClusterReader(self.runtime_pool, self.context.limits)

    def tokens(self):
        """The management API's tokens and the audit log (admin role)."""
        from .tokens import ClusterTokens

        return ClusterTokens(self.admin_pool)

    def worker_registry(self):
        """Registered workers (admin role): register, rotate, revoke, list."""
        from .registry import ClusterWorkers

        return ClusterWorkers(self.admin_pool)

    def run_control(self):
        """The operator's side of the Runs the remote workers execute (runtime role): list,
        show, cancel, read logs (:class:`~qinglong.contracts.execution.RunControl`). There is
        no ``execution()`` here: this host executes no Run itself."""
        from .runs import ClusterRunControl

        return ClusterRunControl(self._with_runtime)

    def occurrences(self):
        """Admission of event sources' occurrences (runtime role)."""
        from .events import ClusterOccurrences

        return ClusterOccurrences(self._with_runtime, self.context.limits.max_queued)

    def outbox(self):
        """Events out (:class:`~qinglong.contracts.events.EventOutbox`), as the runtime role."""
        from .events import ClusterEventOutbox

        return ClusterEventOutbox(self._with_runtime, sealer=self.context.sealer)

    async def close(self) -> None:
        """Give back the claims this replica still holds (once it ran a round), then close both
        pools. Idempotent."""
        if self._rounds_run:
            self._rounds_run = False
            await self._release_claims()
        for attr in ("_runtime_pool", "_admin_pool"):
            pool = getattr(self, attr)
            setattr(self, attr, None)
            if pool is not None:
                await pool.close()

    async def _release_claims(self) -> None:
        """An orderly stop: every claim of this owner given back under its fence
        (``release_owner_claims``), after any round of this replica ended; bounded like a round.
        A failure is reported: the claims then lapse with their lease."""
        from .sql import query

        pool = self._runtime_pool
        if pool is None:
            return
        bound_s = self.context.limits.lease_ms / 1000
        try:
            async with asyncio.timeout(bound_s + ROUND_GRACE_S):
                async with self._round_lock:
                    async with pool.connection(timeout=bound_s) as conn:
                        with sever_after(conn, bound_s) as cut:
                            try:
                                cur = await conn.execute(query("release_owner_claims"), {"owner": self.owner})
                                released = len(await cur.fetchall())
                            finally:
                                if cut.severed:
                                    await conn.close()
        except Exception as exc:
            self._emit("warning", "cluster_postgres.claims_not_released",
                       "the claims this replica holds could not be given back at its stop (they lapse "
                       f"with their lease): {describe_error(exc, self.secrets)}")
            return
        if released:
            self._emit("info", "cluster_postgres.claims_released",
                       f"{released} claim(s) this replica held were given back at its stop", released=released)

    def _emit(self, level: str, code: str, message: str, **fields) -> None:
        try:
            self.context.diagnostics.emit(
                DiagnosticEvent(level, code, self.secrets.mask(message), fields).redacted())
        except Exception:
            pass
