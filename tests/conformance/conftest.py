"""The conformance harness: every test of this directory runs on the SQLite backend (a real file)
and on the PostgreSQL backend against real PostgreSQL 18 and 15 servers started here.

Tests drive a backend only through the contracts' protocols (``SchedulerBackend``, ``Publisher``,
``Reader``). What the protocols cannot express is in :class:`Harness`, kept small, one method per
backend difference:

* ``now_ms()`` is the store's clock (the injected process clock on edge, the database's clock on
  the cluster);
* ``elapse(ms)`` makes ``ms`` pass for the store: edge moves its injected clock; the cluster, whose
  clock cannot be moved, moves every stored instant (each ``*_at_ms`` column) back by ``ms``,
  which is the same thing as far as any decision can tell. Tests elapse whole seconds and use
  per-second crons, so occurrences stay aligned;
* ``run_round(between=...)`` runs one round, optionally editing the store between the round's
  decisions and its commits (edge: the ``before_commit`` seam; cluster: around ``decide``);
* ``count(table, trigger_id)`` and ``drift_run(run_id)`` inspect and damage rows directly.

A server that cannot start makes the tests error out; nothing here skips.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repository is used from the tree, not installed
    sys.path.insert(0, str(ROOT))

from tests.pg import ROLE_PASSWORDS, create_database, create_roles, drop_database, start_server  # noqa: E402

from qinglong.contracts.records import NO_MORE_OCCURRENCES_MS  # noqa: E402
from qinglong.contracts.store import BackendContext, SchedulerLimits  # noqa: E402
from qinglong.plugins.cron.provider import CronProvider  # noqa: E402

BACKENDS = ["sqlite", "pg18", "pg15"]

#: Limits of every harness backend: a one-second cadence and a short lease, so the cluster's skip
#: grace floor (cadence + lease) stays small.
LIMITS = SchedulerLimits(page_size=32, claim_budget=16, lease_ms=4000, cadence_ms=1000)

#: The edge clock's start: minute-aligned (2023-11-14T22:13:00Z) plus 300 ms, so publishing does
#: not fall on an occurrence, as on the cluster where publishing happens at some real instant.
EDGE_T0 = 1_699_999_980_300

#: Tables whose rows the harness counts, by neutral name: (edge table, cluster table).
TABLES = {
    "runs": ("runs", "qinglong.runs"),
    "attempts": ("attempts", "qinglong.attempts"),
    "events": ("run_events", "qinglong.run_events"),
    "skips": ("schedule_skips", "qinglong.schedule_skips"),
}

_db_counter = itertools.count(1)


class OtherKindProvider(CronProvider):
    """A second, real trigger kind (cron maths under another name), for the unknown-kind tests."""

    kind = "othercron"


class BrokenOtherKindProvider(OtherKindProvider):
    """The second kind's plugin with a bug: it validates specs but cannot compute occurrences."""

    def next_after(self, spec, after_ms):
        raise RuntimeError("occurrence computation failed")

    def latest_at_or_before(self, spec, at_ms):
        raise RuntimeError("occurrence computation failed")


def providers(*, other_kind: bool = False, broken_other_kind: bool = False) -> dict:
    found = {"cron": CronProvider()}
    if other_kind:
        found["othercron"] = OtherKindProvider()
    if broken_other_kind:
        found["othercron"] = BrokenOtherKindProvider()
    return found


class CollectingSink:
    """A diagnostic sink that keeps every event, for assertions."""

    def __init__(self) -> None:
        self.events: list = []

    def emit(self, event) -> None:
        self.events.append(event)

    def codes(self) -> list[str]:
        return [e.code for e in self.events]


class Clock:
    """The edge backend's injected clock (epoch ms)."""

    def __init__(self, ms: int = EDGE_T0) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


