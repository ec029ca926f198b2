"""Helpers of the edge_sqlite tests: an injected clock, contexts on real SQLite files, the cron
provider, definitions and table dumps."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from qinglong.contracts.records import TriggerDefinition
from qinglong.contracts.store import BackendContext, SchedulerLimits
from qinglong.plugins.cron.provider import CronProvider
from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

#: A minute-aligned instant (2023-11-14T22:13:00Z) so cron occurrences fall on round numbers.
T0 = 1_699_999_980_000


class Clock:
    """A clock the test moves by hand (epoch ms)."""

    def __init__(self, ms: int = T0) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


class Diagnostics:
    """Collects diagnostic events."""

    def __init__(self) -> None:
        self.events = []

    def emit(self, event) -> None:
        self.events.append(event)


def make_context(path: Path, clock, page_size: int = 32, diagnostics=None, **settings) -> BackendContext:
    """A BackendContext as the host would build it, for a database at ``path``."""
    return BackendContext(
        settings=EdgeSqliteSettings(path=str(path), **settings),
        limits=SchedulerLimits(page_size=page_size, claim_budget=16, lease_ms=30_000, cadence_ms=1000),
        providers={"cron": CronProvider()},
        diagnostics=diagnostics if diagnostics is not None else Diagnostics(),
        clock_ms=clock,
        owner="test",
    )


async def open_backend(path: Path, clock, page_size: int = 32, migrate: bool = True, **kwargs):
    """Create, open and (by default) migrate a backend; the caller closes it."""
    backend = create_backend(make_context(path, clock, page_size, **kwargs))
    await backend.open()
    if migrate:
        await backend.migrate()
        await backend.check_readiness()
    return backend


def cron(trigger_id: str, expression: str = "* * * * *", *, project: str = "p1", task: str = "t1",
         policy: str = "fire_once", grace_ms: int = 60_000, timezone: str = "UTC",
         enabled: bool = True) -> TriggerDefinition:
    """A cron trigger definition."""
    return TriggerDefinition(project, trigger_id, task, "cron",
                             {"expression": expression, "timezone": timezone}, policy, grace_ms,
                             enabled)


async def seed(backend, project: str = "p1", task: str = "t1") -> None:
    """One project with one task."""
    publisher = backend.publisher()
    await publisher.create_project(project)
    await publisher.put_task(project, task, {"command": ["echo", "hello"]})


def dump(path: Path) -> dict:
    """Every row of every table, sorted, read with the stdlib driver (tests only)."""
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
    finally:
        conn.close()


def query(path: Path, sql: str, params=()) -> list:
    """Rows of one read query with the stdlib driver."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()




def vm_steps(conn: sqlite3.Connection, statement: str, params=(), *, every: int = 1) -> tuple[list, int]:
    """The rows of ``statement`` and the virtual-machine steps it took: work counted, not time
    (counted ``every`` steps, so a multiple of it)."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, every)
    try:
        rows = conn.execute(statement, params).fetchall()
    finally:
        conn.set_progress_handler(None, 0)
    return rows, count[0] * every
