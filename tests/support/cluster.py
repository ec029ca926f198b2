"""A migrated cluster database and what tests do with it: :class:`ClusterDb` (each role's DSN,
backends built through the plugin's own factory, SQL as superuser), migrating, seeding triggers,
moving cursors, claiming, committing and expiring as a replica does."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.aio import closing
from tests.support.pg import ROLE_PASSWORDS, PgServer

ROOT = Path(__file__).resolve().parents[2]


class CollectingSink:
    """A diagnostic sink that keeps every event, for assertions."""

    def __init__(self) -> None:
        self.events = []

    def emit(self, event) -> None:
        self.events.append(event)

    def codes(self) -> list[str]:
        return [e.code for e in self.events]


@dataclass
class ClusterDb:
    """One migrated database on one server, and ways to reach it as each role."""

    server: PgServer
    dbname: str
    sinks: list = field(default_factory=list)

    def dsn(self, role: str) -> str:
        return self.server.dsn(role, ROLE_PASSWORDS[role], self.dbname)

    def superuser_dsn(self) -> str:
        return self.server.superuser_dsn(self.dbname)

    def settings(self, **overrides):
        from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings

        values = dict(
            runtime_dsn=self.dsn("qinglong_runtime"),
            admin_dsn=self.dsn("qinglong_admin"),
            owner_dsn=self.dsn("qinglong_owner"),
            pool_min_size=1,
            pool_max_size=4,
            pool_timeout_ms=3000,
        )
        values.update(overrides)
        return ClusterPostgresSettings(**values)

    def backend(self, owner: str = "replica-a", *, claim_budget: int = 16, lease_ms: int = 30_000,
                settings=None, sink=None, clock_ms=None, max_queued: int | None = None, sealer=None):
        """A backend built through the plugin's own factory (not connected yet)."""
        from qinglong.contracts.store import BackendContext, SchedulerLimits
        from qinglong.plugins.cluster_postgres import qinglong_scheduler_backends
        from qinglong.plugins.cron.provider import CronProvider

        spec = qinglong_scheduler_backends()[0]
        sink = sink or CollectingSink()
        self.sinks.append(sink)
        context = BackendContext(
            settings=settings or self.settings(),
            limits=SchedulerLimits(page_size=32, claim_budget=claim_budget, lease_ms=lease_ms,
                                   cadence_ms=1000, max_queued=max_queued),
            providers={"cron": CronProvider()},
            diagnostics=sink,
            clock_ms=clock_ms or (lambda: int(time.time() * 1000)),
            owner=owner,
            sealer=sealer,
        )
        return spec.create(context)

    def sql(self, statement: str, params=None, *, role: str | None = None):
        """Run one statement (as superuser unless ``role``) in autocommit; rows or None."""
        import psycopg

        dsn = self.dsn(role) if role else self.superuser_dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else None

    def count(self, table: str, where: str = "true", params=None) -> int:
        return self.sql(f"SELECT count(*) FROM qinglong.{table} WHERE {where}", params)[0][0]

    def db_now_ms(self) -> int:
        return self.sql("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]


def migrate(db: ClusterDb) -> None:
    """Apply every migration as the owner role, through the backend."""
    backend = db.backend("migrator")

    async def body():
        async with closing(backend):
            await backend.migrate()

    asyncio.run(body())


def arun(coro):
    """Run a coroutine to completion (the tests are synchronous)."""
    return asyncio.run(coro)


def expire(db: "ClusterDb", limit: int = 64) -> list[tuple[uuid.UUID, uuid.UUID, str]]:
    """One page of the control plane's expiry as a replica's ExpiryLoop runs it
    (``control.expire_page``, the runtime role): ``(attempt_id, run_id, action)`` of each
    Attempt it ended."""
    import psycopg

    from qinglong.plugins.cluster_postgres.control import expire_page

    async def body():
        async with await psycopg.AsyncConnection.connect(db.dsn("qinglong_runtime"),
                                                         autocommit=True) as conn:
            return (await expire_page(conn, limit))[0]

    return [(uuid.UUID(a), uuid.UUID(r), action) for a, r, action in arun(body())]


def seed(db: ClusterDb, n: int = 1, *, expression: str = "0 0 1 1 *", project: str = "p1",
         policy: str = "fire_once", grace_ms: int = 60_000, prefix: str = "tr") -> list:
    """Publish a project, a task and ``n`` cron triggers (default: once a year, so nothing fires
    unless a test moves a cursor) through the real publisher. Returns the trigger heads."""
    from qinglong.contracts.errors import AlreadyExists
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    async def body():
        backend = db.backend("publisher")
        async with closing(backend):
            pub = backend.publisher()
            try:
                await pub.create_project(project)
            except AlreadyExists:
                pass
            await pub.put_task(project, "task", {"cmd": ["echo", "hello"]})
            heads = []
            for i in range(n):
                heads.append(await pub.put_trigger(TriggerDefinition(
                    project, f"{prefix}{i:03d}", "task", "cron", {"expression": expression},
                    misfire_policy=MisfirePolicy(policy), misfire_grace_ms=grace_ms)))
            return heads

    return arun(body())


def set_cursor(db: ClusterDb, trigger_id: str | None, offset_ms: int | None) -> None:
    """Move a schedule's cursor to database now + ``offset_ms`` (None: awaiting initialization);
    ``trigger_id`` None moves every schedule. Clears any claim.

    ``now`` is read once for the whole statement (an uncorrelated scalar subquery is an init plan):
    ``clock_timestamp()`` per row would give rows meant to share a cursor values a millisecond
    apart, and the due order between them would then be left to chance."""
    value = "NULL" if offset_ms is None else (
        f"(SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) + {int(offset_ms)}")
    where = "true" if trigger_id is None else "trigger_id = %(t)s"
    db.sql(f"UPDATE qinglong.trigger_schedules SET next_fire_at_ms = {value}, claim_owner = NULL, "
           f"claim_token = NULL, claim_expires_at_ms = NULL WHERE {where}", {"t": trigger_id})


async def claim(backend, limit: int = 16, lease_ms: int = 30_000):
    """Claim directly (one statement) through the backend's runtime pool."""
    from qinglong.plugins.cluster_postgres.claim import claim_due_schedules

    pool = await backend.runtime_pool()
    async with pool.connection() as conn:
        return await claim_due_schedules(conn, owner=backend.owner, limit=limit, lease_ms=lease_ms)


async def commit(backend, claimed, decision=None, retries: int = 5):
    """Decide (unless given) and commit one claim through the backend's runtime pool."""
    from qinglong.contracts.decision import decide
    from qinglong.plugins.cluster_postgres.admission import commit_decision

    if decision is None:
        provider = backend.context.providers[claimed.head.kind]
        decision = decide(claimed.head, claimed.cursor, claimed.observed_at_ms, provider)
    pool = await backend.runtime_pool()
    async with pool.connection() as conn:
        return await commit_decision(conn, claimed, decision, retries=retries)


def explained(db: ClusterDb, statement: str, params=(), *, plan_mode: str) -> tuple[list, list[dict]]:
    """Run ``statement`` as the superuser with ``auto_explain`` reporting EXPLAIN (ANALYZE,
    BUFFERS) of it and of every statement it runs inside (functions, triggers) to this session,
    planned as ``plan_mode`` says (``force_generic_plan``: the plans a session keeps after its
    fifth call). Its rows (None without any) and the plans, as EXPLAIN's JSON documents."""
    import json

    import psycopg

    plans: list[dict] = []

    def notice(diag) -> None:
        text = diag.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    with psycopg.connect(db.superuser_dsn(), autocommit=True) as conn:
        conn.add_notice_handler(notice)
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
                        "SET auto_explain.log_nested_statements = on",
                        "SET auto_explain.log_format = json", f"SET plan_cache_mode = {plan_mode}",
                        "SET client_min_messages = log"):
            conn.execute(setting)
        cur = conn.execute(statement, params)
        rows = cur.fetchall() if cur.description else None
    return rows, plans
