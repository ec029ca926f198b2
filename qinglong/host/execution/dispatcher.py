"""The dispatcher: starts admitted Runs as processes, enforces their timeouts and cancel requests,
and records each process's end exactly once.

A pass (woken at once when a scheduler round admitted something or a job ended, else by the
``[execution] poll_ms`` timer):

1. read the active Attempts; settle any nobody here watches (the reconciler's rules);
2. enforce deadlines (a durable cancel request first, then TERM to the process group, KILL after
   ``kill_grace_ms``) and cancel requests, whoever wrote them (``qinglong runs cancel`` in another
   process writes the request; the dispatcher signals);
3. visit the dispatchable Runs in order and, up to the free slots (``max_running`` minus what is
   active), apply each task's overlap policy: skip, replace (cancel the running one, then wait),
   wait, or start. A start is ``claimed -> dispatching`` in one short transaction, the spawn outside
   any transaction, then ``running`` with the process's handle.

Each running job is held by the job supervisor (:mod:`qinglong.supervisor`, which the cluster
worker uses too): a watcher task waits for the process, reads its completion receipt and records
the outcome (:func:`~qinglong.contracts.execution.classify_outcome`, with the Attempt's cancel
request); TERM and KILL go through the executor's verified handle, once each. The store applies
the retry decision.

At stop, ``on_stop = "detach"`` (the default) stops dispatching and leaves the jobs running: their
waiters write receipts and the next start's reconciler records them. ``"terminate"`` requests a
cancel (``shutdown``), signals (KILL after ``kill_grace_ms``, or sooner if the stop bound would end
first), and waits for the outcomes within the stop bound.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from qinglong.contracts.frozen import record
from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.execution import (
    ActiveAttempt,
    ActiveRun,
    Actor,
    AttemptOutcome,
    AttemptState,
    CancelReason,
    DispatchCandidate,
    Executor,
    ExecutionStore,
    FinishResult,
    OverlapAction,
    ProcessHandle,
    StartError,
    StartRequest,
    decided_beside_pending_starts,
    overlap_decision,
)
from qinglong.supervisor import (
    NO_COMMAND,
    Job,
    Supervisor,
    SupervisorStats,
    missing_executor,
    start_failure,
    wall_clock_ms,
)

from .reconciler import ReconcileReport, reconcile, reconcile_attempt
from .retention import Retention

#: Candidates read per pass beyond the slots (a first page; a full page of waiting Runs with slots
#: still free is followed by a larger one, up to MAX_CANDIDATES).
CANDIDATE_MARGIN = 32
MAX_CANDIDATES = 2_048
#: Retention's first sweep after start, then its period.
RETENTION_FIRST_S = 5.0
RETENTION_PERIOD_S = 60.0


@record(slots=False)
class DispatcherConfig:
    """The ``[execution]`` values the dispatcher works with, and the log directory."""

    max_running: int
    log_dir: str
    kill_grace_ms: int = 10_000
    poll_ms: int = 1_000
    on_stop: str = "detach"
    log_retention_days: float = 7
    run_retention_days: float = 7
    skip_retention_days: float = 7
    min_free_bytes: int = 64 * 1024 * 1024
    min_free_fraction: float = 0.1
    keep_logs_per_task: int = 3
    max_queued: int | None = None
    prune_batch: int = 200
    retention_first_s: float = RETENTION_FIRST_S
    retention_period_s: float = RETENTION_PERIOD_S

    @classmethod
    def from_settings(cls, execution: Any, log_dir: str) -> "DispatcherConfig":
        """From ``[execution]`` (``qinglong.host.settings.ExecutionSettings``)."""
        return cls(max_running=execution.max_running, log_dir=log_dir, kill_grace_ms=execution.kill_grace_ms,
                   poll_ms=execution.poll_ms, on_stop=execution.on_stop,
                   log_retention_days=execution.log_retention_days,
                   run_retention_days=execution.run_retention_days,
                   skip_retention_days=execution.skip_retention_days,
                   min_free_bytes=execution.min_free_bytes, min_free_fraction=execution.min_free_fraction,
                   keep_logs_per_task=execution.keep_logs_per_task, prune_batch=execution.prune_batch,
                   max_queued=execution.max_queued)


@dataclass
class DispatcherStats(SupervisorStats):
    """Counters over the dispatcher's life (safe to log): the supervisor's and its own."""

    passes: int = 0
    failed_passes: int = 0
    finished: int = 0
    skipped: int = 0
    timed_out: int = 0
    reconciled: dict[str, int] = field(default_factory=dict)


class Dispatcher:
    """Starts and watches the processes of one store's Runs (one per ``qinglong run``)."""

    name = "dispatcher"

    def __init__(self, store: ExecutionStore, executors: Mapping[str, Executor], config: DispatcherConfig,
                 diagnostics: DiagnosticSink, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._store = store
        self._executors = dict(executors)
        self._config = config
        self._diagnostics = diagnostics
        self._clock_ms = clock_ms
        self.stats = DispatcherStats()
        self._supervisor: Supervisor[Job] = Supervisor(diagnostics, "execution", config.kill_grace_ms / 1000,
                                                       self.stats, report_unsent=True)
        self._jobs = self._supervisor.jobs
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self._next_retry_ms: int | None = None
        self._next_deadline_ms: int | None = None
        self._warned: set[str] = set()
        self._noted: set[str] = set()
        self._cancel_requested = False
        self.retention = Retention(store, config.log_dir, log_retention_days=config.log_retention_days,
                                   run_retention_days=config.run_retention_days,
                                   skip_retention_days=config.skip_retention_days,
                                   min_free_bytes=config.min_free_bytes, prune_batch=config.prune_batch,
                                   diagnostics=diagnostics, keep_per_task=config.keep_logs_per_task,
                                   min_free_fraction=config.min_free_fraction)
        #: Observers (the HTTP surface's metrics): ``on_started(lag_ms)`` per process started
        #: (admitted to spawned), ``on_finished(state)`` per Attempt end recorded here. They must
        #: not raise; an error is reported and ignored.
        self.on_started: list[Callable[[int], None]] = []
        self.on_finished: list[Callable[[str], None]] = []

    @property
    def alive(self) -> bool:
        """The dispatch loop task runs (started, not ended)."""
        return self._task is not None and not self._task.done()

    def _notify(self, observers: list[Callable[[Any], None]], value: Any) -> None:
        for observer in observers:
            try:
                observer(value)
            except Exception as exc:
                self._report_error("execution.observer_failed",
                                   f"a dispatch observer failed: {exc.__class__.__name__}: {exc}")

    # ---------------------------------------------------------------------------------- control

    def wake(self, *_: Any) -> None:
        """Run a pass as soon as possible (a round admitted something, a job ended)."""
        self._wakeup.set()

    @property
    def watched(self) -> int:
        """Processes this dispatcher waits on now."""
        return len(self._jobs)

    async def start(self) -> ReconcileReport:
        """Settle what an earlier run left (the reconciler), then start passes and retention."""
        os.makedirs(self._config.log_dir, mode=0o700, exist_ok=True)
        self.retention.check_floor()
        report = await reconcile(self._store, self._executors, self._clock_ms, self._adopt, self._recorded,
                                 self._diagnostics, skip=self._jobs.__contains__)
        self.stats.reconciled = report.as_fields()
        self._diagnostics.emit(DiagnosticEvent("info", "execution.reconciled",
                                               "attempts left by an earlier run settled", report.as_fields()))
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="qinglong-dispatcher")
        self._retention_task = loop.create_task(self._run_retention(), name="qinglong-retention")
        return report

    async def stop(self, timeout_s: float) -> None:
        """Stop dispatching; then detach from the running jobs or terminate them (``on_stop``)."""
        deadline = time.monotonic() + timeout_s * 0.9
        self._stopping = True
        self._wakeup.set()
        for task in (self._retention_task, self._task):
            if task is None:
                continue
            if task is self._retention_task:
                task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                task.cancel()
            except (asyncio.CancelledError, Exception):
                pass
        if self._config.on_stop == "terminate" and self._jobs:
            await self._terminate_all(deadline)
        left = len(self._jobs)
        for job in list(self._jobs.values()):
            if job.task is not None:
                job.task.cancel()
        for job in list(self._jobs.values()):
            if job.task is not None:
                try:
                    await job.task
                except (asyncio.CancelledError, Exception):
                    pass
        self._jobs.clear()
        if left:
            self._diagnostics.emit(DiagnosticEvent(
                "info", "execution.detached",
                f"{left} job(s) left running; the next start records their outcomes",
                {"jobs": left, "on_stop": self._config.on_stop}))

    async def _terminate_all(self, deadline: float) -> None:
        now = self._clock_ms()
        for job in list(self._jobs.values()):
            try:
                await self._store.request_cancel(job.run_id, CancelReason.SHUTDOWN, now, Actor.DISPATCHER)
            except Exception as exc:
                self._report_error("execution.cancel_failed", f"run {job.run_id}: the stop's cancel request "
                                   f"could not be recorded: {exc.__class__.__name__}: {exc}")
            self._supervisor.escalate(job)
        # KILL after the grace, or sooner when the stop bound would end before it: a stop that
        # terminates must not return with a job still running
        grace = min(self._config.kill_grace_ms / 1000, max(0.0, (deadline - time.monotonic()) * 0.6))
        while self._jobs and time.monotonic() < deadline:
            for job in list(self._jobs.values()):
                self._supervisor.escalate(job, grace)
            tasks = self._supervisor.tasks()
            if not tasks:
                break
            await asyncio.wait(tasks, timeout=min(0.1, max(0.0, deadline - time.monotonic())))

    # ---------------------------------------------------------------------------------- the loop

    async def _run(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            try:
                await self.run_pass()
                self.stats.passes += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.failed_passes += 1
                self._report_error("execution.pass_failed",
                                   f"a dispatch pass failed: {exc.__class__.__name__}: {exc}")
            if self._stopping:
                break
            try:
                await asyncio.wait_for(self._wakeup.wait(), self._sleep_s())
            except asyncio.TimeoutError:
                pass

    def _sleep_s(self) -> float:
        """Until the next pass: the poll timer, or sooner a retry's time, a deadline or a KILL due."""
        delay = self._config.poll_ms / 1000
        now = self._clock_ms()
        for at_ms in (self._next_retry_ms, self._next_deadline_ms):
            if at_ms is not None:
                delay = min(delay, max(0.0, (at_ms - now) / 1000))
        for job in self._jobs.values():
            kill_in = self._supervisor.kill_due_in(job)
            if kill_in is not None:
                delay = min(delay, kill_in)
        return delay + 0.001

    async def run_pass(self) -> None:
        """One pass: settle, enforce, start (see the module docstring)."""
        now = self._clock_ms()
        if self._next_retry_ms is not None and self._next_retry_ms <= now:
            self._next_retry_ms = None
        active = list(await self._store.active_attempts())
        for attempt in active:
            if attempt.attempt_id not in self._jobs:
                try:
                    await self._settle_orphan(attempt)
                except Exception as exc:
                    self._report_error("execution.reconcile_failed",
                                       f"run {attempt.run_id}: its attempt could not be settled yet: "
                                       f"{exc.__class__.__name__}: {exc}")
        if self._stopping:
            return
        await self._enforce(active, now)

        free = self._config.max_running - len(active)
        by_task: dict[tuple[str, str], list[ActiveRun]] = defaultdict(list)
        for attempt in active:
            by_task[(attempt.project_id, attempt.task_id)].append(
                ActiveRun(attempt.run_id, attempt.scheduled_for_ms, attempt.cancel_reason is not None))
        waiting: dict[tuple[str, str], int] = defaultdict(int)
        limit = min(MAX_CANDIDATES, max(self._config.max_running, 1) + CANDIDATE_MARGIN)
        cancelled_any = self._cancel_requested = False
        visited: set[str] = set()
        # A pass's starts go together: one transaction moves them all to dispatching, then
        # their spawns run beside each other (one at a time, each waiting for its wrapper's pid
        # file, 16 free slots held 4 jobs at most). Each holds its slot and its place among its
        # task's active Runs until it is known; a failed one gives both back.
        pending: list[tuple[tuple[str, str], DispatchCandidate]] = []

        async def settle_starts(key: tuple[str, str] | None = None) -> bool:
            """Start the pending candidates (``key``: only if one of that task's is pending)."""
            nonlocal free
            if not pending or (key is not None and not any(k == key for k, _ in pending)):
                return False
            batch = list(pending)
            pending.clear()
            started = await self._start_together([candidate for _, candidate in batch], now)
            for (task_key, launched), ok in zip(batch, started):
                if not ok:
                    free += 1
                    by_task[task_key] = [a for a in by_task[task_key] if a.run_id != launched.run_id]
                    self.wake()  # the slot it held is free again: another pass may use it
            return True

        def launch(key: tuple[str, str], candidate: DispatchCandidate) -> None:
            by_task[key].append(ActiveRun(candidate.run_id, candidate.scheduled_for_ms))
            pending.append((key, candidate))

        try:
            while True:
                page = await self._store.dispatch_candidates(now, limit)
                for candidate in page:
                    if self._stopping:
                        return
                    if candidate.run_id in visited:
                        continue  # waiting, seen on the smaller page
                    visited.add(candidate.run_id)
                    # one Run that cannot be handled must not keep the Runs behind it from starting
                    started = await self._reported(candidate, self._visit(
                        candidate, now, by_task, waiting, lambda: free > 0, launch, settle_starts))
                    if started:
                        free -= 1
                    cancelled_any = cancelled_any or self._cancel_requested
                    self._cancel_requested = False
                await settle_starts()
                # A full page of Runs that wait (a 'queue' task's backlog) must not hide a startable
                # Run of another task behind it: while slots are free, look further.
                if free <= 0 or len(page) < limit or limit >= MAX_CANDIDATES:
                    break
                limit = min(MAX_CANDIDATES, limit * 4)
        finally:
            # a pass that ends (stopping, or an error) starts none of what it held back: those
            # Runs are still claimed, and the next start of the dispatcher finds them
            pending.clear()
        if cancelled_any:
            self.wake()  # signal the replaced processes at once

    async def _visit(self, candidate: DispatchCandidate, now: int, by_task: dict[tuple[str, str], list[ActiveRun]],
                     waiting: dict[tuple[str, str], int], slot_free: Callable[[], bool],
                     launch: Callable[[tuple[str, str], DispatchCandidate], None],
                     settle: Callable[[tuple[str, str]], Awaitable[bool]]) -> bool:
        """Apply the candidate's overlap policy; True when it starts (``launch``: it holds a slot
        until its start is known). A decision that starts of its task still under way may have
        caused is taken again once they are known (``settle``)."""
        key = (candidate.project_id, candidate.task_id)
        if candidate.spec is None:
            await self._fail_without_start(candidate, candidate.spec_error or NO_COMMAND, now)
            return False
        policy = candidate.spec.concurrency
        decision = overlap_decision(policy, by_task[key], waiting[key], slot_free=slot_free(),
                                    max_queued=self._config.max_queued)
        if not decided_beside_pending_starts(policy, decision) and await settle(key):
            decision = overlap_decision(policy, by_task[key], waiting[key], slot_free=slot_free(),
                                        max_queued=self._config.max_queued)
        if decision.action is OverlapAction.SKIP:
            if await self._store.skip_run(candidate.run_id, candidate.attempt_id, decision.reason, now):
                self.stats.skipped += 1
            return False
        if decision.action is OverlapAction.REPLACE:
            for run_id in decision.cancel:
                await self._store.request_cancel(run_id, CancelReason.REPLACED, now, Actor.DISPATCHER)
                self._cancel_requested = True
            by_task[key] = [ActiveRun(a.run_id, a.scheduled_for_ms, True) for a in by_task[key]]
            waiting[key] += 1
            return False
        if decision.action is OverlapAction.WAIT:
            waiting[key] += 1
            return False
        launch(key, candidate)
        return True

    # ---------------------------------------------------------------------------------- starting

    async def _fail_without_start(self, candidate: DispatchCandidate, reason: str, now: int) -> None:
        if not await self._store.begin_dispatch(candidate.attempt_id, self._attempt_dir(candidate), now, now):
            return
        self.stats.start_failed += 1  # (a start the executor refused is counted by the supervisor)
        await self._record_start_failure(candidate, reason)

    async def _record_start_failure(self, candidate: DispatchCandidate, reason: str) -> None:
        outcome = start_failure(reason, self._clock_ms())
        await self._store.record_finished(candidate.attempt_id, outcome, self._clock_ms(), Actor.DISPATCHER,
                                          started=False)
        self._notify(self.on_finished, AttemptState.FAILED.value)
        self._diagnostics.emit(DiagnosticEvent(
            "warning", "execution.start_failed", f"run {candidate.run_id} could not start: {reason}",
            {"run_id": candidate.run_id, "attempt_id": candidate.attempt_id,
             "project_id": candidate.project_id, "task_id": candidate.task_id}))

    def _attempt_dir(self, candidate: DispatchCandidate) -> str:
        return os.path.join(self._config.log_dir, candidate.attempt_id)

    async def _start_together(self, candidates: list[DispatchCandidate], now: int) -> list[bool]:
        """Start ``candidates``: each one's executor checked, every one moved to dispatching in
        one transaction, then their spawns beside each other. True for each that holds a slot."""
        ready: list[tuple[DispatchCandidate, Executor]] = []
        for candidate in candidates:
            spec = candidate.spec
            assert spec is not None
            executor = self._executors.get(spec.executor)
            if executor is None:
                await self._reported(candidate, self._fail_without_start(
                    candidate, missing_executor(spec.executor, self._executors), now))
            else:
                ready.append((candidate, executor))
        began = await self._begin_dispatches(ready, now)
        to_spawn = [(candidate, executor) for candidate, executor in ready if candidate.attempt_id in began]
        spawned = await asyncio.gather(*(
            self._reported(candidate, self._spawn(candidate, executor, began[candidate.attempt_id]))
            for candidate, executor in to_spawn))
        running = {candidate.attempt_id for (candidate, _), ok in zip(to_spawn, spawned) if ok is True}
        return [candidate.attempt_id in running for candidate in candidates]

    async def _begin_dispatches(self, ready: list[tuple[DispatchCandidate, Executor]],
                                now: int) -> Mapping[str, str | None]:
        """claimed -> dispatching of every ready candidate in one transaction; each Attempt moved,
        with its event payload. A batch the store refuses (one Attempt it cannot move would roll
        back the others) is begun one by one, so only that one is reported and left."""
        if not ready:
            return {}
        starts = [(c.attempt_id, self._attempt_dir(c), now + c.spec.timeout_ms) for c, _ in ready]
        try:
            return await self._store.begin_dispatches(starts, now)
        except Exception:
            began: dict[str, str | None] = {}
            reader = getattr(self._store, "event_payload", None)  # a store that keeps event payloads
            for (candidate, _), (attempt_id, attempt_dir, deadline) in zip(ready, starts):
                async def one() -> None:
                    if await self._store.begin_dispatch(attempt_id, attempt_dir, deadline, now):
                        began[attempt_id] = await reader(candidate.run_id) if reader else None
                await self._reported(candidate, one())
            return began

    async def _reported(self, candidate: DispatchCandidate, step: Awaitable[Any]) -> Any:
        """``await step``; its error reported as a pass reports one (the other starts go on)."""
        try:
            return await step
        except Exception as exc:
            self._report_error("execution.dispatch_failed",
                               f"run {candidate.run_id} could not be dispatched: {exc.__class__.__name__}: {exc}")
            return False

    async def _spawn(self, candidate: DispatchCandidate, executor: Executor, event_payload: str | None) -> bool:
        """Start the process of a candidate begun; True when it runs (it then holds a slot)."""
        spec = candidate.spec
        assert spec is not None
        attempt_dir = self._attempt_dir(candidate)
        request = StartRequest(candidate.run_id, candidate.attempt_id, candidate.attempt_no,
                               candidate.scheduled_for_ms, spec, attempt_dir, event_payload=event_payload)
        # taken before the spawn: the job may end (its receipt's time) before start() returns,
        # and a start time read after it would give that job a negative duration
        spawned_at = self._clock_ms()
        job = Job(candidate.run_id, candidate.attempt_id, attempt_dir=attempt_dir)
        try:
            handle = await self._supervisor.spawn(job, executor, request)
        except StartError as err:
            await self._record_start_failure(candidate, str(err) or err.__class__.__name__)
            return False
        except Exception as exc:
            # Whether a process exists is unknown: the next pass settles the Attempt from its
            # directory (alive: adopted; never started: queued again).
            self._report_error("execution.start_error",
                               f"run {candidate.run_id}: the executor failed while starting: "
                               f"{exc.__class__.__name__}: {exc}")
            return True
        self._notify(self.on_started, max(0, spawned_at - candidate.admitted_at_ms))
        self._watch(job)
        if not await self._store.record_started(candidate.attempt_id, handle, spawned_at):
            # ended meanwhile (its waiter recorded a quick exit first, or the Attempt was
            # settled elsewhere): make sure nothing of it runs on
            self._supervisor.escalate(job)
        return True

    # ---------------------------------------------------------------------------------- watching

    def _adopt(self, attempt: ActiveAttempt, executor: Executor, handle: ProcessHandle) -> None:
        self._watch(Job(attempt.run_id, attempt.attempt_id, executor, attempt.attempt_dir or "", handle))

    def _watch(self, job: Job) -> None:
        self._supervisor.track(job, self._wait_and_record, self.wake)

    async def _wait_and_record(self, job: Job) -> None:
        try:
            await self._supervisor.wait_for_exit(job)
            cancel = requested_at = None
            for attempt in await self._store.active_attempts():
                if attempt.attempt_id == job.attempt_id:
                    cancel, requested_at = attempt.cancel_reason, attempt.cancel_requested_at_ms
                    break
            else:
                return  # already ended (recorded elsewhere): nothing to add
            # the request's time and the receipt's are both this machine's wall clock
            outcome = self._supervisor.outcome(job, cancel, requested_at)
            result = await self._store.record_finished(job.attempt_id, outcome, self._clock_ms(), Actor.COMPLETION)
            if result.recorded:
                self._recorded_outcome(job.run_id, job.attempt_id, outcome, result, attempt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # left active in the store: the next pass settles it from its directory
            self._report_error("execution.completion_failed",
                               f"run {job.run_id}: recording the end of its process failed: "
                               f"{exc.__class__.__name__}: {exc}")

    def _recorded(self, attempt: ActiveAttempt, outcome: AttemptOutcome, result: FinishResult) -> None:
        self._recorded_outcome(attempt.run_id, attempt.attempt_id, outcome, result, attempt)

    def _recorded_outcome(self, run_id: str, attempt_id: str, outcome: AttemptOutcome,
                          result: FinishResult, attempt: ActiveAttempt | None = None) -> None:
        self.stats.finished += 1
        self._notify(self.on_finished, outcome.state.value)
        if result.next_attempt is not None:
            at = result.next_attempt.at_ms
            self._next_retry_ms = at if self._next_retry_ms is None else min(self._next_retry_ms, at)
        if outcome.state is AttemptState.LOST:
            self._diagnostics.emit(DiagnosticEvent(
                "warning", "execution.attempt_lost", f"run {run_id}: attempt lost: {outcome.reason}",
                {"run_id": run_id, "attempt_id": attempt_id}))
        elif outcome.state is AttemptState.TIMED_OUT:
            self.stats.timed_out += 1
        if outcome.state in (AttemptState.FAILED, AttemptState.TIMED_OUT):
            self._log_failure(run_id, attempt_id, outcome, attempt)

    def _log_failure(self, run_id: str, attempt_id: str, outcome: AttemptOutcome,
                     attempt: ActiveAttempt | None) -> None:
        """One line per failed or timed-out Attempt: task, Run, exit status, duration. Never the
        command or its environment (they may hold secrets)."""
        task = f"{attempt.project_id}/{attempt.task_id}" if attempt is not None else "?"
        started = attempt.started_at_ms if attempt is not None else None
        ended = outcome.ended_at_ms if outcome.ended_at_ms is not None else self._clock_ms()
        duration_ms = None if started is None else max(0, ended - started)
        if outcome.exit_code is not None:
            status = f"exit {outcome.exit_code}"
        elif outcome.signal is not None:
            status = f"signal {outcome.signal}"
        else:
            status = "no exit status"
        took = "" if duration_ms is None else f" after {duration_ms / 1000:.3f} s"
        words = "timed out" if outcome.state is AttemptState.TIMED_OUT else "failed"
        self._diagnostics.emit(DiagnosticEvent(
            "warning", f"execution.attempt_{outcome.state.value}",
            f"task {task} run {run_id} attempt {attempt.attempt_no if attempt else '?'} {words}: "
            f"{status}{took}",
            {"project_id": attempt.project_id if attempt else None,
             "task_id": attempt.task_id if attempt else None, "run_id": run_id, "attempt_id": attempt_id,
             "exit_code": outcome.exit_code, "signal": outcome.signal, "duration_ms": duration_ms}))

    async def _settle_orphan(self, attempt: ActiveAttempt) -> None:
        """An active Attempt nobody here watches (left by an earlier run, or a failed record)."""
        done = await reconcile_attempt(self._store, self._executors, attempt, self._clock_ms, self._adopt,
                                       self._recorded, self._diagnostics, find_handle_wait_s=0)
        if done == "unknown_executor" and attempt.attempt_id not in self._warned:
            self._warned.add(attempt.attempt_id)
            self._diagnostics.emit(DiagnosticEvent(
                "warning", "execution.unknown_executor",
                f"run {attempt.run_id}: its attempt was started by executor {attempt.executor!r}, which no "
                "loaded plugin provides; it is left as it is until that executor is loaded",
                {"run_id": attempt.run_id, "attempt_id": attempt.attempt_id, "executor": attempt.executor}))

    # ---------------------------------------------------------------------------------- cancelling

    async def _enforce(self, active: list[ActiveAttempt], now: int) -> None:
        """Deadlines become durable cancel requests; every cancel request is signalled."""
        next_deadline: int | None = None
        for attempt in active:
            job = self._jobs.get(attempt.attempt_id)
            if job is None or attempt.state != AttemptState.RUNNING:
                continue
            reason = attempt.cancel_reason
            if reason is None and attempt.deadline_ms is not None:
                if now >= attempt.deadline_ms:
                    await self._store.request_cancel(attempt.run_id, CancelReason.TIMEOUT, now, Actor.DISPATCHER)
                    reason = CancelReason.TIMEOUT
                    self._diagnostics.emit(DiagnosticEvent(
                        "warning", "execution.timeout",
                        f"run {attempt.run_id}: the timeout expired; stopping its process group",
                        {"run_id": attempt.run_id, "attempt_id": attempt.attempt_id,
                         "deadline_ms": attempt.deadline_ms}))
                else:
                    next_deadline = (attempt.deadline_ms if next_deadline is None
                                     else min(next_deadline, attempt.deadline_ms))
            if (reason is not None and CancelReason(reason) is CancelReason.TIMEOUT
                    and self._supervisor.draining(job)):
                # the job itself has exited: its wrapper ends within the drain and applies
                # [execution] orphans; a TERM now would stop what "leave" keeps
                continue
            if reason is not None:
                self._supervisor.escalate(job)
                if job.unverified is not None and attempt.attempt_id not in self._noted:
                    await self._store.note_attempt(attempt.attempt_id, job.unverified)
                    self._noted.add(attempt.attempt_id)
        self._next_deadline_ms = next_deadline

    # ---------------------------------------------------------------------------------- retention

    async def _run_retention(self) -> None:
        delay = self._config.retention_first_s
        while not self._stopping:
            await asyncio.sleep(delay)
            delay = self._config.retention_period_s
            try:
                await self.retention.sweep(self._clock_ms())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._report_error("execution.retention_failed",
                                   f"a retention sweep failed: {exc.__class__.__name__}: {exc}")

    def _report_error(self, code: str, message: str) -> None:
        self._diagnostics.emit(DiagnosticEvent("error", code, message))
