"""The read side: contract records for the CLI and tests. Every listing is bounded."""

from __future__ import annotations

import json
import sqlite3
from typing import Sequence

from qinglong.contracts.records import (
    MisfirePolicy,
    ProjectRecord,
    RunView,
    SchedulerStatus,
    ScheduleView,
    SkipView,
    TriggerHead,
)

from .publisher import head_from_row
from .queries import q
from .store import SqliteStore, named_rows, probe_owner_lock

#: Upper bound of a listing when the caller gives none: a reader never loads a whole table.
DEFAULT_LISTING_BOUND = 10_000


def _bounded(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LISTING_BOUND
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
    return min(limit, DEFAULT_LISTING_BOUND)


class SqliteReader:
    """Implements :class:`qinglong.contracts.store.Reader` on the SQLite store."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def _rows(self, sql: str, params: tuple, bound: int) -> list[tuple]:
        def read(conn: sqlite3.Connection) -> list[tuple]:
            return conn.execute(sql, params).fetchmany(bound)
        return await self._store.call(read)

    async def _named_rows(self, sql: str, params: tuple, bound: int) -> list[sqlite3.Row]:
        """Like :meth:`_rows`, read by column name (on this cursor only: the connection is shared)."""
        return await self._store.call(named_rows, sql, params, bound)

    async def list_projects(self, limit: int | None = None) -> Sequence[ProjectRecord]:
        """Projects by id (at most ``limit``, default :data:`DEFAULT_LISTING_BOUND`)."""
        bound = _bounded(limit)
        rows = await self._rows(q("list_projects"), (), bound)
        return [ProjectRecord(pid, name, bool(active)) for pid, name, active in rows]

    async def list_triggers(self, project_id: str | None = None,
                            limit: int | None = None) -> Sequence[TriggerHead]:
        """Trigger heads, optionally of one project, by project and id."""
        bound = _bounded(limit)
        if project_id is None:
            rows = await self._named_rows(q("list_triggers"), (), bound)
        else:
            rows = await self._named_rows(q("list_triggers_of_project"), (project_id,), bound)
        return [head_from_row(row) for row in rows]

    async def list_schedules(self, limit: int | None = None) -> Sequence[ScheduleView]:
        """Schedules in due-scan order (uninitialised first, then the oldest cursor)."""
        bound = _bounded(limit)
        rows = await self._rows(q("list_schedules"), (bound,), bound)
        return [
            ScheduleView(pid, tid, rev, kind, json.loads(spec), bool(enabled), MisfirePolicy(policy),
                         nxt, last, published)
            for pid, tid, rev, kind, spec, enabled, policy, nxt, last, published in rows
        ]

    async def recent_runs(self, limit: int = 20, trigger_id: str | None = None) -> Sequence[RunView]:
        """The newest Runs first, optionally of one trigger (newest occurrence first)."""
        bound = _bounded(limit)
        if trigger_id is None:
            rows = await self._rows(q("recent_runs"), (bound,), bound)
        else:
            rows = await self._rows(q("recent_runs_of_trigger"), (trigger_id, bound), bound)
        return [RunView(*row) for row in rows]

    async def recent_skips(self, limit: int = 20) -> Sequence[SkipView]:
        """The newest recorded misfires first."""
        bound = _bounded(limit)
        rows = await self._rows(q("recent_skips"), (bound,), bound)
        return [
            SkipView(pid, tid, rev, MisfirePolicy(policy), first, last, count, bool(exact), at)
            for pid, tid, rev, policy, first, last, count, exact, at in rows
        ]

    async def scheduler_status(self) -> SchedulerStatus:
        """Whether a ``qinglong run`` holds this file's owner lock now.

        ``last_round_at_ms`` is always None: the edge scheduler writes nothing per round (a
        router's flash would wear for a status line), so only the lock tells that it works.
        """
        holder = probe_owner_lock(str(self._store.path))
        running = holder is not None
        return SchedulerStatus(running=running, last_round_at_ms=None, replicas=1 if running else 0)
