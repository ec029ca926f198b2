"""The cluster's Runs for the operator's commands: :class:`~qinglong.contracts.execution.RunControl`.

The cluster executes nothing in ``qinglong run`` (``backend.execution()`` is None: the workers
are remote), yet ``qinglong runs``, ``runs show``, ``runs cancel`` and ``logs`` work from any
machine with the runtime role. They read ``runs``, ``attempts`` and ``attempt_logs`` (the
runtime role may SELECT them) in short statements, each its own snapshot, and cancel through the
control-plane function ``qinglong.request_cancel`` (the role never UPDATEs a Run or an Attempt
itself).

A log is read from the chunks the worker shipped, at explicit offsets: the bytes come back
exactly as the job wrote them. A follower learns the Attempt ended from :meth:`log_state`, which
reads the Attempt's state and its stored bytes together: once an Attempt has ended nothing more
is appended (a completion is accepted only when its log is whole, and an Attempt the control
plane ended is fenced), so reading up to that size reads everything.
"""

from __future__ import annotations

import uuid
from typing import Any, Awaitable, Callable, Sequence

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from qinglong.contracts.errors import NotFound, quoted
from qinglong.contracts.execution.skips import MIN_SKIP_RETENTION_MS
from qinglong.contracts.execution import (
    run_state_filter,
    AttemptState,
    AttemptView,
    CancelReason,
    RunDetail,
    RunSkipView,
    RunState,
    RunSummary,
    SkipPruneReport,
    StoredLogState,
    WorkerView,
    free_slots,
    skip_prune_limit,
    worker_state,
)
from qinglong.contracts.store import listing_bound
from qinglong.contracts.tokens import pending_audit
from qinglong.contracts.worker import MAX_LOG_CHUNK_BYTES

from .sql import query

#: The most bytes one :meth:`ClusterRunControl.read_log` call returns (a reader loops).
MAX_READ_BYTES = 4 * MAX_LOG_CHUNK_BYTES


def run_uuid(run_id: str) -> str:
    """The canonical form of a run id; NotFound (never a database error) for what is not one."""
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        raise NotFound(f"run {quoted(run_id)} does not exist (run ids look like "
                       "0b6c1a5e-...; `qinglong runs` lists them)") from None


def _attempt_uuid(attempt_id: str) -> str:
    try:
        return str(uuid.UUID(str(attempt_id)))
    except ValueError:
        raise NotFound(f"attempt {quoted(attempt_id)} does not exist") from None


def _summary(row: dict, *, state: str, finished_at_ms: Any, reason: Any, attempts: int,
             exit_code: Any, duration_ms: Any) -> RunSummary:
    return RunSummary(row["run_id"], row["project_id"], row["task_id"], row["trigger_id"],
                      row["scheduled_for_ms"], row["admitted_at_ms"], RunState(state), attempts,
                      exit_code, duration_ms, finished_at_ms, reason)


def prune_skips_params(*, limit: int, before: int | None = None, retention_ms: int = 0) -> dict:
    """``control_prune_skips``'s parameters: an explicit cutoff, or ``retention_ms`` ago in
    database time (:func:`~qinglong.contracts.execution.skip_cutoff_ms`'s rule)."""
    return {"before": before, "retention_ms": int(retention_ms), "min_retention_ms": MIN_SKIP_RETENTION_MS,
            "limit": limit}


