"""Retention: logs of ended Attempts and finished Runs do not grow without bound.

One sweep, bounded in what it deletes, runs on its own timer inside the dispatcher (never inside
a scheduler round or a dispatch pass):

* the Attempt directories (log, receipt) of Attempts ended longer ago than
  ``log_retention_days`` (or ``run_retention_days`` if that is shorter: a pruned Attempt's
  directory would otherwise be left with no row naming it) are deleted, then marked deleted in the
  store, which keeps the tombstone a reader shows;
* while free space on the log filesystem is under ``min_free_bytes``, the oldest ended Attempts'
  directories go first, whatever their age;
* finished Runs older than ``run_retention_days`` are pruned in batches of ``prune_batch``.

A directory is deleted only when it is named by its Attempt's id (``<log_dir>/<attempt_id>``, the
log directory of the time it ran): a store row can never make the sweep remove anything else.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from typing import Callable

from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.execution import ExecutionStore

DAY_MS = 86_400_000
#: Logs deleted and prune batches run at most per sweep, so one sweep stays short.
MAX_LOGS_PER_SWEEP = 500
MAX_PRUNE_BATCHES_PER_SWEEP = 10


@dataclass
class RetentionReport:
    """What one sweep deleted (counters only)."""

    logs_deleted: int = 0
    logs_deleted_for_space: int = 0
    runs_pruned: int = 0
    attempts_pruned: int = 0
    events_pruned: int = 0


def free_bytes(path: str) -> int | None:
    """Bytes available to us on the filesystem holding ``path`` (None if it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class Retention:
    """Deletes old logs and prunes old Runs of one store."""

    def __init__(self, store: ExecutionStore, log_dir: str, *, log_retention_days: float,
                 run_retention_days: float, min_free_bytes: int, prune_batch: int,
                 diagnostics: DiagnosticSink, free_bytes: Callable[[str], int | None] = free_bytes) -> None:
        self._store = store
        self._log_dir = os.path.realpath(log_dir)
        self._log_ms = int(log_retention_days * DAY_MS)
        self._run_ms = int(run_retention_days * DAY_MS)
        self._min_free = min_free_bytes
        self._batch = prune_batch
        self._diagnostics = diagnostics
        self._free_bytes = free_bytes

    async def _delete(self, attempt_id: str, attempt_dir: str, now_ms: int) -> None:
        if attempt_dir and os.path.basename(os.path.normpath(attempt_dir)) == attempt_id:
            await asyncio.to_thread(shutil.rmtree, attempt_dir, True)
        elif attempt_dir:
            self._diagnostics.emit(DiagnosticEvent(
                "warning", "execution.retention_unexpected_dir",
                "an attempt directory not named by its attempt was left in place",
                {"attempt_id": attempt_id}))
        await self._store.mark_log_deleted(attempt_id, now_ms)

    async def sweep(self, now_ms: int) -> RetentionReport:
        """One bounded sweep at ``now_ms``."""
        report = RetentionReport()
        budget = MAX_LOGS_PER_SWEEP
        cutoff = now_ms - min(self._log_ms, self._run_ms)
        while budget > 0:
            rows = await self._store.finished_logs(cutoff, min(self._batch, budget))
            for attempt_id, attempt_dir in rows:
                await self._delete(attempt_id, attempt_dir, now_ms)
                report.logs_deleted += 1
            budget -= len(rows)
            if len(rows) < self._batch:
                break
        while budget > 0 and self._min_free > 0:
            free = self._free_bytes(self._log_dir)
            if free is None or free >= self._min_free:
                break
            rows = await self._store.finished_logs(now_ms + 1, 1)
            if not rows:
                break
            await self._delete(rows[0][0], rows[0][1], now_ms)
            report.logs_deleted_for_space += 1
            budget -= 1
        older_than = now_ms - self._run_ms
        for _ in range(MAX_PRUNE_BATCHES_PER_SWEEP):
            pruned = await self._store.prune(older_than, self._batch)
            report.runs_pruned += pruned.runs
            report.attempts_pruned += pruned.attempts
            report.events_pruned += pruned.events
            if pruned.runs < self._batch:
                break
            await asyncio.sleep(0)
        if report.logs_deleted or report.logs_deleted_for_space or report.runs_pruned:
            self._diagnostics.emit(DiagnosticEvent(
                "info", "execution.retention", "old logs deleted and finished runs pruned",
                {"logs_deleted": report.logs_deleted, "logs_deleted_for_space": report.logs_deleted_for_space,
                 "runs_pruned": report.runs_pruned}))
        return report
