"""The execution side of a store (edge and standalone: the local dispatcher's view of it):
:class:`ExecutionStore`, every state change durable, one short transaction each, and the records
it reads and returns."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence, runtime_checkable

from ..frozen import record
from .executors import ProcessHandle
from .outcomes import AttemptOutcome, CancelReason, RetryAt
from .spec import ExecutionSpec
from .states import Actor, AttemptState, RunState


@record
class DispatchCandidate:
    """A Run whose current Attempt is ``claimed`` and due (``not_before_ms`` passed), in dispatch
    order: scheduled time, then admission time, then run id."""

    run_id: str
    attempt_id: str
    attempt_no: int
    project_id: str
    task_id: str
    task_revision: int
    scheduled_for_ms: int
    admitted_at_ms: int
    run_state: RunState
    spec: ExecutionSpec | None  # None: the task revision names no command (the Run fails)
    #: Why ``spec`` is None when the stored payload names a command that is not a valid spec
    #: (a revision published before specs were checked): the Run fails with this reason.
    spec_error: str | None = None


@record
class ActiveAttempt:
    """An Attempt holding (or maybe holding) a process: dispatching or running."""

    run_id: str
    attempt_id: str
    attempt_no: int
    project_id: str
    task_id: str
    scheduled_for_ms: int
    state: AttemptState
    executor: str
    attempt_dir: str | None
    handle: ProcessHandle | None
    started_at_ms: int | None
    deadline_ms: int | None
    cancel_reason: CancelReason | None
    cancel_requested_at_ms: int | None
    spec: ExecutionSpec | None


@record
class FinishResult:
    """What recording an outcome did: the Run's state after, and the next Attempt if one was
    created. ``recorded`` is False when the Attempt had already ended (nothing changed)."""

    recorded: bool
    run_state: RunState
    next_attempt: RetryAt | None = None


@record
class AttemptView:
    attempt_id: str
    attempt_no: int
    state: AttemptState
    executor: str
    created_at_ms: int
    not_before_ms: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    exit_code: int | None
    signal: int | None
    duration_ms: int | None
    log_bytes: int | None
    log_dropped_bytes: int
    log_deleted: bool
    attempt_dir: str | None
    reason: str | None
    cancel_reason: str | None
    #: The worker that held the Attempt (the cluster's remote workers; None where Runs are
    #: executed by the control plane itself, or before any worker claimed it).
    worker_id: str | None = None


@record
class RunSummary:
    run_id: str
    project_id: str
    task_id: str
    trigger_id: str
    scheduled_for_ms: int
    admitted_at_ms: int
    state: RunState
    attempts: int
    exit_code: int | None
    duration_ms: int | None
    finished_at_ms: int | None
    reason: str | None


@record
class RunDetail:
    run: RunSummary
    idempotency_key: str
    task_revision: int
    attempts: tuple[AttemptView, ...]
    #: the random delay its trigger's occurrence drew (``run.scheduled_for_ms`` includes it)
    jitter_ms: int = 0


@record
class RunSkipView:
    """A Run skipped before it started (its task's overlap rules), kept as a skip record."""

    run_id: str
    project_id: str
    task_id: str
    trigger_id: str  # '' for a manual Run
    scheduled_for_ms: int
    reason: str
    recorded_at_ms: int


@record
class PruneReport:
    runs: int = 0
    attempts: int = 0
    events: int = 0


@runtime_checkable
class ExecutionStore(Protocol):
    """The execution side of one store. Each method is one short transaction; the state machine
    (:func:`check_run_transition`) and :func:`retry_decision` decide, the store applies."""

    async def dispatch_candidates(self, now_ms: int, limit: int) -> Sequence[DispatchCandidate]:
        """Due claimed Attempts in dispatch order (at most ``limit``)."""
        ...

    async def active_attempts(self) -> Sequence[ActiveAttempt]:
        """Every dispatching or running Attempt (bounded by the profile's max_running in practice)."""
        ...

    async def begin_dispatch(self, attempt_id: str, attempt_dir: str, deadline_ms: int,
                             now_ms: int) -> bool:
        """claimed -> dispatching (Run -> dispatching), recording the directory the process will
        use. False (nothing changed) if the Attempt is no longer claimed and due."""
        ...

    async def begin_dispatches(self, starts: Sequence[tuple[str, str, int]],
                               now_ms: int) -> Mapping[str, str | None]:
        """:meth:`begin_dispatch` of each ``(attempt_id, attempt_dir, deadline_ms)``, in one
        transaction (a pass's starts cost one commit, not one each): the Attempts it moved, each
        with the payload (canonical JSON) an event admitted its Run with, or None. An Attempt
        :meth:`begin_dispatch` would refuse is left out, nothing of it changed."""
        ...

    async def record_started(self, attempt_id: str, handle: ProcessHandle, started_at_ms: int,
                             actor: Actor = Actor.DISPATCHER) -> bool:
        """dispatching -> running with the process's handle. False if not dispatching."""
        ...

    async def return_to_queue(self, attempt_id: str, now_ms: int) -> bool:
        """dispatching -> claimed, for a start that provably never happened (reconciler)."""
        ...

    async def record_finished(self, attempt_id: str, outcome: AttemptOutcome, now_ms: int,
                              actor: Actor, *, started: bool = True) -> FinishResult:
        """End the Attempt exactly once with ``outcome`` and apply :func:`retry_decision`: a new
        ``claimed`` Attempt (Run -> retry_wait) or the Run's terminal state. An Attempt already
        ended is left as it is (``recorded=False``)."""
        ...

    async def request_cancel(self, run_id: str, reason: CancelReason, now_ms: int,
                             actor: Actor = Actor.OPERATOR) -> RunState:
        """A durable cancel request on the Run's active Attempt (its process is then signalled);
        a Run with no process (queued, retry_wait) ends ``cancelled`` at once. Returns the Run's
        state after. A terminal Run is left as it is."""
        ...

    async def skip_run(self, run_id: str, attempt_id: str, reason: str, now_ms: int) -> bool:
        """Skip a claimed Run because its overlap rules skip it: it ends ``cancelled`` (its end
        event written), then leaves the Runs as a skip record with ``reason``."""
        ...

    async def recent_run_skips(self, limit: int = 20) -> Sequence[RunSkipView]:
        """The newest Runs skipped before they started, newest first."""
        ...

    async def admit_manual_run(self, project_id: str, task_id: str, key: str, now_ms: int) -> tuple[str, bool]:
        """Admit a manual Run of the task's head revision now, idempotency key
        ``ql3:manual:v1:<key>``. Returns ``(run_id, created)``; the same key twice admits one. A
        key that admitted a Run of another task (or project) is ``AlreadyExists``, naming neither."""
        ...

    async def list_runs(self, *, state: RunState | None = None, project_id: str | None = None,
                        task_id: str | None = None, limit: int = 50) -> Sequence[RunSummary]:
        """Newest first (by scheduled time, then admission)."""
        ...

    async def run_detail(self, run_id: str) -> RunDetail:
        """The Run and every Attempt; :class:`~qinglong.contracts.errors.NotFound` if unknown."""
        ...

    async def finished_logs(self, older_than_ms: int, limit: int) -> Sequence[tuple[str, str]]:
        """``(attempt_id, attempt_dir)`` of ended Attempts whose log still exists, ended before
        ``older_than_ms``, oldest first."""
        ...

    async def logs_for_space(self, keep_per_task: int, under_dir: str, limit: int) -> Sequence[tuple[str, str]]:
        """``(attempt_id, attempt_dir)`` of ended Attempts whose log still exists in a directory
        under ``under_dir``, oldest first, leaving out the newest ``keep_per_task`` of each task:
        what a free-space floor may delete."""
        ...

    async def note_attempt(self, attempt_id: str, note: str) -> bool:
        """Record ``note`` as the reason of a dispatching or running Attempt (what keeps it from
        being stopped), shown by ``runs show``; its end's reason replaces it. False when the
        Attempt has ended."""
        ...

    async def mark_log_deleted(self, attempt_id: str, now_ms: int) -> None:
        """Record that the Attempt's log was deleted (the tombstone)."""
        ...

    async def prune(self, older_than_ms: int, batch: int) -> PruneReport:
        """Delete up to ``batch`` terminal Runs finished before ``older_than_ms`` with their
        Attempts and events, keeping what refuses a duplicate admission of their occurrence."""
        ...


__all__ = ["DispatchCandidate", "ActiveAttempt", "FinishResult", "AttemptView", "RunSummary", "RunDetail",
           "RunSkipView", "PruneReport", "ExecutionStore"]