class ClusterRunControl:
    """:class:`~qinglong.contracts.execution.RunControl` on PostgreSQL, as the runtime role.

    ``run(body)`` runs ``body(conn)`` on a runtime connection (the backend's, which maps a lost
    or unreachable database to ``BackendUnavailable``)."""

    def __init__(self, run: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]) -> None:
        self._run = run

    async def _rows(self, name: str, params: dict) -> list[dict]:
        async def body(conn):
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query(name), params)
                return await cur.fetchall()

        return await self._run(body)

    async def list_runs(self, *, state: RunState | str | None = None, project_id: str | None = None,
                        task_id: str | None = None, trigger_id: str | None = None,
                        limit: int = 50) -> Sequence[RunSummary]:
        """Newest first (scheduled time, then admission), optionally of one state, project, task
        and trigger; bounded by :func:`~qinglong.contracts.store.listing_bound`."""
        state = run_state_filter(state)
        rows = await self._rows("control_list_runs", {
            "state": state.value if state is not None else None, "project_id": project_id,
            "task_id": task_id, "trigger_id": trigger_id, "limit": listing_bound(limit)})
        return [_summary(row, state=row["state"], finished_at_ms=row["finished_at_ms"],
                         reason=row["reason"], attempts=row["attempts"], exit_code=row["exit_code"],
                         duration_ms=row["duration_ms"]) for row in rows]

    async def recent_run_skips(self, limit: int = 20) -> Sequence[RunSkipView]:
        """The newest Runs skipped before they started, newest first (at most ``limit``)."""
        rows = await self._rows("control_recent_run_skips", {"limit": listing_bound(limit)})
        return [RunSkipView(row["run_id"], row["project_id"], row["task_id"], row["trigger_id"],
                            row["scheduled_for_ms"], row["reason"], row["recorded_at_ms"]) for row in rows]

    async def prune_skips(self, older_than_ms: int, limit: int) -> SkipPruneReport:
        """Delete up to ``limit`` old skip records of each kind through ``qinglong.prune_skips``
        (``PrunesSkips``; the function keeps the last hour whatever it is given)."""
        (row,) = await self._rows("control_prune_skips", prune_skips_params(
            before=int(older_than_ms), limit=skip_prune_limit(limit)))
        return SkipPruneReport(row["occurrences"], row["runs"])

    async def list_workers(self, now_ms: int, limit: int = 200,
                           worker_ids: Sequence[str] | None = None) -> Sequence[WorkerView]:
        """Every worker id's current session, live ones first (``ListsWorkers``); with
        ``worker_ids``, only those."""
        rows = await self._rows("control_list_workers", {
            "now_ms": now_ms, "limit": listing_bound(limit),
            "worker_ids": list(worker_ids) if worker_ids is not None else None})
        views = []
        for r in rows:
            state = worker_state(r["closed_at_ms"], r["lease_expires_at_ms"], now_ms)
            views.append(WorkerView(r["worker_id"], state, tuple(r["labels"]), r["capacity"], r["running"],
                                    free_slots(state, r["capacity"], r["running"]), r["opened_at_ms"],
                                    r["heartbeat_at_ms"], r["lease_expires_at_ms"], r["closed_at_ms"]))
        return views

    async def run_detail(self, run_id: str) -> RunDetail:
        """The Run and every Attempt (with the worker that held it); NotFound if unknown."""
        rows = await self._rows("control_run_detail", {"run_id": run_uuid(run_id)})
        if not rows:
            raise NotFound(f"run {quoted(run_id)} does not exist (it may have been pruned)")
        views = tuple(AttemptView(
            r["attempt_id"], r["attempt_no"], AttemptState(r["state"]), r["executor"],
            r["created_at_ms"], r["not_before_ms"], r["started_at_ms"], r["finished_at_ms"],
            r["exit_code"], r["signal"], r["duration_ms"], r["log_bytes"],
            r["log_dropped_bytes"] or 0, r["log_deleted_at_ms"] is not None, None, r["reason"],
            r["cancel_reason"], r["worker_id"]) for r in rows if r["attempt_id"] is not None)
        ended = [a for a in views if a.finished_at_ms is not None]
        last = ended[-1] if ended else None
        first = rows[0]
        summary = _summary(first, state=first["run_state"], finished_at_ms=first["run_finished_at_ms"],
                           reason=first["run_reason"], attempts=len(views),
                           exit_code=last.exit_code if last else None,
                           duration_ms=last.duration_ms if last else None)
        return RunDetail(summary, first["idempotency_key"], first["task_revision"], views,
                         first["jitter_ms"])

    async def request_cancel(self, run_id: str, reason: CancelReason | str = CancelReason.OPERATOR) -> RunState:
        """Through ``qinglong.request_cancel``: a queued or retry-waiting Run ends cancelled at
        once, a dispatching or running one gets a durable request its worker reads in its next
        heartbeat reply, a terminal one is unchanged. The Run's state after; NotFound if unknown."""
        reason = CancelReason(reason)
        audit = pending_audit()
        if audit is not None and audit.entry.action == "run.cancel" and audit.entry.result == "ok":
            # through the API: the cancel and its audit entry commit together, or neither does
            entry = audit.entry
            rows = await self._rows("control_request_cancel_audited", {
                "run_id": run_uuid(run_id), "reason": reason.value, "at": entry.at_ms, "actor": entry.actor,
                "token_id": entry.token_id, "source": entry.source, "detail": Jsonb(entry.detail)})
            if rows and rows[0]["state"] is not None:
                audit.written = True
        else:
            rows = await self._rows("control_request_cancel", {"run_id": run_uuid(run_id),
                                                               "reason": reason.value})
        state = rows[0]["state"] if rows else None
        if state is None:
            raise NotFound(f"run {quoted(run_id)} does not exist (it may have been pruned)")
        return RunState(state)

    async def log_state(self, attempt_id: str) -> StoredLogState:
        """The Attempt's state and stored log bytes, read together (see the module docstring)."""
        attempt = _attempt_uuid(attempt_id)
        rows = await self._rows("control_log_state", {"attempt_id": attempt})
        if not rows:
            raise NotFound(f"attempt {quoted(attempt_id)} does not exist (it may have been pruned)")
        row = rows[0]
        return StoredLogState(attempt, AttemptState(row["state"]), row["stored_bytes"],
                              row["log_dropped_bytes"] or 0, row["log_deleted_at_ms"] is not None)

    async def read_log(self, attempt_id: str, offset: int, size: int) -> bytes:
        """Up to ``size`` (at most :data:`MAX_READ_BYTES`) stored bytes from ``offset``, exactly
        as shipped; fewer at the end of what is stored, empty past it."""
        if offset < 0 or size < 0:
            raise ValueError("offset and size must not be negative")
        size = min(size, MAX_READ_BYTES)
        if size == 0:
            return b""
        rows = await self._rows("control_read_log", {
            "attempt_id": _attempt_uuid(attempt_id), "offset": offset, "end": offset + size,
            "max_chunk": MAX_LOG_CHUNK_BYTES})
        out = bytearray()
        position = offset
        for row in rows:
            start, data = row["offset_bytes"], bytes(row["data"])
            if start > position:
                break  # never a gap in what is stored; stop rather than invent bytes
            out += data[position - start:]
            position = start + len(data)
        return bytes(out[:size])


__all__ = ["ClusterRunControl", "MAX_READ_BYTES", "run_uuid"]
