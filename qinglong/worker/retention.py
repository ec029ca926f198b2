"""Local retention: a worker's Attempt directories do not pile up on its disk.

The store holds the shipped log (its own retention prunes it); the local copy only serves the
shipping. A directory is deleted when it is named by an Attempt id (a UUID: nothing else in the
log directory is ever touched), no job of this worker holds it, and nothing in it changed for
``log_retention_days``. Bounded per sweep, like the dispatcher's retention.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from typing import TYPE_CHECKING, Collection

if TYPE_CHECKING:
    from .core import WorkerCore

DAY_S = 86_400.0
#: The first sweep after start, then the period, seconds.
RETENTION_FIRST_S = 5.0
RETENTION_PERIOD_S = 3600.0
MAX_DIRS_PER_SWEEP = 500
_ATTEMPT_DIR = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _last_change(path: str) -> float:
    newest = os.stat(path).st_mtime
    for name in os.listdir(path):
        try:
            newest = max(newest, os.lstat(os.path.join(path, name)).st_mtime)
        except FileNotFoundError:
            pass
    return newest


def sweep_attempt_dirs(log_dir: str, retention_days: float, held: Collection[str], *,
                       now_s: float | None = None) -> int:
    """Delete the old Attempt directories under ``log_dir`` (see the module docstring); how many."""
    cutoff = (time.time() if now_s is None else now_s) - retention_days * DAY_S
    deleted = 0
    try:
        names = sorted(os.listdir(log_dir))
    except FileNotFoundError:
        return 0
    for name in names:
        if deleted >= MAX_DIRS_PER_SWEEP:
            break
        if not _ATTEMPT_DIR.match(name) or name in held:
            continue
        path = os.path.join(log_dir, name)
        try:
            if os.path.islink(path) or not os.path.isdir(path) or _last_change(path) >= cutoff:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        deleted += 1
    return deleted


async def retention_loop(core: "WorkerCore") -> None:
    """Sweep the worker's log directory now and then (never a directory a job holds)."""
    delay = RETENTION_FIRST_S
    while not core.closing:
        await asyncio.sleep(delay)
        delay = RETENTION_PERIOD_S
        try:
            deleted = await asyncio.to_thread(sweep_attempt_dirs, core.config.log_dir,
                                              core.config.log_retention_days, set(core.jobs))
        except Exception as exc:
            core.emit("error", "worker.retention_failed", f"a retention sweep failed: "
                      f"{exc.__class__.__name__}: {exc}")
            continue
        if deleted:
            core.emit("info", "worker.retention", f"{deleted} old attempt directories deleted", deleted=deleted)