class Harness:
    """One backend under test, opened, migrated and ready; see the module docstring."""

    name: str
    leased: bool
    backend: Any
    sink: CollectingSink

    # ---- protocol access -----------------------------------------------------------------
    @property
    def publisher(self):
        return self.backend.publisher()

    @property
    def reader(self):
        return self.backend.reader()

    async def start(self) -> None:
        self.sink = CollectingSink()
        self.backend = self.create_backend(self.sink, providers())
        await self.backend.open()
        await self.backend.migrate()
        await self.backend.check_readiness()

    async def stop(self) -> None:
        await self.backend.close()

    async def restart(self, found: dict | None = None) -> None:
        """Close the backend and open a new one on the same store (a process restart), with
        other providers if ``found``."""
        await self.backend.close()
        self.backend = self.create_backend(self.sink, found or providers())
        await self.backend.open()

    async def run_round(self, between: Callable[[], None] | None = None):
        raise NotImplementedError

    async def now_ms(self) -> int:
        raise NotImplementedError

    async def elapse(self, ms: int) -> None:
        raise NotImplementedError

    def count(self, table: str, trigger_id: str | None = None) -> int:
        raise NotImplementedError

    def drift_run(self, run_id: str) -> None:
        raise NotImplementedError

    def task_revisions_of_runs(self, trigger_id: str) -> list[int]:
        raise NotImplementedError

    def create_backend(self, sink, found: dict):
        raise NotImplementedError

    def missing_store_backend(self):
        """A backend whose store does not exist (not created, not migrated)."""
        raise NotImplementedError

    # ---- helpers built on the above ------------------------------------------------------
    def elsewhere(self, body: Callable[[Any], Awaitable[Any]], *, found: dict | None = None) -> Any:
        """Run ``body(backend)`` on a second backend of the same store, in its own thread and
        event loop, and wait for it (used between a round's decisions and its commits, and to
        run a round with other providers)."""
        result: dict = {}

        def work() -> None:
            async def main():
                other = self.create_backend(CollectingSink(), found or providers())
                await other.open()
                try:
                    return await body(other)
                finally:
                    await other.close()
            try:
                result["value"] = asyncio.run(main())
            except BaseException as exc:  # re-raised in the caller
                result["error"] = exc

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(120)
        if thread.is_alive():
            raise TimeoutError("the second backend did not finish within 120 s")
        if "error" in result:
            raise result["error"]
        return result["value"]


class SqliteHarness(Harness):
    leased = False

    def __init__(self, path: Path) -> None:
        self.name = "sqlite"
        self.path = path
        self.clock = Clock()

    def create_backend(self, sink, found: dict, path: Path | None = None):
        from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

        return create_backend(BackendContext(
            settings=EdgeSqliteSettings(path=str(path or self.path)), limits=LIMITS,
            providers=found, diagnostics=sink, clock_ms=self.clock, owner="conformance"))

    def missing_store_backend(self):
        return self.create_backend(CollectingSink(), providers(), self.path.parent / "missing.db")

    async def run_round(self, between=None):
        seam = None if between is None else (lambda conn: between())
        return await self.backend.run_round(before_commit=seam)

    async def now_ms(self) -> int:
        return self.clock.ms

    async def elapse(self, ms: int) -> None:
        self.clock.ms += ms

    def _sql(self, statement: str, params=()) -> list:
        conn = sqlite3.connect(self.path)
        try:
            with conn:
                return conn.execute(statement, params).fetchall()
        finally:
            conn.close()

    def count(self, table: str, trigger_id: str | None = None) -> int:
        name = TABLES[table][0]
        if trigger_id is None:
            return self._sql(f"SELECT count(*) FROM {name}")[0][0]
        if table in ("runs", "skips"):
            return self._sql(f"SELECT count(*) FROM {name} WHERE trigger_id = ?", (trigger_id,))[0][0]
        return self._sql(f"SELECT count(*) FROM {name} x JOIN runs r USING (run_id) "
                         "WHERE r.trigger_id = ?", (trigger_id,))[0][0]

    def task_revisions_of_runs(self, trigger_id: str) -> list[int]:
        return [r[0] for r in self._sql("SELECT task_revision FROM runs WHERE trigger_id = ? "
                                        "ORDER BY scheduled_for_ms", (trigger_id,))]

    def drift_run(self, run_id: str) -> None:
        self._sql("UPDATE runs SET queued_at_ms = queued_at_ms + 1 WHERE run_id = ?", (run_id,))


