"""What an earlier ``qinglong run`` left: every dispatching or running Attempt, inspected once.

For each Attempt the executor's probe decides, from the Attempt directory and the handle only:

* ``alive`` — re-adopt it: a start that was never recorded gets its handle recorded now
  (``find_handle``), then the dispatcher waits on it like on any of its own;
* ``ended`` — record the outcome the evidence supports (the receipt, the durable cancel
  request); with neither it is ``lost`` with the reason, never ``succeeded``;
* ``never_started`` — give it back to the queue: nothing ran, so starting it is the first run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.execution import (
    ActiveAttempt,
    Actor,
    AttemptOutcome,
    AttemptState,
    Executor,
    ExecutionStore,
    FinishResult,
    ProcessHandle,
    ProcessState,
)
from qinglong.supervisor import ended_outcome

#: Why an Attempt whose process ended while no control plane watched it, without a receipt, is lost.
LOST_WHILE_DOWN = ("the process ended while no control plane watched it and left no completion "
                   "receipt (its exit status is unknown)")
#: Why a running Attempt whose directory shows no process at all is lost.
LOST_NO_TRACE = "the attempt was recorded running but its directory holds no trace of a process"

#: How long a live but not yet identifiable start (its wrapper has not written its pid) is waited for.
FIND_HANDLE_WAIT_S = 2.0

Adopt = Callable[[ActiveAttempt, Executor, ProcessHandle], None]
Recorded = Callable[[ActiveAttempt, AttemptOutcome, FinishResult], None]


@dataclass
class ReconcileReport:
    """What one reconciliation did, by kind (counters only: safe to log)."""

    adopted: int = 0
    recorded: int = 0
    requeued: int = 0
    pending: int = 0
    unknown_executor: int = 0

    def as_fields(self) -> dict[str, int]:
        return {"adopted": self.adopted, "recorded": self.recorded, "requeued": self.requeued,
                "pending": self.pending, "unknown_executor": self.unknown_executor}


async def reconcile_attempt(store: ExecutionStore, executors: Mapping[str, Executor], attempt: ActiveAttempt,
                            clock_ms: Callable[[], int], adopt: Adopt, recorded: Recorded,
                            diagnostics: DiagnosticSink, *, find_handle_wait_s: float = FIND_HANDLE_WAIT_S) -> str:
    """Settle one active Attempt nobody watches; returns what was done (a :class:`ReconcileReport`
    field name)."""
    executor = executors.get(attempt.executor)
    if executor is None:
        return "unknown_executor"
    if attempt.attempt_dir is None:
        state = ProcessState.NEVER_STARTED
    else:
        state = executor.probe(attempt.attempt_dir, attempt.handle)

    if state == ProcessState.ALIVE:
        handle = attempt.handle
        if handle is None or attempt.state == AttemptState.DISPATCHING:
            handle = await _find_handle(executor, attempt.attempt_dir or "", find_handle_wait_s)
            if handle is None:
                return "pending"  # alive but not identifiable yet: looked at again next pass
            if attempt.state == AttemptState.DISPATCHING:
                # the spawn happened, its running commit did not: record it now, same handle
                if not await store.record_started(attempt.attempt_id, handle, clock_ms(), Actor.RECONCILER):
                    return "pending"
        adopt(attempt, executor, handle)
        return "adopted"

    if state == ProcessState.NEVER_STARTED:
        if attempt.state == AttemptState.DISPATCHING:
            if await store.return_to_queue(attempt.attempt_id, clock_ms()):
                return "requeued"
            return "pending"
        outcome = AttemptOutcome(AttemptState.LOST, reason=LOST_NO_TRACE)
    else:
        outcome = ended_outcome(executor, attempt.attempt_dir or "", attempt.cancel_reason,
                                lost_reason=LOST_WHILE_DOWN, requested_at_ms=attempt.cancel_requested_at_ms)
    result = await store.record_finished(attempt.attempt_id, outcome, clock_ms(), Actor.RECONCILER,
                                         started=True)
    if result.recorded:
        recorded(attempt, outcome, result)
    return "recorded"


async def _find_handle(executor: Executor, attempt_dir: str, wait_s: float) -> ProcessHandle | None:
    deadline = time.monotonic() + wait_s
    while True:
        handle = executor.find_handle(attempt_dir)
        if handle is not None or time.monotonic() >= deadline:
            return handle
        await asyncio.sleep(0.05)


async def reconcile(store: ExecutionStore, executors: Mapping[str, Executor], clock_ms: Callable[[], int],
                    adopt: Adopt, recorded: Recorded, diagnostics: DiagnosticSink,
                    skip: Callable[[str], bool] = lambda attempt_id: False) -> ReconcileReport:
    """Settle every active Attempt (except those ``skip`` names: already watched)."""
    report = ReconcileReport()
    for attempt in await store.active_attempts():
        if skip(attempt.attempt_id):
            continue
        try:
            done = await reconcile_attempt(store, executors, attempt, clock_ms, adopt, recorded, diagnostics)
        except Exception as exc:
            # one Attempt that cannot be settled now must not keep the others (or the start) from
            # going on: the dispatcher's passes look at it again
            done = "pending"
            diagnostics.emit(DiagnosticEvent(
                "error", "execution.reconcile_failed",
                f"run {attempt.run_id}: its attempt could not be settled yet: {exc.__class__.__name__}: {exc}",
                {"run_id": attempt.run_id, "attempt_id": attempt.attempt_id}))
        setattr(report, done, getattr(report, done) + 1)
        if done == "unknown_executor":
            diagnostics.emit(DiagnosticEvent(
                "warning", "execution.unknown_executor",
                f"run {attempt.run_id}: its attempt was started by executor {attempt.executor!r}, which "
                "no loaded plugin provides; it is left as it is until that executor is loaded",
                {"run_id": attempt.run_id, "attempt_id": attempt.attempt_id, "executor": attempt.executor}))
    return report

