"""What the parts of a worker share: its settings, the store's protocol, the session and its
fence schedule, the jobs (held by the job supervisor), the flags and counters, and the few acts
every part needs: report, forget a job, note the store gone or back.

Every part runs on one event loop, so nothing here needs a lock.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.errors import StoreAuthFailed, StoreFailed, StoreNotReady
from qinglong.contracts.execution import CancelReason, ExecutionSpec
from qinglong.contracts.worker import (
    OWN_STOP_REASONS,
    ClaimedAttempt,
    FenceDeadlines,
    Session,
    SessionFence,
    WorkerProtocol,
)
from qinglong.supervisor import Job, Supervisor, SupervisorStats, wall_clock_ms

from .config import WorkerConfig
from .fence import KeeperLink
from .late import StoredStop, write_own_stop

#: Between tries of a call that found the store unavailable, seconds.
RETRY_S = 0.5


@dataclass(eq=False, kw_only=True)
class WorkerJob(Job):
    """One claimed Attempt this worker holds (the supervisor's job, and what the worker adds)."""

    claimed: ClaimedAttempt
    fence: SessionFence
    spec: ExecutionSpec | None = None
    #: the timeout, moved from the store's clock onto the monotonic one
    deadline_mono: float | None = None
    cancel: CancelReason | None = None
    #: when this worker took up ``cancel`` (its signals follow), epoch ms: a receipt that ended
    #: before it is the job's own end, whatever the request says
    cancel_requested_at_ms: int | None = None
    #: no longer ours (lease lost, session fenced, self-fenced): stop it, never report it
    forgotten: bool = False
    kill_at: float | None = None
    #: when it was forgotten, epoch ms: a receipt from before then is the job's own end
    forgotten_wall_ms: int | None = None
    #: its process ended (or never started) and its outcome is being reported: no stop order
    #: applies any more; only the completion's own answer says whether the outcome stands
    finishing: bool = False
    #: its completion was accepted: nothing more to renew or report
    done: bool = False
    #: log bytes the store holds
    shipped: int = 0
    #: the store will not keep more of its log: no more shipping; it completes with what it has
    log_refused: bool = False

    def request_stop(self, reason: CancelReason) -> bool:
        """Take up a stop request (a timeout, a cancel order, the drain's shutdown) and the
        instant it was taken up; the first one stands. True when this one was taken."""
        if self.cancel is not None:
            return False
        self.cancel = reason
        self.cancel_requested_at_ms = wall_clock_ms()
        if reason in OWN_STOP_REASONS and os.path.isdir(self.attempt_dir):
            # before its signals: a restarted worker reports it with the job's outcome
            write_own_stop(self.attempt_dir, StoredStop(reason, self.cancel_requested_at_ms))
        return True


@dataclass
class WorkerStats(SupervisorStats):
    """Counters over the worker's life (safe to log): the supervisor's and the worker's own."""

    sessions: int = 0
    heartbeats: int = 0
    failed_heartbeats: int = 0
    claimed: int = 0
    completed: int = 0
    forgotten: int = 0
    self_fenced: int = 0
    completed_late: int = 0
    log_bytes_shipped: int = 0


@dataclass(eq=False)
class WorkerCore:
    """The state of one worker process (see the module docstring)."""

    config: WorkerConfig
    diagnostics: DiagnosticSink
    #: the monotonic clock every deadline of the worker is on
    mono: Callable[[], float] = time.monotonic
    protocol: WorkerProtocol | None = None
    session: Session | None = None
    #: the session the self-fence abandoned: asked once whether another process replaced it
    #: before a new one is opened
    abandoned: SessionFence | None = None
    deadlines: FenceDeadlines | None = None
    #: when the last successful heartbeat *started* (the self-fence counts from it)
    last_heartbeat_mono: float | None = None
    #: no new claim (SIGTERM, or a session another process took over)
    draining: bool = False
    #: no new spawn (the drain timed out)
    no_spawn: bool = False
    #: the loops are being cancelled
    closing: bool = False
    store_down_since: float | None = None
    #: the error that stopped the worker, raised from ``Worker.run`` after the drain
    fatal: BaseException | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stats: WorkerStats = field(default_factory=WorkerStats)
    #: the refused login last reported: each new refusal is reported once (the client raises the
    #: same one until its pause ends, whatever answers meanwhile)
    _auth_reported: BaseException | None = None
    #: the store's failure of a call last reported (reported once per failure, like a refused login)
    _failed_reported: BaseException | None = None

    def __post_init__(self) -> None:
        self.supervisor: Supervisor[WorkerJob] = Supervisor(self.diagnostics, "worker",
                                                            self.config.kill_grace_ms / 1000, self.stats,
                                                            clock=self.mono)
        self.jobs = self.supervisor.jobs
        self.keeper = KeeperLink(self.config.kill_grace_ms / 1000,
                                 lambda message: self.emit("error", "worker.keeper_failed", message))

    def emit(self, level: str, code: str, message: str, **fields: Any) -> None:
        """Report a diagnostic (fields that are None are left out)."""
        self.diagnostics.emit(DiagnosticEvent(level, code, message,
                                              {k: v for k, v in fields.items() if v is not None}))

    def request_stop(self) -> None:
        """Drain and stop."""
        self.stop.set()
        self.wake.set()

    def slots(self) -> int:
        """How many jobs this worker may hold: ``max_running``, bounded by the capacity the
        session was opened with (the registration's; the gateway refuses a claim beyond it)."""
        session = self.session
        cap = self.config.max_running
        return min(cap, session.capacity) if session is not None and session.capacity > 0 else cap

    def holds(self, job: WorkerJob) -> bool:
        """The job is ours to act on: not forgotten, and claimed under the current session."""
        return not job.forgotten and self.session is not None and self.session.fence == job.fence

    def forget(self, job: WorkerJob, *, kill_now: bool = False, kill_at: float | None = None,
               since_mono: float | None = None) -> None:
        """The job is no longer ours: TERM its group now, KILL now or at ``kill_at`` (the
        watchdog sends it); its outcome is never reported. ``since_mono``: the job stopped
        being ours earlier than now (the self-fence's TERM point, when the keeper and the
        executor's fence may already have signalled it): an end after then is not its own."""
        if job.forgotten:
            return
        job.forgotten = True
        now_ms = wall_clock_ms()
        behind_ms = 0 if since_mono is None else max(0, int((self.mono() - since_mono) * 1000))
        job.forgotten_wall_ms = now_ms - behind_ms
        self.stats.forgotten += 1
        job.kill_at = self.mono() if kill_now or kill_at is None else kill_at
        if job.handle is not None:
            self.supervisor.signal(job, signal.SIGTERM)
            if kill_now:
                self.supervisor.signal(job, signal.SIGKILL)

    def store_down(self, exc: BaseException) -> None:
        """A call found the store unavailable (reported once until it answers again); a refused
        login, or a call the store failed (a defect), is an error, reported each time it is tried
        again (the client backs off)."""
        if isinstance(exc, StoreAuthFailed):
            if self.store_down_since is None:
                self.store_down_since = self.mono()
            if self._auth_reported is not exc:
                self._auth_reported = exc
                self.emit("error", "worker.auth_failed", f"the store refuses this worker's login; retrying "
                          f"with a growing pause: {exc}", jobs=len(self.jobs))
            return
        if isinstance(exc, StoreNotReady):
            # the store is not what this version expects (a function missing or not executable
            # by the gateway): an error until an operator fixes it, sent again after a pause
            if self._failed_reported is not exc:
                self._failed_reported = exc
                self.emit("error", "worker.schema_not_ready", f"the store behind the gateway is not ready "
                          f"for a call (not what this version expects); retrying after a growing pause: {exc}",
                          jobs=len(self.jobs))
            return
        if isinstance(exc, StoreFailed):
            # a defect behind the gateway, not an outage: an error each time it is sent and
            # fails (the client holds it back for a growing pause meanwhile)
            if self._failed_reported is not exc:
                self._failed_reported = exc
                self.emit("error", "worker.store_failed", f"the store failed a call (a defect, not an "
                          f"outage); retrying after a growing pause: {exc}", jobs=len(self.jobs))
            return
        if self.store_down_since is None:
            self.store_down_since = self.mono()
            self.emit("warning", "worker.store_unavailable",
                      f"the store is unavailable; retrying: {exc}", jobs=len(self.jobs))

    def store_up(self) -> None:
        """A call was answered: report how long the store was away, if it was."""
        if self.store_down_since is not None:
            down = self.mono() - self.store_down_since
            self.store_down_since = None
            self.emit("info", "worker.store_available", f"the store answers again after {down:.1f} s",
                      down_ms=int(down * 1000))
