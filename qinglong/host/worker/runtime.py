"""The worker runtime: one session with the store, claims up to its free slots, runs each claimed
Attempt with an executor plugin exactly as the local dispatcher does, ships the log, reports the
outcome, and stops its own jobs before its session lease can expire.

Four loops share one :class:`Worker` (all on one event loop, so the job table needs no lock):

* **heartbeat** every ``heartbeat_ms``: renews the session (and with it every Attempt's lease);
  the monotonic time each heartbeat *started* gives the self-fence schedule
  (:func:`~qinglong.contracts.worker.fence_deadlines`). Its reply's stop orders are acted on:
  a cancel request sets the job's cancel reason (TERM, KILL after the grace; the outcome is then
  ``cancelled``/``timed_out`` by :func:`~qinglong.contracts.execution.classify_outcome`), a lost
  lease stops the job and forgets it (its outcome is no longer ours to report). With no session
  (the start, after a fence) it opens one; a new session is a new generation.
* **claim** while there are free slots, a session and time before the self-fence's TERM: one
  fresh token per free slot; each claimed Attempt gets a job task.
* **watchdog** (every 100 ms): local timeouts (the deadline the store returned from ``started``,
  moved onto the monotonic clock), cancel signals with their grace, and the self-fence: at
  ``term_at`` with no successful heartbeat since, the session is abandoned, every job gets TERM
  and is forgotten, KILL follows at ``kill_at``, and by ``fenced_at`` none may remain. The next
  session is a new generation, which fences the old one's Attempts for good.
* **retention**: local Attempt directories older than ``log_retention_days`` are deleted.

Beside them runs the **fence keeper** (:mod:`.keeper`, a process of its own): it is given each
session's schedule after every successful heartbeat and each job's process group, and applies
the schedule itself when the worker cannot (killed -9: at once; frozen: at TERM and KILL points
it was last given), so a job never outlives the lease that covers it. An executor that can fence
a job itself (:class:`~qinglong.contracts.execution.FencedExecutor`: the ``local_process``
wrapper kills its own group) is given the KILL point at the spawn and after every heartbeat, the
last line of defence when the worker and its keeper are both killed.

A job task: parse the spec (a refusal ends the Attempt ``failed``, never started), call
``started`` *before* spawning and spawn only if it was accepted and the self-fence's TERM is still
ahead, watch the process (shipping its log about every second), then ship the rest of the log
and ``complete`` (repeated after a lost reply; after ``log_incomplete`` the missing bytes are
shipped first). ``LeaseFenced`` at any step stops the job if it is alive and forgets it.

Secrets: tokens, the DSN and env values never reach a diagnostic; messages name runs and attempts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.errors import QinglongError, StoreUnavailable, UserError
from qinglong.contracts.execution import (
    CONTRACT_LIMITS,
    AttemptOutcome,
    AttemptState,
    CancelReason,
    ExecutionSpec,
    Executor,
    FencedExecutor,
    ProcessHandle,
    ProcessState,
    StartError,
    StartRequest,
    classify_outcome,
    parse_execution_spec,
)
from qinglong.contracts.worker import (
    LEASE_LOST,
    SESSION_REPLACED,
    BadWorkerCall,
    ClaimedAttempt,
    CompletionResult,
    FenceDeadlines,
    LeaseFenced,
    Session,
    SessionFence,
    SessionFenced,
    WorkerProtocol,
    fence_deadlines,
    new_lease_token,
)

from .config import WorkerConfig
from .logship import ship_log
from .retention import sweep_attempt_dirs

#: The watchdog's period, seconds (signals and the self-fence land within it).
WATCHDOG_S = 0.1
#: Between tries of a call that found the store unavailable, seconds.
RETRY_S = 0.5
#: How often a running job's log is shipped, seconds (at most every heartbeat).
SHIP_S = 1.0
#: Retention's first sweep after start, then its period, seconds.
RETENTION_FIRST_S = 5.0
RETENTION_PERIOD_S = 3600.0
#: A reason the store keeps is cut to this many characters.
MAX_REASON_CHARS = 1000
#: Tries of a call the store called malformed before the job is given up (a bug, reported).
MAX_BAD_CALLS = 3
NO_COMMAND = "the task has no command"


@dataclass
class _Job:
    """One claimed Attempt this worker holds."""

    claimed: ClaimedAttempt
    fence: SessionFence
    spec: ExecutionSpec | None = None
    executor: Executor | None = None
    attempt_dir: str = ""
    handle: ProcessHandle | None = None
    deadline_mono: float | None = None
    cancel: CancelReason | None = None
    term_sent_at: float | None = None
    kill_sent: bool = False
    #: no longer ours (lease lost, session fenced, self-fenced): stop it, never report it
    forgotten: bool = False
    kill_at: float | None = None
    #: its process ended (or never started) and its outcome is being reported: no stop order
    #: applies any more; only the completion's own answer says whether the outcome stands
    finishing: bool = False
    #: its completion was accepted: nothing more to renew or report
    done: bool = False
    shipped: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def attempt_id(self) -> str:
        return self.claimed.attempt_id

    @property
    def run_id(self) -> str:
        return self.claimed.run_id


@dataclass
class WorkerStats:
    """Counters over the worker's life (safe to log)."""

    sessions: int = 0
    heartbeats: int = 0
    failed_heartbeats: int = 0
    claimed: int = 0
    started: int = 0
    completed: int = 0
    start_failed: int = 0
    forgotten: int = 0
    self_fenced: int = 0
    log_bytes_shipped: int = 0

    def as_fields(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class KeeperLink:
    """The worker's end of its fence keeper (:mod:`.keeper`): started at once, restarted (with
    every order resent) if it ever dies. Orders are a line each on a pipe; a write that cannot be
    made at once (a keeper that stopped reading) counts as a dead keeper."""

    def __init__(self, grace_s: float, report: Callable[[str], None]) -> None:
        self._grace_s = grace_s
        self._report = report
        self._proc: subprocess.Popen | None = None
        self._deadlines: dict[int, str] = {}
        self._jobs: dict[int, str] = {}

    def start(self) -> None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keeper.py")
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", path, f"{self._grace_s:.3f}"],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except OSError as exc:
            self._proc = None
            self._report(f"the fence keeper could not be started: {exc}")
            return
        assert self._proc.stdin is not None
        os.set_blocking(self._proc.stdin.fileno(), False)
        for line in [*self._deadlines.values(), *self._jobs.values()]:
            if not self._write(line):
                return

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _write(self, line: str) -> bool:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        try:
            os.write(proc.stdin.fileno(), (line + "\n").encode("ascii"))
            return True
        except OSError:
            return False

    def _send(self, line: str) -> None:
        if self._write(line):
            return
        self._report("the fence keeper stopped taking orders; starting it again")
        self._stop_process()
        self.start()

    def deadline(self, generation: int, d: FenceDeadlines) -> None:
        line = f"deadline {generation} {d.term_at:.6f} {d.kill_at:.6f}"
        self._deadlines[generation] = line
        for old in [g for g in self._deadlines if g < generation - 1]:
            del self._deadlines[old]
        self._send(line)

    def job(self, generation: int, handle: ProcessHandle) -> None:
        line = f"job {generation} {handle.pgid} {handle.pid} {handle.start_ticks}"
        self._jobs[handle.pgid] = line
        self._send(line)

    def done(self, handle: ProcessHandle) -> None:
        if self._jobs.pop(handle.pgid, None) is not None:
            self._send(f"done {handle.pgid}")

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        if proc.poll() is None and not self._jobs:
            proc.kill()
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """The worker stops in order: the keeper exits without signalling anything."""
        if self._proc is not None and self._write("exit"):
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._stop_process()


class Worker:
    """A ``qinglong worker``: see the module docstring."""

    def __init__(self, connect: Callable[[], Awaitable[WorkerProtocol]], executors: Mapping[str, Executor],
                 config: WorkerConfig, diagnostics: DiagnosticSink, *, protocol: WorkerProtocol | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``connect()`` makes the protocol (again, while the store cannot be reached at start);
        ``protocol``: one already connected."""
        self._connect = connect
        self._executors = dict(executors)
        self._config = config
        self._diagnostics = diagnostics
        self._mono = clock
        self._protocol: WorkerProtocol | None = protocol
        self._session: Session | None = None
        self._deadlines: FenceDeadlines | None = None
        self._last_heartbeat_mono: float | None = None
        self._jobs: dict[str, _Job] = {}
        self._draining = False
        self._no_spawn = False
        self._closing = False
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._store_down_since: float | None = None
        self._loops: list[asyncio.Task[None]] = []
        self.stats = WorkerStats()
        #: the error that stopped the worker, raised from run() after the drain
        self.fatal: BaseException | None = None
        self._keeper = KeeperLink(config.kill_grace_ms / 1000,
                                  lambda message: self._emit("error", "worker.keeper_failed", message))

    # ---------------------------------------------------------------------------------- control

    @property
    def session(self) -> Session | None:
        return self._session

    @property
    def jobs(self) -> int:
        return len(self._jobs)

    def request_stop(self) -> None:
        """Drain and stop (the first SIGTERM/SIGINT)."""
        self._stop.set()
        self._wake.set()

    def kill_all(self) -> int:
        """KILL every job's process group now (a forced exit must leave no job running without a
        session that fences it); how many were signalled."""
        sent = 0
        for job in list(self._jobs.values()):
            if job.handle is not None and self._send(job, signal.SIGKILL):
                sent += 1
        return sent

    async def run(self) -> int:
        """Run until :meth:`request_stop`, then drain: exit status 0."""
        os.makedirs(self._config.log_dir, mode=0o700, exist_ok=True)
        self._keeper.start()
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._guard(self._heartbeat_loop), name="qinglong-worker-heartbeat"),
                       loop.create_task(self._guard(self._claim_loop), name="qinglong-worker-claim"),
                       loop.create_task(self._guard(self._watchdog_loop), name="qinglong-worker-watchdog"),
                       loop.create_task(self._guard(self._retention_loop), name="qinglong-worker-retention")]
        self._emit("info", "worker.starting", f"worker {self._config.worker_id} starting",
                   worker_id=self._config.worker_id, max_running=self._config.max_running,
                   labels=",".join(self._config.labels), log_dir=self._config.log_dir)
        try:
            await self._stop.wait()
            await self._drain()
        finally:
            self._closing = True
            for task in self._loops:
                task.cancel()
            for task in self._loops:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
            await self._close_session()
            if not self._jobs:
                self._keeper.close()
            # else (jobs KILLed but maybe not gone yet): the keeper, left without orders, stops
            # whatever is left of them and exits on its own
            if self._protocol is not None:
                try:
                    await self._protocol.close()
                except Exception:
                    pass
        self._emit("info", "worker.stopped", "worker stopped", **self.stats.as_fields())
        if self.fatal is not None:
            raise self.fatal
        return 0

    async def _guard(self, body: Callable[[], Awaitable[None]]) -> None:
        """Run one loop; an error it cannot handle (a store that is not ready, a refused DSN, a
        bug) stops the worker in order and is raised from :meth:`run`."""
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.fatal is None:
                self.fatal = exc
            self._emit("error", "worker.fatal", f"the worker stops: {exc.__class__.__name__}: {exc}")
            self.request_stop()

    # ---------------------------------------------------------------------------------- heartbeat

    async def _protocol_ready(self) -> WorkerProtocol | None:
        if self._protocol is not None:
            return self._protocol
        try:
            self._protocol = await self._connect()
        except StoreUnavailable as exc:
            self._store_down(exc)
            return None
        return self._protocol

    async def _heartbeat_loop(self) -> None:
        while not self._closing:
            protocol = await self._protocol_ready()
            if protocol is None:
                await asyncio.sleep(RETRY_S)
                continue
            if self._session is None:
                if self._draining:
                    await asyncio.sleep(RETRY_S)  # nothing left to hold a session for
                    continue
                if not await self._open_session(protocol):
                    await asyncio.sleep(RETRY_S)
                continue
            due = (self._last_heartbeat_mono or self._mono()) + self._config.heartbeat_ms / 1000
            await asyncio.sleep(max(0.0, due - self._mono()))
            if self._session is None or self._closing:
                continue
            if not await self._heartbeat(protocol, self._session):
                # the store did not answer: try again soon, the self-fence runs on its own clock
                await asyncio.sleep(min(RETRY_S, self._config.heartbeat_ms / 1000))

    async def _open_session(self, protocol: WorkerProtocol) -> bool:
        config = self._config
        started = self._mono()
        try:
            session = await protocol.open_session(config.worker_id, config.labels, config.max_running,
                                                  config.session_lease_ms)
        except StoreUnavailable as exc:
            self._store_down(exc)
            return False
        self._store_up()
        self._session = session
        self._set_deadlines(started)
        self.stats.sessions += 1
        self._emit("info", "worker.session_opened",
                   f"session of worker {config.worker_id} opened (generation {session.fence.generation})",
                   worker_id=config.worker_id, generation=session.fence.generation,
                   session_id=session.fence.session_id, lease_ms=session.lease_ms)
        self._wake.set()
        return True

    def _set_deadlines(self, started_mono: float) -> None:
        config = self._config
        self._last_heartbeat_mono = started_mono
        self._deadlines = fence_deadlines(started_mono, config.session_lease_ms, config.self_fence_margin_ms,
                                          config.kill_grace_ms)
        if self._session is not None:
            self._keeper.deadline(self._session.fence.generation, self._deadlines)
            self._renew_job_fences(self._session.fence, self._deadlines)

    def _renew_job_fences(self, fence: SessionFence, d: FenceDeadlines) -> None:
        """Move the executor's own fence of every running job of the session to the new KILL
        point: the job's group dies there even if this worker and its keeper are both gone."""
        for job in self._jobs.values():
            if (job.handle is None or job.forgotten or job.finishing or job.fence != fence
                    or not isinstance(job.executor, FencedExecutor)):
                continue
            try:
                job.executor.renew_fence(job.attempt_dir, d.kill_at)
            except Exception as exc:
                self._emit("error", "worker.fence_renew_failed",
                           f"run {job.run_id}: its executor's fence could not be renewed (the job is killed "
                           f"at the last one): {exc.__class__.__name__}: {exc}", run_id=job.run_id,
                           attempt_id=job.attempt_id)

    async def _heartbeat(self, protocol: WorkerProtocol, session: Session) -> bool:
        # the store renews every active Attempt of the session; the ones named here are the
        # ones a stop order can still concern (a process that may be running)
        running = [j.attempt_id for j in self._jobs.values()
                   if not j.forgotten and not j.finishing and j.fence == session.fence]
        started = self._mono()
        try:
            reply = await protocol.heartbeat(session.fence, running)
        except SessionFenced as exc:
            self._session_lost(session.fence, exc)
            return True
        except StoreUnavailable as exc:
            self.stats.failed_heartbeats += 1
            self._store_down(exc)
            return False
        if self._session is not session:
            return True  # self-fenced while the call was out: the reply renews nothing of ours
        self._store_up()
        self.stats.heartbeats += 1
        self._set_deadlines(started)
        self._emit("debug", "worker.heartbeat", "session renewed", generation=session.fence.generation,
                   heartbeat_started_mono=started, lease_expires_at_ms=reply.lease_expires_at_ms,
                   db_now_ms=reply.db_now_ms, running=len(running))
        for order in reply.stop:
            job = self._jobs.get(order.attempt_id)
            if job is None or job.forgotten or job.finishing:
                continue
            if order.reason == LEASE_LOST:
                self._emit("warning", "worker.lease_lost",
                           f"run {job.run_id}: its attempt is no longer leased to this worker; stopping it",
                           run_id=job.run_id, attempt_id=job.attempt_id)
                self._forget(job, kill_now=True)
                continue
            try:
                reason = CancelReason(order.reason)
            except ValueError:
                reason = CancelReason.OPERATOR
            if job.cancel is None:
                job.cancel = reason
                self._emit("info", "worker.cancel_requested",
                           f"run {job.run_id}: cancel requested ({reason.value}); stopping its process group",
                           run_id=job.run_id, attempt_id=job.attempt_id, reason=reason.value)
        return True

    def _session_lost(self, fence: SessionFence, refusal: SessionFenced) -> None:
        """The store refused the session: every job of it is stopped at once and forgotten. A
        session that expired or was closed is opened again (a new generation); one that another
        process replaced (a second worker with this id) is not: opening again would fence that
        live worker, which would do the same in turn, so this process stops instead."""
        if self._session is None or self._session.fence != fence:
            return
        self._session = None
        self._deadlines = None
        replaced = refusal.reason == SESSION_REPLACED
        for job in list(self._jobs.values()):
            if job.fence == fence:
                self._forget(job, kill_now=True)
        if replaced:
            self._emit("error", "worker.replaced",
                       f"another process opened a newer session of worker id {fence.worker_id!r}; this one "
                       "stopped its jobs and stops (give every worker its own worker_id)",
                       generation=fence.generation)
            if self.fatal is None:
                self.fatal = UserError(f"worker id {fence.worker_id!r} was taken over by a newer session of "
                                       "another process: give every running worker its own [worker] worker_id")
            self._draining = True
            self.request_stop()
            return
        self._emit("warning", "worker.session_fenced",
                   f"the store refused this worker's session ({refusal.message}); stopping its jobs and "
                   "opening a new one", generation=fence.generation, why=refusal.reason)

    def _forget(self, job: _Job, *, kill_now: bool = False, kill_at: float | None = None) -> None:
        if job.forgotten:
            return
        job.forgotten = True
        self.stats.forgotten += 1
        job.kill_at = self._mono() if kill_now or kill_at is None else kill_at
        if job.handle is not None:
            self._signal(job, signal.SIGTERM)
            if kill_now:
                self._signal(job, signal.SIGKILL)

    def _store_down(self, exc: BaseException) -> None:
        if self._store_down_since is None:
            self._store_down_since = self._mono()
            self._emit("warning", "worker.store_unavailable",
                       f"the store is unavailable; retrying: {exc}", jobs=len(self._jobs))

    def _store_up(self) -> None:
        if self._store_down_since is not None:
            down = self._mono() - self._store_down_since
            self._store_down_since = None
            self._emit("info", "worker.store_available", f"the store answers again after {down:.1f} s",
                       down_ms=int(down * 1000))

    # ---------------------------------------------------------------------------------- claiming

    def _may_claim(self) -> bool:
        d = self._deadlines
        return (not self._draining and self._session is not None and d is not None
                and self._mono() < d.term_at)

    async def _claim_loop(self) -> None:
        while not self._closing and not self._draining:
            self._wake.clear()
            more = False
            free = self._config.max_running - len(self._jobs)
            session = self._session
            if free > 0 and self._may_claim() and self._protocol is not None and session is not None:
                try:
                    claimed = await self._protocol.claim(session.fence, [new_lease_token() for _ in range(free)])
                except SessionFenced as exc:
                    self._session_lost(session.fence, exc)
                    continue
                except (StoreUnavailable, BadWorkerCall) as exc:
                    self._store_down(exc)
                    claimed = []
                for attempt in claimed:
                    self._adopt_claim(attempt, session.fence)
                more = bool(claimed) and len(claimed) == free
            if more:
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self._config.poll_ms / 1000)
            except asyncio.TimeoutError:
                pass

    def _adopt_claim(self, attempt: ClaimedAttempt, fence: SessionFence) -> None:
        job = _Job(attempt, fence)
        self._jobs[attempt.attempt_id] = job
        self.stats.claimed += 1
        self._emit("info", "worker.claimed", f"run {attempt.run_id}: attempt {attempt.attempt_no} claimed",
                   run_id=attempt.run_id, attempt_id=attempt.attempt_id, attempt_no=attempt.attempt_no,
                   project_id=attempt.project_id, task_id=attempt.task_id, lease_version=attempt.lease.lease_version)
        job.task = asyncio.get_running_loop().create_task(self._run_job(job), name=f"qinglong-job-{attempt.attempt_id}")

    # ---------------------------------------------------------------------------------- a job

    def _holds(self, job: _Job) -> bool:
        """The job is ours to act on: not forgotten, and claimed under the current session."""
        return not job.forgotten and self._session is not None and self._session.fence == job.fence

    def _may_spawn(self, job: _Job) -> bool:
        d = self._deadlines
        return self._holds(job) and not self._no_spawn and d is not None and self._mono() < d.term_at

    async def _run_job(self, job: _Job) -> None:
        try:
            if await self._start_job(job):
                await self._watch_job(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._emit("error", "worker.job_failed", f"run {job.run_id}: handling its attempt failed: "
                       f"{exc.__class__.__name__}: {exc}", run_id=job.run_id, attempt_id=job.attempt_id)
            self._forget(job, kill_now=True)
            await self._wait_gone(job)
        finally:
            if self._jobs.get(job.attempt_id) is job:
                del self._jobs[job.attempt_id]
            if job.handle is not None and not self._process_alive(job):
                self._keeper.done(job.handle)
            self._wake.set()

    async def _retrying(self, job: _Job, call: Callable[[], Awaitable[Any]]) -> Any:
        """``await call()`` until it answers; None when the job is no longer ours (a fence refused
        it, or the session was lost meanwhile). A lost reply is repeated as it was."""
        bad_calls = 0
        while self._holds(job):
            try:
                result = await call()
                self._store_up()
                return result
            except LeaseFenced as exc:
                self._emit("warning", "worker.lease_fenced", f"run {job.run_id}: the store refused its lease "
                           f"({exc.message}); stopping it", run_id=job.run_id, attempt_id=job.attempt_id)
                self._forget(job, kill_now=True)
                return None
            except SessionFenced as exc:
                self._session_lost(job.fence, exc)
                return None
            except StoreUnavailable as exc:
                self._store_down(exc)
            except BadWorkerCall as exc:
                bad_calls += 1
                self._emit("error", "worker.bad_call", f"run {job.run_id}: the store refused a call as "
                           f"malformed: {exc}", run_id=job.run_id, attempt_id=job.attempt_id)
                if bad_calls >= MAX_BAD_CALLS:
                    self._forget(job, kill_now=True)
                    return None
            await asyncio.sleep(RETRY_S)
        return None

    async def _start_job(self, job: _Job) -> bool:
        """Started, then spawned: True when the process runs."""
        attempt = job.claimed
        try:
            spec = parse_execution_spec(attempt.task_id, attempt.payload, CONTRACT_LIMITS)
        except UserError as err:
            await self._finish(job, self._failure(str(err)), started=False)
            return False
        if spec is None:
            await self._finish(job, self._failure(NO_COMMAND), started=False)
            return False
        executor = self._executors.get(spec.executor)
        if executor is None:
            loaded = ", ".join(sorted(self._executors)) or "none"
            await self._finish(job, self._failure(f"no loaded plugin provides executor {spec.executor!r} on "
                                                  f"worker {self._config.worker_id} (loaded executors: {loaded})"),
                               started=False)
            return False
        job.spec, job.executor = spec, executor
        job.attempt_dir = os.path.join(self._config.log_dir, attempt.attempt_id)
        protocol = self._protocol
        assert protocol is not None
        if not self._may_spawn(job):
            self._forget(job)
            return False
        called_at = [0.0]

        async def started():
            called_at[0] = self._mono()
            return await protocol.started(job.fence, attempt.lease)

        reply = await self._retrying(job, started)
        if reply is None:
            return False
        # the deadline in the store's clock, moved onto ours from the call's start (never later)
        job.deadline_mono = called_at[0] + (reply.deadline_ms - reply.db_now_ms) / 1000
        if job.cancel is not None:
            await self._finish(job, classify_outcome(None, job.cancel), started=False)
            return False
        if not self._may_spawn(job):
            if self._no_spawn and self._holds(job):
                await self._finish(job, classify_outcome(None, CancelReason.SHUTDOWN), started=False)
            else:
                self._forget(job)
            return False
        # an executor that can fence the job itself gets the KILL point: the job's group dies there
        # unless a heartbeat moves it later, whatever happens to this worker and its keeper
        d = self._deadlines
        fence_at = d.kill_at if d is not None and isinstance(executor, FencedExecutor) else None
        request = StartRequest(attempt.run_id, attempt.attempt_id, attempt.attempt_no, attempt.scheduled_for_ms,
                               spec, job.attempt_dir, fence_deadline_mono=fence_at)
        try:
            job.handle = await executor.start(request)
        except StartError as err:
            self.stats.start_failed += 1
            self._emit("warning", "worker.start_failed", f"run {attempt.run_id} could not start: {err}",
                       run_id=attempt.run_id, attempt_id=attempt.attempt_id)
            await self._finish(job, self._failure(str(err) or err.__class__.__name__), started=False)
            return False
        except Exception as exc:
            # whether a process exists is unknown: look at the directory
            state = executor.probe(job.attempt_dir, None)
            handle = executor.find_handle(job.attempt_dir) if state is ProcessState.ALIVE else None
            if handle is None and state is not ProcessState.ENDED:
                await self._finish(job, self._failure(f"the executor failed while starting: "
                                                      f"{exc.__class__.__name__}: {exc}"), started=False)
                return False
            job.handle = handle
        if job.handle is not None:
            self._keeper.job(job.fence.generation, job.handle)
        self.stats.started += 1
        self._emit("info", "worker.job_started", f"run {attempt.run_id}: attempt {attempt.attempt_no} started",
                   run_id=attempt.run_id, attempt_id=attempt.attempt_id,
                   pid=job.handle.pid if job.handle else None)
        if job.forgotten:  # fenced while it was being spawned: stop it at once
            self._signal(job, signal.SIGTERM)
            self._signal(job, signal.SIGKILL)
        return True

    def _failure(self, reason: str) -> AttemptOutcome:
        return AttemptOutcome(AttemptState.FAILED, ended_at_ms=time.time_ns() // 1_000_000,
                              reason=reason[:MAX_REASON_CHARS])

    async def _watch_job(self, job: _Job) -> None:
        assert job.executor is not None
        if job.handle is not None:
            waiter = asyncio.ensure_future(job.executor.wait(job.attempt_dir, job.handle))
            try:
                ship_every = min(SHIP_S, self._config.heartbeat_ms / 1000)
                while True:
                    done, _ = await asyncio.wait({waiter}, timeout=ship_every)
                    if done:
                        waiter.result()
                        break
                    if self._holds(job):
                        await self._ship(job, final=False)
            finally:
                if not waiter.done():
                    waiter.cancel()
        receipt = job.executor.read_receipt(job.attempt_dir)
        if job.forgotten:
            self._emit("info", "worker.job_forgotten", f"run {job.run_id}: its process ended; its outcome is "
                       "not this worker's to report", run_id=job.run_id, attempt_id=job.attempt_id)
            return
        await self._finish(job, classify_outcome(receipt, job.cancel), started=True)

    async def _ship(self, job: _Job, *, final: bool) -> str:
        """Ship what the local log holds beyond what the store has: ``"ok"``; ``"retry"`` when the
        store did not answer (shipped again later); ``"refused"`` when it refused a chunk (its
        count of stored bytes, which ``complete`` returns, tells where to go on from)."""
        protocol = self._protocol
        if protocol is None:
            return "retry"
        lease = job.claimed.lease

        async def append(offset: int, data: bytes) -> int:
            stored = await protocol.append_log(job.fence, lease, offset, data)
            self.stats.log_bytes_shipped += len(data)
            return stored

        try:
            job.shipped = await ship_log(job.attempt_dir, job.shipped, append)
            return "ok"
        except LeaseFenced as exc:
            self._emit("warning", "worker.lease_fenced", f"run {job.run_id}: the store refused its lease "
                       f"({exc.message}); stopping it", run_id=job.run_id, attempt_id=job.attempt_id)
            self._forget(job, kill_now=True)
        except SessionFenced as exc:
            self._session_lost(job.fence, exc)
        except StoreUnavailable as exc:
            self._store_down(exc)
        except (BadWorkerCall, RuntimeError, OSError) as exc:
            self._emit("error" if final else "warning", "worker.log_ship_failed",
                       f"run {job.run_id}: shipping its log failed: {exc}", run_id=job.run_id,
                       attempt_id=job.attempt_id)
            return "refused"
        return "retry"

    async def _finish(self, job: _Job, outcome: AttemptOutcome, *, started: bool) -> None:
        """Ship the whole log, then complete; repeated until the store answers (or the job is no
        longer ours). ``log_incomplete`` ships the missing bytes from what the store holds."""
        protocol = self._protocol
        assert protocol is not None
        job.finishing = True
        if outcome.reason is not None and len(outcome.reason) > MAX_REASON_CHARS:
            outcome = dataclasses.replace(outcome, reason=outcome.reason[:MAX_REASON_CHARS])
        refusals = 0
        while self._holds(job):
            shipped = await self._ship(job, final=True) if started else "ok"
            if shipped == "retry":
                await asyncio.sleep(RETRY_S)
                continue
            if shipped == "refused":
                refusals += 1
                if refusals > MAX_BAD_CALLS:
                    self._emit("error", "worker.log_refused", f"run {job.run_id}: the store keeps refusing its "
                               "log; the attempt is left to its lease", run_id=job.run_id, attempt_id=job.attempt_id)
                    self._forget(job, kill_now=True)
                    return
            final = dataclasses.replace(outcome, log_bytes=job.shipped if started else 0)
            reply = await self._retrying(job, lambda: protocol.complete(job.fence, job.claimed.lease, final,
                                                                        started=started))
            if reply is None:
                return
            if reply.result is CompletionResult.LOG_INCOMPLETE:
                self._emit("warning", "worker.log_incomplete",
                           f"run {job.run_id}: the store holds {reply.log_bytes_stored} of {final.log_bytes} log "
                           "bytes; shipping the rest", run_id=job.run_id, attempt_id=job.attempt_id)
                job.shipped = min(job.shipped, reply.log_bytes_stored)
                continue
            job.done = True
            self.stats.completed += 1
            self._emit("info", "worker.completed",
                       f"run {job.run_id}: attempt {job.claimed.attempt_no} {final.state.value}"
                       + (f" ({final.reason})" if final.reason else ""),
                       run_id=job.run_id, attempt_id=job.attempt_id, state=final.state.value,
                       run_state=reply.run_state.value, exit_code=final.exit_code, signal=final.signal,
                       log_bytes=final.log_bytes, result=reply.result.value)
            return

    def _process_alive(self, job: _Job) -> bool:
        if job.executor is None or job.handle is None:
            return False
        try:
            return job.executor.probe(job.attempt_dir, job.handle) is ProcessState.ALIVE
        except Exception:
            return True

    async def _wait_gone(self, job: _Job) -> None:
        if job.executor is not None and job.handle is not None:
            try:
                await job.executor.wait(job.attempt_dir, job.handle)
            except Exception:
                pass

    # ---------------------------------------------------------------------------------- watchdog

    async def _watchdog_loop(self) -> None:
        fenced_at: float | None = None
        while not self._closing:
            now = self._mono()
            d = self._deadlines
            if self._session is not None and d is not None and now >= d.term_at:
                self._self_fence(d)
                fenced_at = d.fenced_at
            for job in list(self._jobs.values()):
                if job.handle is None:
                    continue
                if job.forgotten:
                    self._signal(job, signal.SIGTERM)
                    if job.kill_at is not None and now >= job.kill_at:
                        self._signal(job, signal.SIGKILL)
                    continue
                if job.cancel is None and job.deadline_mono is not None and now >= job.deadline_mono:
                    job.cancel = CancelReason.TIMEOUT
                    self._emit("warning", "worker.timeout", f"run {job.run_id}: the timeout expired; "
                               "stopping its process group", run_id=job.run_id, attempt_id=job.attempt_id)
                if job.cancel is not None:
                    self._signal(job, signal.SIGTERM)
                    if job.term_sent_at is not None and now - job.term_sent_at >= self._config.kill_grace_ms / 1000:
                        self._signal(job, signal.SIGKILL)
            if fenced_at is not None and now >= fenced_at:
                fenced_at = None
                alive = [j for j in self._jobs.values() if j.forgotten and j.handle is not None
                         and j.executor is not None
                         and j.executor.probe(j.attempt_dir, j.handle) is ProcessState.ALIVE]
                if alive:
                    self._emit("error", "worker.fence_breached",
                               f"{len(alive)} job(s) still alive at the self-fence deadline despite KILL",
                               jobs=len(alive))
            await asyncio.sleep(WATCHDOG_S)

    def _self_fence(self, d: FenceDeadlines) -> None:
        """No heartbeat succeeded in time: abandon the session, TERM every job, KILL at kill_at."""
        session = self._session
        assert session is not None
        self._session = None
        self._deadlines = None
        self.stats.self_fenced += 1
        jobs = [j for j in self._jobs.values() if j.fence == session.fence]
        self._emit("warning", "worker.self_fenced",
                   f"no heartbeat succeeded within the session lease's safe part; stopping {len(jobs)} job(s) "
                   "before the lease can expire, then opening a new session",
                   generation=session.fence.generation, jobs=len(jobs),
                   last_heartbeat_started_mono=self._last_heartbeat_mono,
                   term_at_mono=d.term_at, kill_at_mono=d.kill_at, fenced_at_mono=d.fenced_at)
        for job in jobs:
            self._forget(job, kill_at=d.kill_at)

    def _signal(self, job: _Job, signum: int) -> None:
        """TERM once, KILL once."""
        if signum == signal.SIGTERM:
            if job.term_sent_at is not None:
                return
            job.term_sent_at = self._mono()
        else:
            if job.kill_sent:
                return
            job.kill_sent = True
            if job.term_sent_at is None:
                job.term_sent_at = self._mono()
        self._send(job, signum)

    def _send(self, job: _Job, signum: int) -> bool:
        if job.executor is None or job.handle is None:
            return False
        try:
            return job.executor.signal(job.handle, signum)
        except Exception as exc:
            self._emit("error", "worker.signal_failed", f"run {job.run_id}: signalling its process failed: "
                       f"{exc.__class__.__name__}: {exc}", run_id=job.run_id)
            return False

    # ---------------------------------------------------------------------------------- stopping

    async def _drain(self) -> None:
        """Stop claiming; let the jobs finish up to the drain timeout; then stop them (cancelled)
        and wait until every outcome is reported (or the job is no longer ours)."""
        self._draining = True
        self._wake.set()
        self._emit("info", "worker.draining", f"draining {len(self._jobs)} job(s) for at most "
                   f"{self._config.drain_timeout_ms} ms", jobs=len(self._jobs))
        deadline = self._mono() + self._config.drain_timeout_ms / 1000
        await self._wait_jobs(deadline)
        if self._jobs:
            self._no_spawn = True
            self._emit("warning", "worker.drain_timeout",
                       f"{len(self._jobs)} job(s) still running after the drain timeout; stopping them",
                       jobs=len(self._jobs))
            for job in self._jobs.values():
                if job.cancel is None:
                    job.cancel = CancelReason.SHUTDOWN
        # each job is stopped (TERM, grace, KILL) and reported, or fenced off by the self-fence
        # within one session lease if the store stays away
        await self._wait_jobs(self._mono() + (self._config.kill_grace_ms + 2 * self._config.session_lease_ms) / 1000)
        if self._jobs:
            self.kill_all()

    async def _wait_jobs(self, deadline: float) -> None:
        while self._jobs and self._mono() < deadline:
            tasks = [j.task for j in self._jobs.values() if j.task is not None]
            if not tasks:
                await asyncio.sleep(WATCHDOG_S)
                continue
            await asyncio.wait(tasks, timeout=min(1.0, max(0.0, deadline - self._mono())))

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is None or self._protocol is None:
            return
        for _ in range(3):
            try:
                await self._protocol.close_session(session.fence)
                self._emit("info", "worker.session_closed",
                           f"session of worker {self._config.worker_id} closed", generation=session.fence.generation)
                return
            except SessionFenced:
                return  # already fenced: nothing of it remains to close
            except (StoreUnavailable, QinglongError) as exc:
                self._store_down(exc)
                await asyncio.sleep(RETRY_S)
        self._emit("warning", "worker.session_not_closed",
                   "the session could not be closed; the store ends it when its lease expires",
                   generation=session.fence.generation)

    # ---------------------------------------------------------------------------------- retention

    async def _retention_loop(self) -> None:
        delay = RETENTION_FIRST_S
        while not self._closing:
            await asyncio.sleep(delay)
            delay = RETENTION_PERIOD_S
            try:
                deleted = await asyncio.to_thread(sweep_attempt_dirs, self._config.log_dir,
                                                  self._config.log_retention_days, set(self._jobs))
            except Exception as exc:
                self._emit("error", "worker.retention_failed", f"a retention sweep failed: "
                           f"{exc.__class__.__name__}: {exc}")
                continue
            if deleted:
                self._emit("info", "worker.retention", f"{deleted} old attempt directories deleted",
                           deleted=deleted)

    def _emit(self, level: str, code: str, message: str, **fields: Any) -> None:
        self._diagnostics.emit(DiagnosticEvent(level, code, message,
                                               {k: v for k, v in fields.items() if v is not None}))
