"""Draining: how a worker stops in order (the first SIGTERM/SIGINT).

No new claim; the running jobs may finish for ``drain_timeout_ms``; then every job left is
cancelled (``shutdown``: the watchdog sends TERM, KILL after the grace) and reported, or fenced
off by the self-fence within one session lease if the store stays away. Whatever still runs after
that is KILLed, so no job outlives the session that fences it.
"""

from __future__ import annotations

import asyncio

from qinglong.contracts.execution import CancelReason

from .core import WorkerCore
from .fence import WATCHDOG_S


async def drain(core: WorkerCore) -> None:
    """Stop claiming; let the jobs finish up to the drain timeout; then stop them (cancelled)
    and wait until every outcome is reported (or the job is no longer ours)."""
    config = core.config
    core.draining = True
    core.wake.set()
    core.emit("info", "worker.draining", f"draining {len(core.jobs)} job(s) for at most "
              f"{config.drain_timeout_ms} ms", jobs=len(core.jobs))
    await _wait_jobs(core, core.mono() + config.drain_timeout_ms / 1000)
    if core.jobs:
        core.no_spawn = True
        core.emit("warning", "worker.drain_timeout",
                  f"{len(core.jobs)} job(s) still running after the drain timeout; stopping them",
                  jobs=len(core.jobs))
        for job in core.jobs.values():
            job.request_stop(CancelReason.SHUTDOWN)
    # each job is stopped (TERM, grace, KILL) and reported, or fenced off by the self-fence
    # within one session lease if the store stays away
    await _wait_jobs(core, core.mono() + (config.kill_grace_ms + 2 * config.session_lease_ms) / 1000)
    if core.jobs:
        core.supervisor.kill_all()


async def _wait_jobs(core: WorkerCore, deadline: float) -> None:
    while core.jobs and core.mono() < deadline:
        tasks = core.supervisor.tasks()
        if not tasks:
            await asyncio.sleep(WATCHDOG_S)
            continue
        await asyncio.wait(tasks, timeout=min(1.0, max(0.0, deadline - core.mono())))
