"""Our two conformance harnesses (the kit's ``Harness``): the SQLite backend on a real file,
moving its injected clock, and the PostgreSQL backend on a real server, moving every stored
instant (its clock cannot be moved)."""

from __future__ import annotations

import itertools
import os
import sqlite3
from pathlib import Path

from qinglong.contracts.records import NO_MORE_OCCURRENCES_MS
from qinglong.contracts.store import BackendContext
from qinglong.testing.conformance.harness import (  # noqa: F401 (re-exported to the tests)
    CLOCK_T0,
    LIMITS,
    BrokenOtherKindProvider,
    Clock,
    CollectingSink,
    Harness,
    OtherKindProvider,
    providers,
)
from tests.support.pg import ROLE_PASSWORDS, create_database, drop_database

BACKENDS = ["sqlite", "pg18", "pg15"]

#: The edge clock's start (the kit's injected clock start).
EDGE_T0 = CLOCK_T0

#: Tables whose rows the harness counts, by neutral name: (edge table, cluster table).
TABLES = {
    "runs": ("runs", "qinglong.runs"),
    "attempts": ("attempts", "qinglong.attempts"),
    "events": ("run_events", "qinglong.run_events"),
    "skips": ("schedule_skips", "qinglong.schedule_skips"),
}

_db_counter = itertools.count(1)


class SqliteHarness(Harness):
    leased = False
    #: the sealer backends created from now on are given (None: values stored as given)
    sealer = None

    def __init__(self, path: Path) -> None:
        self.name = "sqlite"
        self.path = path
        self.clock = Clock()

    def create_backend(self, sink, found: dict, path: Path | None = None):
        from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

        return create_backend(BackendContext(
            settings=EdgeSqliteSettings(path=str(path or self.path)), limits=LIMITS,
            providers=found, diagnostics=sink, clock_ms=self.clock, owner="conformance",
            sealer=self.sealer))

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
    #: the sealer backends created from now on are given (None: values stored as given)
    sealer = None

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
            clock_ms=lambda: int(time.time() * 1000), owner=f"conformance-{id(sink)}",
            sealer=self.sealer))

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
        """Move every stored instant (each ``*_ms`` column but the durations: the grace, the
        jitter, a session's lease, an Attempt's timeout) back by
        ``ms``, history included (Runs' and skipped Runs' occurrences and their idempotency keys,
        skip ranges), in
        one transaction: the store then looks exactly as if ``ms`` had passed."""
        columns = self._sql(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'qinglong' AND column_name LIKE '%\\_ms' "
            "AND column_name NOT IN ('misfire_grace_ms', 'jitter_ms', 'lease_ms', 'timeout_ms') "
            "AND data_type = 'bigint' "
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
        for table in ("runs", "run_skips"):  # a skip record holds its Run's key
            statements.append(f"UPDATE qinglong.{table} SET idempotency_key = idempotency_key || ':moving'")
            statements.append(f"UPDATE qinglong.{table} SET idempotency_key = "
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


