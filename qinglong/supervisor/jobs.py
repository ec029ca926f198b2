"""Watching a job's process: its verified handle, TERM then KILL, its end classified.

A job's process runs detached in its own process group (the executor's doing), so whoever
watches it can die and another can take over: everything here works from the executor, the
Attempt directory and the handle alone. A signal goes only through
:meth:`~qinglong.contracts.execution.Executor.signal`, which verifies the handle (boot id and
start time) before it signals the group, so a pid reused by another process is never hit.

Escalation: TERM once, then KILL once the grace passed (or at a point the owner chooses: a
worker's self-fence); a KILL with no TERM before it starts the escalation too. The owner decides
*when* a job must stop (a deadline, a cancel request, a lost lease); the supervisor sends, counts
and reports.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Mapping, TypeVar

from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.execution import (
    AttemptOutcome,
    AttemptState,
    CancelReason,
    Executor,
    ProcessHandle,
    ProcessState,
    StartError,
    StartRequest,
    classify_outcome,
)
from qinglong.contracts.reasons import reason

#: Why a Run whose task revision names no command ends ``failed`` without a start.
NO_COMMAND = reason("spec_no_command")


def wall_clock_ms() -> int:
    """Now in integer epoch milliseconds: the time an outcome or a store call carries."""
    return time.time_ns() // 1_000_000


def start_failure(reason: str, ended_at_ms: int) -> AttemptOutcome:
    """The outcome of an Attempt that ends without a process: ``failed``, saying why."""
    return AttemptOutcome(AttemptState.FAILED, ended_at_ms=ended_at_ms, reason=reason)


def missing_executor(name: str, executors: Mapping[str, Any], where: str = "") -> str:
    """Why a job cannot start: no loaded plugin provides the executor its spec names."""
    loaded = ", ".join(sorted(executors)) or "none"
    return f"no loaded plugin provides executor {name!r}{where} (loaded executors: {loaded})"


def ended_outcome(executor: Executor, attempt_dir: str, cancel: CancelReason | str | None, *,
                  lost_reason: str | None = None, requested_at_ms: int | None = None) -> AttemptOutcome:
    """How an Attempt whose process ended ended, from the evidence only: the receipt its waiter
    left and the durable cancel request (written at ``requested_at_ms``, when known on the
    receipt's clock), through :func:`~qinglong.contracts.execution.classify_outcome` (never
    ``succeeded`` without a receipt; ``lost`` with ``lost_reason`` when neither explains the end)."""
    receipt = executor.read_receipt(attempt_dir)
    if lost_reason is None:
        return classify_outcome(receipt, cancel, requested_at_ms=requested_at_ms)
    return classify_outcome(receipt, cancel, lost_reason=lost_reason, requested_at_ms=requested_at_ms)


@dataclass(eq=False)
class Job:
    """A process watched through its verified handle (an owner's job type extends it)."""

    run_id: str
    attempt_id: str
    executor: Executor | None = None
    attempt_dir: str = ""
    #: None until the process exists (or when a failed start left none to find)
    handle: ProcessHandle | None = None
    #: the owner's task that watches the job (see :meth:`Supervisor.track`)
    task: asyncio.Task[None] | None = None
    #: monotonic seconds: when the escalation began (the TERM, or a KILL sent without one)
    term_sent_at: float | None = None
    kill_sent: bool = False
    #: set when a signal could not be sent: the recorded handle fails verification and the
    #: process holding the Attempt's lock could not be found either (the owner records it)
    unverified: str | None = None


@dataclass
class SupervisorStats:
    """Counters over an owner's life (safe to log); an owner's stats extend them."""

    #: processes started (a handle returned by the executor)
    started: int = 0
    #: starts the executor refused (:class:`~qinglong.contracts.execution.StartError`), and the
    #: other Attempts an owner ended without a process (it counts those itself)
    start_failed: int = 0

    def as_fields(self) -> dict[str, Any]:
        """Every counter by name (what a stop diagnostic carries)."""
        return dataclasses.asdict(self)


J = TypeVar("J", bound=Job)


class Supervisor(Generic[J]):
    """The jobs one owner watches, by Attempt id, and what is done to their processes.

    ``code_prefix`` names the owner in diagnostics (``execution``, ``worker``);
    ``report_unsent``: report (at ``info``) a signal the handle refused because it no longer
    names a live process (the dispatcher signals only jobs it believes run; a worker signals
    every job it forgets, ended or not, and does not report them)."""

    def __init__(self, diagnostics: DiagnosticSink, code_prefix: str, kill_grace_s: float, stats: SupervisorStats,
                 *, clock: Callable[[], float] = time.monotonic, report_unsent: bool = False) -> None:
        self.jobs: dict[str, J] = {}
        self.stats = stats
        self.kill_grace_s = kill_grace_s
        self._diagnostics = diagnostics
        self._prefix = code_prefix
        self._clock = clock
        self._report_unsent = report_unsent

    # ---------------------------------------------------------------------------------- the table

    def track(self, job: J, body: Callable[[J], Awaitable[None]], ended: Callable[[J], None]) -> None:
        """Hold ``job`` and run ``body(job)`` as its task; when the body returns (or raises) the
        job leaves the table (unless another took its place) and ``ended(job)`` is called."""
        self.jobs[job.attempt_id] = job

        async def watched() -> None:
            try:
                await body(job)
            finally:
                if self.jobs.get(job.attempt_id) is job:
                    del self.jobs[job.attempt_id]
                ended(job)

        job.task = asyncio.get_running_loop().create_task(watched(), name=f"qinglong-job-{job.attempt_id}")

    def tasks(self) -> list[asyncio.Task[None]]:
        """The watching tasks of the jobs held now."""
        return [job.task for job in self.jobs.values() if job.task is not None]

    # ---------------------------------------------------------------------------------- a process

    async def spawn(self, job: J, executor: Executor, request: StartRequest) -> ProcessHandle:
        """Start the job's process with ``executor``: its handle (also set on the job).
        :class:`~qinglong.contracts.execution.StartError` is counted and raised; any other error
        is raised as it is (whether a process exists is then unknown: the owner looks)."""
        job.executor = executor
        try:
            job.handle = await executor.start(request)
        except StartError:
            self.stats.start_failed += 1
            raise
        self.stats.started += 1
        return job.handle

    def alive(self, job: J) -> bool:
        """The job's process still runs (a probe that fails counts as alive: never assume gone)."""
        if job.executor is None or job.handle is None:
            return False
        try:
            return job.executor.probe(job.attempt_dir, job.handle) is ProcessState.ALIVE
        except Exception:
            return True

    async def wait_for_exit(self, job: J, *, every_s: float | None = None,
                            meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
        """Until the job's process (and its waiter) ended; while it runs, ``await meanwhile()``
        every ``every_s`` seconds (a worker ships the log). An error of the wait is raised."""
        if job.executor is None or job.handle is None:
            return
        if meanwhile is None or every_s is None:
            await job.executor.wait(job.attempt_dir, job.handle)
            return
        waiter = asyncio.ensure_future(job.executor.wait(job.attempt_dir, job.handle))
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=every_s)
                if done:
                    waiter.result()
                    return
                await meanwhile()
        finally:
            if not waiter.done():
                waiter.cancel()

    async def wait_gone(self, job: J) -> None:
        """Until the job's process ended, whatever the wait raises."""
        try:
            await self.wait_for_exit(job)
        except Exception:
            pass

    def outcome(self, job: J, cancel: CancelReason | str | None, requested_at_ms: int | None = None) -> AttemptOutcome:
        """How the job's ended process ended (:func:`ended_outcome`)."""
        assert job.executor is not None
        return ended_outcome(job.executor, job.attempt_dir, cancel, requested_at_ms=requested_at_ms)

    def draining(self, job: J) -> bool:
        """The job's own process has exited and its executor drains what it left within a bound
        (an executor that cannot tell: never). A timeout is then not signalled: the job is done,
        and what it left is the orphans policy's to handle."""
        draining = getattr(job.executor, "draining", None)
        if draining is None:
            return False
        try:
            return bool(draining(job.attempt_dir))
        except Exception:
            return False

    # ---------------------------------------------------------------------------------- signals

    def signal(self, job: J, signum: int) -> bool:
        """TERM once, KILL once: a repeated order sends nothing. True when a signal went."""
        if signum == signal.SIGTERM:
            if job.term_sent_at is not None:
                return False
            job.term_sent_at = self._clock()
        else:
            if job.kill_sent:
                return False
            job.kill_sent = True
            if job.term_sent_at is None:
                job.term_sent_at = self._clock()
        return self.send(job, signum)

    def escalate(self, job: J, grace_s: float | None = None) -> None:
        """A job that must stop: TERM the first time, KILL once ``grace_s`` (default the kill
        grace) passed since."""
        grace = self.kill_grace_s if grace_s is None else grace_s
        if job.term_sent_at is None:
            self.signal(job, signal.SIGTERM)
        elif not job.kill_sent and self._clock() - job.term_sent_at >= grace:
            self.signal(job, signal.SIGKILL)

    def kill_due_in(self, job: J) -> float | None:
        """Seconds until :meth:`escalate` would KILL the job (0 when due); None when no KILL
        is pending."""
        if job.term_sent_at is None or job.kill_sent:
            return None
        return max(0.0, job.term_sent_at + self.kill_grace_s - self._clock())

    def kill_all(self) -> int:
        """KILL every held job's process group now, whatever was sent before (a forced exit);
        how many were signalled."""
        return sum(1 for job in list(self.jobs.values())
                   if job.handle is not None and self.send(job, signal.SIGKILL))

    def send(self, job: J, signum: int) -> bool:
        """Send ``signum`` to the job's group through the executor's verified handle; a failure
        is reported, never raised. True when it was sent."""
        if job.executor is None or job.handle is None:
            return False
        try:
            sent = job.executor.signal(job.handle, signum)
            if not sent and self.alive(job):
                sent = self._through_lock_holder(job, signum)
        except Exception as exc:
            self._emit("error", "signal_failed", f"run {job.run_id}: signalling its process failed: "
                       f"{exc.__class__.__name__}: {exc}", run_id=job.run_id)
            return False
        if not sent and job.unverified is not None:
            return False
        if not sent and self._report_unsent:
            self._emit("info", "signal_not_sent",
                       f"run {job.run_id}: its handle no longer names a live process; nothing was signalled",
                       run_id=job.run_id, signal=int(signum))
        return sent

    def _through_lock_holder(self, job: J, signum: int) -> bool:
        """The recorded handle failed verification while the Attempt is still held (its lock):
        find the live process that holds it (the executor verifies it by the lock) and signal
        that one. When none can be found the job is marked ``unverified`` and an error says so:
        it cannot be stopped from here, and an unrelated process is never signalled."""
        assert job.executor is not None and job.handle is not None
        found = job.executor.find_handle(job.attempt_dir)
        if found is not None and found != job.handle:
            self._emit("warning", "handle_replaced",
                       f"run {job.run_id}: its recorded process handle no longer verifies; the process "
                       f"holding its attempt (pid {found.pid}) is signalled instead",
                       run_id=job.run_id, pid=found.pid)
            job.handle = found
            return job.executor.signal(found, signum)
        if job.unverified is None:
            # pid N may now be an unrelated process: the operator is sent to the attempt, not to it
            job.unverified = (f"cannot be stopped: its recorded process (pid {job.handle.pid}) is no "
                              "longer the job's and no verified process holds its attempt; nothing was "
                              f"signalled (do not signal pid {job.handle.pid}: stop the job by hand once "
                              f"found by its attempt directory {job.attempt_dir})")
            self._emit("error", "handle_unverified", f"run {job.run_id} {job.unverified}",
                       run_id=job.run_id, pid=job.handle.pid, signal=int(signum))
        return False

    def _emit(self, level: str, code: str, message: str, **fields: Any) -> None:
        self._diagnostics.emit(DiagnosticEvent(level, f"{self._prefix}.{code}", message, fields))
