"""Read-only views for the CLI and tests, on the runtime role's pool (autocommit, READ COMMITTED).

Whether a scheduler is working the store is read from ``scheduler_replicas``: every replica
records each completed round there (database clock); a replica is live while its last round is
within :func:`liveness_window_ms` of now (three cadences plus one lease: a round may take up to a
lease, and a few cadences of slack keep a busy replica from flickering).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

from qinglong.contracts.records import (
    MisfirePolicy,
    ProjectRecord,
    RunView,
    ScheduleView,
    SchedulerStatus,
    SkipView,
    TriggerHead,
)
from qinglong.contracts.store import SchedulerLimits

from .sql import query


def liveness_window_ms(limits: SchedulerLimits) -> int:
    """How recent a replica's last completed round must be for it to count as running."""
    return 3 * limits.cadence_ms + limits.lease_ms


def _limit(limit: int | None) -> int | None:
    return None if limit is None else max(0, int(limit))


class ClusterReader:
    """:class:`~qinglong.contracts.store.Reader` on PostgreSQL."""

    def __init__(self, pool_factory: Callable[[], Awaitable[Any]],
                 limits: SchedulerLimits | None = None) -> None:
        self._pool_factory = pool_factory
        self._limits = limits

    async def _fetch(self, name: str, params: dict | None = None) -> list[tuple]:
        pool = await self._pool_factory()
        async with pool.connection() as conn:
            cur = await conn.execute(query(name), params or {})
            return await cur.fetchall()

    async def list_projects(self) -> Sequence[ProjectRecord]:
        """All projects."""
        return [ProjectRecord(*row) for row in await self._fetch("list_projects")]

    async def list_triggers(self, project_id: str | None = None,
                            limit: int | None = None) -> Sequence[TriggerHead]:
        """Current trigger heads, optionally of one project, at most ``limit`` (None: all)."""
        rows = await self._fetch("list_triggers", {"project_id": project_id, "limit": _limit(limit)})
        return [TriggerHead(p, t, k, r, kind, spec, MisfirePolicy(pol), grace, en, dig)
                for p, t, k, r, kind, spec, pol, grace, en, dig in rows]

    async def list_schedules(self, limit: int | None = None) -> Sequence[ScheduleView]:
        """Every trigger's schedule (with its revision's publish time), ordered like the due scan,
        at most ``limit`` (None: all)."""
        rows = await self._fetch("list_schedules", {"limit": _limit(limit)})
        return [ScheduleView(p, t, r, kind, spec, en, MisfirePolicy(pol), nxt, last, published)
                for p, t, r, kind, spec, en, pol, nxt, last, published in rows]

    async def scheduler_status(self) -> SchedulerStatus:
        """Running while some replica completed a round within the liveness window."""
        window = liveness_window_ms(self._limits) if self._limits is not None else 0
        [(live, last)] = await self._fetch("scheduler_status", {"window_ms": window})
        return SchedulerStatus(running=live > 0, last_round_at_ms=last, replicas=int(live))

    async def recent_runs(self, limit: int = 20, trigger_id: str | None = None) -> Sequence[RunView]:
        """The newest Runs first."""
        rows = await self._fetch("recent_runs", {"limit": max(0, int(limit)), "trigger_id": trigger_id})
        return [RunView(*row) for row in rows]

    async def recent_skips(self, limit: int = 20) -> Sequence[SkipView]:
        """The newest recorded misfires first."""
        rows = await self._fetch("recent_skips", {"limit": max(0, int(limit))})
        return [SkipView(p, t, r, MisfirePolicy(pol), first, last, count, exact, at)
                for p, t, r, pol, first, last, count, exact, at in rows]
