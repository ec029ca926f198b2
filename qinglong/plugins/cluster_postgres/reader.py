"""Read-only views for the CLI and tests, on the runtime role's pool (autocommit, READ COMMITTED)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

from qinglong.contracts.records import (
    MisfirePolicy,
    ProjectRecord,
    RunView,
    ScheduleView,
    SkipView,
    TriggerHead,
)

from .sql import query


class ClusterReader:
    """:class:`~qinglong.contracts.store.Reader` on PostgreSQL."""

    def __init__(self, pool_factory: Callable[[], Awaitable[Any]]) -> None:
        self._pool_factory = pool_factory

    async def _fetch(self, name: str, params: dict | None = None) -> list[tuple]:
        pool = await self._pool_factory()
        async with pool.connection() as conn:
            cur = await conn.execute(query(name), params or {})
            return await cur.fetchall()

    async def list_projects(self) -> Sequence[ProjectRecord]:
        """All projects."""
        return [ProjectRecord(*row) for row in await self._fetch("list_projects")]

    async def list_triggers(self, project_id: str | None = None) -> Sequence[TriggerHead]:
        """Current trigger heads, optionally of one project."""
        rows = await self._fetch("list_triggers", {"project_id": project_id})
        return [TriggerHead(p, t, k, r, kind, spec, MisfirePolicy(pol), grace, en, dig)
                for p, t, k, r, kind, spec, pol, grace, en, dig in rows]

    async def list_schedules(self) -> Sequence[ScheduleView]:
        """Every trigger's schedule, ordered like the due scan."""
        rows = await self._fetch("list_schedules")
        return [ScheduleView(p, t, r, kind, spec, en, MisfirePolicy(pol), nxt, last)
                for p, t, r, kind, spec, en, pol, nxt, last in rows]

    async def recent_runs(self, limit: int = 20, trigger_id: str | None = None) -> Sequence[RunView]:
        """The newest Runs first."""
        rows = await self._fetch("recent_runs", {"limit": max(0, int(limit)), "trigger_id": trigger_id})
        return [RunView(*row) for row in rows]

    async def recent_skips(self, limit: int = 20) -> Sequence[SkipView]:
        """The newest recorded misfires first."""
        rows = await self._fetch("recent_skips", {"limit": max(0, int(limit))})
        return [SkipView(p, t, r, MisfirePolicy(pol), first, last, count, exact, at)
                for p, t, r, pol, first, last, count, exact, at in rows]
