"""Retention: logs of ended Attempts and finished Runs do not grow without bound.

One sweep, bounded in what it deletes, runs on its own timer inside the dispatcher (never inside
a scheduler round or a dispatch pass):

* the Attempt directories (log, receipt) of Attempts ended longer ago than
  ``log_retention_days`` (or ``run_retention_days`` if that is shorter: a pruned Attempt's
  directory would otherwise be left with no row naming it) are deleted, then marked deleted in the
  store, which keeps the tombstone a reader shows;
* while free space on the log filesystem is under its floor, the oldest ended Attempts'
  directories go first, whatever their age, but never one of the newest ``keep_per_task`` of its
  task, and only directories under the log directory (one elsewhere frees nothing here). The
  floor is ``min_free_bytes`` where it fits, else ``min_free_fraction`` of the filesystem's size
  (:func:`space_floor`): a router's 16 MiB ``/tmp`` does not lose every log at once;
* finished Runs older than ``run_retention_days`` are pruned in batches of ``prune_batch``;
* skip records older than ``skip_retention_days`` (never younger than the status window:
  :func:`~qinglong.contracts.execution.skip_cutoff_ms`) are deleted in batches of ``prune_batch``.

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
from qinglong.contracts.execution import ExecutionStore, PrunesSkips, skip_cutoff_ms

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
    skips_pruned: int = 0


def space_floor(min_free_bytes: int, fs_size: int | None, fraction: float) -> int:
    """The free space retention keeps on a log filesystem of ``fs_size`` bytes: ``min_free_bytes``
    when it is at most ``fraction`` of the filesystem, else that fraction (an unknown size keeps
    the configured floor)."""
    if fs_size is None or fs_size <= 0:
        return max(min_free_bytes, 0)
    return max(0, min(min_free_bytes, int(fs_size * fraction)))


def fs_size_bytes(path: str) -> int | None:
    """The size of the filesystem holding ``path`` (None if it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


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
                 skip_retention_days: float = 7,
                 diagnostics: DiagnosticSink, free_bytes: Callable[[str], int | None] = free_bytes,
                 keep_per_task: int = 3, min_free_fraction: float = 0.1,
                 fs_size: Callable[[str], int | None] = fs_size_bytes) -> None:
        self._store = store
        # the directory as the dispatcher names Attempt directories (what the store holds), and
        # as it resolves (what is checked before a deletion)
        self._log_dir_named = os.path.abspath(log_dir)
        self._log_dir = os.path.realpath(log_dir)
        self._keep = max(int(keep_per_task), 0)
        self._fraction = min_free_fraction
        self._fs_size = fs_size
        self._log_ms = int(log_retention_days * DAY_MS)
        self._run_ms = int(run_retention_days * DAY_MS)
        self._skip_ms = int(skip_retention_days * DAY_MS)
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

    def floor(self) -> int:
        """The free space this sweep keeps on the log filesystem (see :func:`space_floor`)."""
        return space_floor(self._min_free, self._fs_size(self._log_dir), self._fraction)

    def _under_log_dir(self, attempt_dir: str) -> bool:
        resolved = os.path.realpath(attempt_dir)
        return os.path.dirname(resolved) == self._log_dir

    def check_floor(self) -> None:
        """At start: warn when ``min_free_bytes`` does not fit the log filesystem (the floor is
        scaled down to its fraction) or free space is already under the floor."""
        size = self._fs_size(self._log_dir)
        free = self._free_bytes(self._log_dir)
        floor = self.floor()
        fields = {"log_dir": self._log_dir, "fs_size_bytes": size, "free_bytes": free,
                  "min_free_bytes": self._min_free, "floor_bytes": floor, "keep_per_task": self._keep}
        if size is not None and floor < self._min_free:
            self._diagnostics.emit(DiagnosticEvent(
                "warning", "execution.log_floor_scaled",
                f"the log filesystem holding {self._log_dir} is {size // 1024} KiB: min_free_bytes "
                f"({self._min_free // 1024} KiB) does not fit, so retention keeps {floor // 1024} KiB "
                f"free ({self._fraction:g} of it) and never deletes the newest {self._keep} logs of a task",
                fields))
        if free is not None and free < floor:
            self._diagnostics.emit(DiagnosticEvent(
                "warning", "execution.log_space_low",
                f"the log filesystem holding {self._log_dir} has {free // 1024} KiB free, under the "
                f"{floor // 1024} KiB retention keeps: older logs will be deleted first (the newest "
                f"{self._keep} of each task stay)", fields))

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
        floor = self.floor()
        while budget > 0 and floor > 0:
            free = self._free_bytes(self._log_dir)
            if free is None or free >= floor:
                break
            rows = [row for row in await self._store.logs_for_space(self._keep, self._log_dir_named, 1)
                    if self._under_log_dir(row[1])]
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
        if isinstance(self._store, PrunesSkips):
            skips_before = skip_cutoff_ms(now_ms, self._skip_ms)
            for _ in range(MAX_PRUNE_BATCHES_PER_SWEEP):
                skipped = await self._store.prune_skips(skips_before, self._batch)
                report.skips_pruned += skipped.occurrences + skipped.runs
                if max(skipped.occurrences, skipped.runs) < self._batch:
                    break
                await asyncio.sleep(0)
        if report.logs_deleted or report.logs_deleted_for_space or report.runs_pruned or report.skips_pruned:
            self._diagnostics.emit(DiagnosticEvent(
                "info", "execution.retention", "old logs deleted, finished runs and skip records pruned",
                {"logs_deleted": report.logs_deleted, "logs_deleted_for_space": report.logs_deleted_for_space,
                 "runs_pruned": report.runs_pruned, "skips_pruned": report.skips_pruned}))
        return report
