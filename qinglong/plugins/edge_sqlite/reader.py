"""The read side: contract records for the CLI and tests. Every listing is bounded."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import TYPE_CHECKING, Callable, Sequence

from qinglong.contracts.errors import NotFound, quoted
from qinglong.contracts.records import (
    MisfirePolicy,
    ProjectRecord,
    RunView,
    SchedulerStatus,
    ScheduleView,
    SkipView,
    TaskRecord,
    TriggerHead,
    record_from_row,
)
from qinglong.contracts.store import listing_bound, schedule_cursor

from .queries import query
from .store import SqliteStore, named_one, named_rows

if TYPE_CHECKING:  # the observation contract is imported with the stats, when first asked for
    from qinglong.contracts.observe import StoreStats


def head_from_row(row: sqlite3.Row) -> TriggerHead:
    """A :class:`TriggerHead` from a ``trigger_by_id``-shaped row, read by column name."""
    return TriggerHead(row["project_id"], row["trigger_id"], row["task_id"],
                       row["trigger_revision"], row["kind"], json.loads(row["spec_json"]),
                       MisfirePolicy(row["misfire_policy"]), row["misfire_grace_ms"],
                       bool(row["enabled"]), row["content_digest"], row["jitter_ms"])


def _schedule_view(row: sqlite3.Row) -> ScheduleView:
    return record_from_row(ScheduleView, row, spec=json.loads(row["spec_json"]),
                           enabled=bool(row["enabled"]),
                           misfire_policy=MisfirePolicy(row["misfire_policy"]))


def _schedule_page(conn: sqlite3.Connection, bound: int, cursor: tuple | None) -> list[ScheduleView]:
    """One page of schedules after ``cursor``, on the connection's thread (one hop), in one read
    transaction so both ranges see the same snapshot."""
    rows: list[sqlite3.Row] = []
    began = not conn.in_transaction
    if began:
        conn.execute("BEGIN")
    try:
        if cursor is None or cursor[0] is None:
            project, trigger = ("", "") if cursor is None else cursor[1:]
            rows = named_rows(conn, query("list_schedules_uninitialized"), {
                "after_project": project, "after_trigger": trigger, "limit": bound}, bound)
            cursor = (-(2 ** 63), "", "")
        if len(rows) < bound:
            rows += named_rows(conn, query("list_schedules_initialized"), {
                "after_next": cursor[0], "after_project": cursor[1], "after_trigger": cursor[2],
                "limit": bound - len(rows)}, bound - len(rows))
    finally:
        if began and conn.in_transaction:
            conn.execute("COMMIT")
    return [_schedule_view(row) for row in rows]


class SqliteReader:
    """Implements :class:`qinglong.contracts.store.Reader` on the SQLite store."""

    def __init__(self, store: SqliteStore, clock_ms: Callable[[], int] | None = None) -> None:
        self._store = store
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)

    async def _named_rows(self, sql: str, params: tuple, bound: int) -> list[sqlite3.Row]:
        """At most ``bound`` rows of ``sql``, read by column name (the connection is shared)."""
        return await self._store.call(named_rows, sql, params, bound)

    async def list_projects(self, limit: int | None = None) -> Sequence[ProjectRecord]:
        """Projects by id (at most ``limit``, see :func:`~qinglong.contracts.store.listing_bound`)."""
        rows = await self._named_rows(query("list_projects"), (), listing_bound(limit))
        return [record_from_row(ProjectRecord, row, active=bool(row["active"])) for row in rows]

    async def list_triggers(self, project_id: str | None = None, limit: int | None = None,
                            kind: str | None = None) -> Sequence[TriggerHead]:
        """Trigger heads, optionally of one project and of one kind, by project and id."""
        bound = listing_bound(limit)
        if kind is not None:
            rows = await self._named_rows(query("list_triggers_of_kind"), (kind, project_id), bound)
        elif project_id is None:
            rows = await self._named_rows(query("list_triggers"), (), bound)
        else:
            rows = await self._named_rows(query("list_triggers_of_project"), (project_id,), bound)
        return [head_from_row(row) for row in rows]

    async def list_schedules(self, limit: int | None = None,
                             after: ScheduleView | tuple | None = None) -> Sequence[ScheduleView]:
        """Schedules in due-scan order (uninitialized first, then the oldest cursor, then project
        and trigger id), at most ``limit`` (None: the listing bound).

        ``after``: a keyset cursor, the last schedule of the previous page (a
        :class:`ScheduleView`, or its ``(next_fire_at_ms or None, project_id, trigger_id)``): the
        page starts right after it. Each page reads the two ranges of the due index from the
        cursor on, so it costs its own rows however many schedules there are; a schedule that
        moves while a listing pages may be seen twice or not at all, as in any keyset listing."""
        bound = listing_bound(limit)
        cursor = schedule_cursor(after)
        return await self._store.call(_schedule_page, bound, cursor)

    async def task_head(self, project_id: str, task_id: str) -> TaskRecord:
        """The task's head revision with its payload and digest (what ``task show`` prints);
        :class:`~qinglong.contracts.errors.NotFound` if the project has no such task."""
        row = await self._store.call(named_one, query("task_head"), (project_id, task_id))
        if row is None or row["deleted_at_ms"] is not None:
            raise NotFound(f"task {quoted(task_id)} does not exist in project {quoted(project_id)}")
        return record_from_row(TaskRecord, row, payload=json.loads(row["payload_json"]))

    async def recent_runs(self, limit: int = 20, trigger_id: str | None = None) -> Sequence[RunView]:
        """The newest Runs first, optionally of one trigger (newest occurrence first)."""
        bound = listing_bound(limit)
        if trigger_id is None:
            rows = await self._named_rows(query("recent_runs"), (bound,), bound)
        else:
            rows = await self._named_rows(query("recent_runs_of_trigger"), (trigger_id, bound), bound)
        return [record_from_row(RunView, row) for row in rows]

    async def recent_skips(self, limit: int = 20) -> Sequence[SkipView]:
        """The newest recorded misfires first."""
        bound = listing_bound(limit)
        rows = await self._named_rows(query("recent_skips"), (bound,), bound)
        return [record_from_row(SkipView, row, policy=MisfirePolicy(row["policy"]),
                                count_exact=bool(row["count_exact"]))
                for row in rows]

    async def scheduler_status(self) -> SchedulerStatus:
        """Whether a ``qinglong run`` holds this file's owner lock now.

        ``last_round_at_ms`` is always None: the edge scheduler writes nothing per round (a
        router's flash would wear for a status line), so only the lock tells that it works.
        """
        holder = self._store.owner_pid()
        running = holder is not None
        return SchedulerStatus(running=running, last_round_at_ms=None, replicas=1 if running else 0)

    async def store_stats(self) -> StoreStats:
        """The store-derived figures of ``/metrics`` and ``qinglong status``, in one read
        transaction bounded by ``STATS_READ_TIMEOUT_MS`` (:mod:`.stats`)."""
        from .stats import read_store_stats

        return await read_store_stats(self._store, self._clock_ms)
