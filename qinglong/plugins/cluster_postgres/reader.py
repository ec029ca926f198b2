"""Read-only views for the CLI and tests, on the runtime role's pool (autocommit, READ COMMITTED).

Whether a scheduler is working the store is read from ``scheduler_replicas``: every replica
records each completed round there (database clock); a replica is live while its last round is
within :func:`liveness_window_ms` of now (three cadences plus one lease: a round may take up to a
lease, and a few cadences of slack keep a busy replica from flickering).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from qinglong.contracts.errors import StoreUnavailable

from qinglong.contracts.observe import StoreStats
from qinglong.contracts.records import (
    MisfirePolicy,
    ProjectRecord,
    RunView,
    ScheduleView,
    SchedulerStatus,
    SkipView,
    TriggerHead,
    record_from_row,
)
from qinglong.contracts.store import SchedulerLimits, listing_bound, schedule_cursor

from .sql import query


def liveness_window_ms(limits: SchedulerLimits) -> int:
    """How recent a replica's last completed round must be for it to count as running."""
    return 3 * limits.cadence_ms + limits.lease_ms


class ClusterReader:
    """:class:`~qinglong.contracts.store.Reader` on PostgreSQL."""

    def __init__(self, pool_factory: Callable[[], Awaitable[Any]],
                 limits: SchedulerLimits | None = None) -> None:
        self._pool_factory = pool_factory
        self._limits = limits

    async def _fetch(self, name: str, params: dict | None = None) -> list[dict]:
        """The rows of block ``name``, read by column name."""
        pool = await self._pool_factory()
        async with pool.connection() as conn:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query(name), params or {})
                return await cur.fetchall()

    async def list_projects(self, limit: int | None = None) -> Sequence[ProjectRecord]:
        """Projects by id, at most ``limit`` (see :func:`~qinglong.contracts.store.listing_bound`)."""
        rows = await self._fetch("list_projects", {"limit": listing_bound(limit)})
        return [record_from_row(ProjectRecord, row) for row in rows]

    async def list_triggers(self, project_id: str | None = None, limit: int | None = None,
                            kind: str | None = None) -> Sequence[TriggerHead]:
        """Current trigger heads, optionally of one project and of one kind, at most ``limit``
        (None: all)."""
        rows = await self._fetch("list_triggers", {"project_id": project_id, "kind": kind,
                                                   "limit": listing_bound(limit)})
        return [record_from_row(TriggerHead, row, spec=row["spec_json"],
                                misfire_policy=MisfirePolicy(row["misfire_policy"]))
                for row in rows]

    async def list_schedules(self, limit: int | None = None,
                             after: ScheduleView | tuple | None = None) -> Sequence[ScheduleView]:
        """Every trigger's schedule (with its revision's publish time), ordered like the due scan
        (next fire time, awaiting initialization first, then project and trigger id), at most
        ``limit`` (None: the listing bound).

        ``after``: a keyset cursor, the last schedule of the previous page (a
        :class:`ScheduleView`, or its ``(next_fire_at_ms, project_id, trigger_id)``): the page
        starts right after it. Paging this way costs each page its own rows, however many
        schedules there are (no offset is skipped over, nothing is sorted); a schedule that moves
        while a listing pages may be seen twice or not at all, as in any keyset listing.
        A statement that outlives the statement timeout raises StoreUnavailable (page with a
        smaller ``limit``)."""
        bound = listing_bound(limit)
        cursor = schedule_cursor(after) or (None, None, None)
        try:
            rows = await self._fetch("list_schedules", {
                "limit": bound, "after_next": cursor[0], "after_project": cursor[1],
                "after_trigger": cursor[2]})
        except pg_errors.QueryCanceled:
            raise StoreUnavailable(
                f"listing {bound} schedules took longer than the statement timeout; "
                "ask for fewer at a time (a smaller limit) and page with the cursor") from None
        return [record_from_row(ScheduleView, row, spec=row["spec_json"],
                                misfire_policy=MisfirePolicy(row["misfire_policy"]))
                for row in rows]

    async def scheduler_status(self) -> SchedulerStatus:
        """Running while some replica completed a round within the liveness window."""
        window = liveness_window_ms(self._limits) if self._limits is not None else 0
        [status] = await self._fetch("scheduler_status", {"window_ms": window})
        live, last = status["live"], status["last_round_at_ms"]
        return SchedulerStatus(running=live > 0, last_round_at_ms=last, replicas=int(live))

    async def recent_runs(self, limit: int = 20, trigger_id: str | None = None) -> Sequence[RunView]:
        """The newest Runs first."""
        rows = await self._fetch("recent_runs", {"limit": listing_bound(limit), "trigger_id": trigger_id})
        return [record_from_row(RunView, row) for row in rows]

    async def recent_skips(self, limit: int = 20) -> Sequence[SkipView]:
        """The newest recorded misfires first."""
        rows = await self._fetch("recent_skips", {"limit": listing_bound(limit)})
        return [record_from_row(SkipView, row, policy=MisfirePolicy(row["policy"])) for row in rows]

    async def store_stats(self) -> StoreStats:
        """The store-derived figures of ``/metrics`` and ``qinglong status``: one statement in a
        READ ONLY transaction bounded by ``STATS_READ_TIMEOUT_MS``, in database time
        (:mod:`.stats`)."""
        from .stats import read_store_stats

        window = liveness_window_ms(self._limits) if self._limits is not None else 0
        return await read_store_stats(self._pool_factory, window)
