"""The worker runtime: one session with the store, claims up to its free slots, runs each claimed
Attempt with an executor plugin exactly as the local dispatcher does (through the same job
supervisor, :mod:`qinglong.supervisor`), ships the log, reports the outcome, and stops its own
jobs before its session lease can expire.

:class:`Worker` puts the parts together; four loops share its :class:`~.core.WorkerCore` (all on
one event loop, so the job table needs no lock):

* **heartbeat** (:mod:`.session`): opens the session, renews it, acts on its stop orders;
* **claim** (:mod:`.jobs`): claims up to the free slots; each Attempt runs as a job task;
* **watchdog** (:mod:`.fence`): local timeouts, cancel signals, the self-fence; beside it the
  fence keeper process (:mod:`.keeper`) and the executor's own fence;
* **retention** (:mod:`.retention`): old local Attempt directories deleted.

A stop drains (:mod:`.drain`), closes the session, and stops the keeper.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Awaitable, Callable, Mapping

from qinglong.contracts.diagnostics import DiagnosticSink
from qinglong.contracts.execution import Executor
from qinglong.contracts.worker import Session, WorkerProtocol

from .config import WorkerConfig
from .core import WorkerCore, WorkerStats
from .drain import drain
from .fence import SelfFence
from .jobs import Jobs
from .retention import retention_loop
from .session import Sessions


class Worker:
    """A ``qinglong worker``: see the module docstring."""

    def __init__(self, connect: Callable[[], Awaitable[WorkerProtocol]], executors: Mapping[str, Executor],
                 config: WorkerConfig, diagnostics: DiagnosticSink, *, protocol: WorkerProtocol | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``connect()`` makes the protocol (again, while the store cannot be reached at start);
        ``protocol``: one already connected."""
        self._core = WorkerCore(config, diagnostics, mono=clock, protocol=protocol)
        self._fence = SelfFence(self._core)
        self._sessions = Sessions(self._core, self._fence, connect)
        self._jobs = Jobs(self._core, self._sessions, self._fence, executors)
        self._loops: list[asyncio.Task[None]] = []

    # ---------------------------------------------------------------------------------- control

    @property
    def stats(self) -> WorkerStats:
        """Counters over the worker's life."""
        return self._core.stats

    @property
    def fatal(self) -> BaseException | None:
        """The error that stopped the worker, raised from :meth:`run` after the drain."""
        return self._core.fatal

    @property
    def session(self) -> Session | None:
        """The session held now (None before the first and after a fence)."""
        return self._core.session

    @property
    def jobs(self) -> int:
        """How many jobs the worker holds now."""
        return len(self._core.jobs)

    def request_stop(self) -> None:
        """Drain and stop (the first SIGTERM/SIGINT)."""
        self._core.request_stop()

    def kill_all(self) -> int:
        """KILL every job's process group now (a forced exit must leave no job running without a
        session that fences it); how many were signalled."""
        return self._core.supervisor.kill_all()

    async def run(self) -> int:
        """Run until :meth:`request_stop`, then drain: exit status 0."""
        core = self._core
        config = core.config
        os.makedirs(config.log_dir, mode=0o700, exist_ok=True)
        core.keeper.start()
        loop = asyncio.get_running_loop()
        self._loops = [
            loop.create_task(self._guard(self._sessions.heartbeat_loop), name="qinglong-worker-heartbeat"),
            loop.create_task(self._guard(self._jobs.claim_loop), name="qinglong-worker-claim"),
            loop.create_task(self._guard(self._fence.watchdog_loop), name="qinglong-worker-watchdog"),
            loop.create_task(self._guard(lambda: retention_loop(core)), name="qinglong-worker-retention"),
            loop.create_task(self._guard(self._jobs.report_found), name="qinglong-worker-late")]
        core.emit("info", "worker.starting", f"worker {config.worker_id} starting",
                  worker_id=config.worker_id, max_running=config.max_running,
                  log_dir=config.log_dir)
        try:
            await core.stop.wait()
            await drain(core)
        finally:
            core.closing = True
            for task in self._loops:
                task.cancel()
            for task in self._loops:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
            await self._sessions.close_session()
            if not core.jobs:
                core.keeper.close()
            # else (jobs KILLed but maybe not gone yet): the keeper, left without orders, stops
            # whatever is left of them and exits on its own
            if core.protocol is not None:
                try:
                    await core.protocol.close()
                except Exception:
                    pass
        core.emit("info", "worker.stopped", "worker stopped", **core.stats.as_fields())
        if core.fatal is not None:
            raise core.fatal
        return 0

    async def _guard(self, body: Callable[[], Awaitable[None]]) -> None:
        """Run one loop; an error it cannot handle (a store that is not ready, a refused DSN, a
        bug) stops the worker in order and is raised from :meth:`run`."""
        core = self._core
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if core.fatal is None:
                core.fatal = exc
            core.emit("error", "worker.fatal", f"the worker stops: {exc.__class__.__name__}: {exc}")
            core.request_stop()