class PostgresHarness(Harness):
    leased = True

    def __init__(self, server, dbname: str) -> None:
        self.name = server.label
        self.server = server
        self.dbname = dbname

    def dsn(self, role: str, dbname: str | None = None) -> str:
        return self.server.dsn(role, ROLE_PASSWORDS[role], dbname or self.dbname)

    def settings(self, dbname: str | None = None):
        from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings

        return ClusterPostgresSettings(
            runtime_dsn=self.dsn("qinglong_runtime", dbname), admin_dsn=self.dsn("qinglong_admin", dbname),
            owner_dsn=self.dsn("qinglong_owner", dbname), pool_min_size=1, pool_max_size=4,
            pool_timeout_ms=3000)

    def create_backend(self, sink, found: dict, dbname: str | None = None):
        import time

        from qinglong.plugins.cluster_postgres import qinglong_scheduler_backends

        spec = qinglong_scheduler_backends()[0]
        return spec.create(BackendContext(
            settings=self.settings(dbname), limits=LIMITS, providers=found, diagnostics=sink,
            clock_ms=lambda: int(time.time() * 1000), owner=f"conformance-{id(sink)}"))

    def missing_store_backend(self):
        """A database that exists (a server's store is created by its operator) but has no
        schema: ``open(create=False)`` must not install one."""
        name = f"qlc_empty_{os.getpid()}_{next(_db_counter)}"
        create_database(self.server, name)
        self.extra_databases.append(name)
        return self.create_backend(CollectingSink(), providers(), name)

    extra_databases: list

    async def start(self) -> None:
        self.extra_databases = []
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        for name in self.extra_databases:
            drop_database(self.server, name)

    def _sql(self, statement: str, params=None) -> list | None:
        import psycopg

        with psycopg.connect(self.server.superuser_dsn(self.dbname), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else None

    async def run_round(self, between=None):
        if between is None:
            return await self.backend.run_round()
        from qinglong.plugins.cluster_postgres import coordinator

        real = coordinator.decide
        done: list = []

        def decide_then_edit(*args):
            decision = real(*args)
            if not done:  # after the first decision, before its commit
                done.append(True)
                between()
            return decision

        coordinator.decide = decide_then_edit
        try:
            return await self.backend.run_round()
        finally:
            coordinator.decide = real

    async def now_ms(self) -> int:
        return self._sql("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]

    async def elapse(self, ms: int) -> None:
        """Move every stored instant (each ``*_ms`` column but the grace, a duration) back by
        ``ms``, history included (Runs' occurrences and their idempotency keys, skip ranges), in
        one transaction: the store then looks exactly as if ``ms`` had passed."""
        columns = self._sql(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'qinglong' AND column_name LIKE '%\\_ms' "
            "AND column_name <> 'misfire_grace_ms' AND data_type = 'bigint' "
            "ORDER BY table_name, column_name")
        by_table: dict[str, list[str]] = {}
        for table, column in columns:
            by_table.setdefault(table, []).append(column)
        assert "scheduled_for_ms" in by_table.get("runs", []), columns
        statements = []
        for table, cols in by_table.items():
            sets = ", ".join(
                f"{c} = CASE WHEN {c} = {NO_MORE_OCCURRENCES_MS} THEN {c} ELSE {c} - {int(ms)} END"
                for c in cols)
            statements.append(f"UPDATE qinglong.{table} SET {sets}")
        # the key ends in the occurrence (ql3:<kind>:v1:<trigger>:<revision>:<ms>); it is UNIQUE,
        # so park every key first, then write the shifted one
        statements.append("UPDATE qinglong.runs SET idempotency_key = idempotency_key || ':moving'")
        statements.append("UPDATE qinglong.runs SET idempotency_key = "
                          "regexp_replace(idempotency_key, ':[0-9]+:moving$', ':' || scheduled_for_ms)")
        self._sql("BEGIN; " + "; ".join(statements) + "; COMMIT")

    def count(self, table: str, trigger_id: str | None = None) -> int:
        name = TABLES[table][1]
        if trigger_id is None:
            return self._sql(f"SELECT count(*) FROM {name}")[0][0]
        if table in ("runs", "skips"):
            return self._sql(f"SELECT count(*) FROM {name} WHERE trigger_id = %s", (trigger_id,))[0][0]
        return self._sql(f"SELECT count(*) FROM {name} x JOIN qinglong.runs r USING (run_id) "
                         "WHERE r.trigger_id = %s", (trigger_id,))[0][0]

    def task_revisions_of_runs(self, trigger_id: str) -> list[int]:
        return [r[0] for r in self._sql("SELECT task_revision FROM qinglong.runs WHERE trigger_id = %s "
                                        "ORDER BY scheduled_for_ms", (trigger_id,))]

    def drift_run(self, run_id: str) -> None:
        self._sql("UPDATE qinglong.runs SET queued_at_ms = queued_at_ms + 1 WHERE run_id = %s",
                  (run_id,))


@pytest.fixture(scope="session")
def servers(request):
    """Started on first use, one per build, each with the roles and a migrated template."""
    started: dict = {}

    def get(label: str):
        if label not in started:
            server = start_server(label)
            request.addfinalizer(server.destroy)
            create_roles(server)
            template = "qlc_migrated_template"
            create_database(server, template)
            harness = PostgresHarness(server, template)

            async def migrate():
                backend = harness.create_backend(CollectingSink(), providers())
                try:
                    await backend.migrate()
                finally:
                    await backend.close()

            asyncio.run(migrate())
            started[label] = (server, template)
        return started[label]

    return get


@pytest.fixture(params=BACKENDS)
def harness(request, servers, tmp_path):
    """A harness of each backend (opened in the test's own event loop by the runner below)."""
    if request.param == "sqlite":
        yield SqliteHarness(tmp_path / "qinglong.db")
        return
    server, template = servers(request.param)
    name = f"qlc_{os.getpid()}_{next(_db_counter)}"
    create_database(server, name, template=template)
    yield PostgresHarness(server, name)
    drop_database(server, name)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run ``async def`` tests on a fresh event loop, with the harness opened and closed in it."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}

    async def main():
        h = kwargs.get("harness")
        if h is not None:
            await h.start()
        try:
            await asyncio.wait_for(pyfuncitem.obj(**kwargs), 120)
        finally:
            if h is not None:
                await h.stop()

    asyncio.run(main())
    return True

