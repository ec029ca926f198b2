"""Run control: reading and controlling Runs executed elsewhere (the cluster's remote workers),
:class:`RunControl`, and the rules every backend's listing shares."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from ..frozen import record
from ..errors import UserError, quoted
from .outcomes import CancelReason
from .states import AttemptState, RunState
from .store import RunDetail, RunSkipView, RunSummary


@record
class StoredLogState:
    """Where an Attempt's log stored in the store stands, read in one snapshot with the
    Attempt's state: a follower that read ``stored_bytes`` bytes of an Attempt already ended
    (``state`` terminal) has read the whole log, since nothing is appended after the end."""

    attempt_id: str
    state: AttemptState
    #: Bytes of log stored so far (contiguous from offset 0).
    stored_bytes: int
    #: Output beyond the task's log limit, dropped by the worker (known once the Attempt ended).
    dropped_bytes: int
    #: The log was deleted by retention (the tombstone): nothing can be read any more.
    deleted: bool


@runtime_checkable
class RunControl(Protocol):
    """What ``qinglong runs``, ``runs show``, ``runs cancel`` and ``logs`` use on a backend whose
    Runs are executed elsewhere (``backend.execution()`` is None; the cluster's remote workers):
    a backend offers it as ``backend.run_control()``. Logs live in the store, shipped there by
    the worker in order; every read is a short read-only statement of the runtime role."""

    async def list_runs(self, *, state: RunState | None = None, project_id: str | None = None,
                        task_id: str | None = None, trigger_id: str | None = None,
                        limit: int = 50) -> Sequence[RunSummary]:
        """Newest first (by scheduled time, then admission); an unknown state is a UserError."""
        ...

    async def run_detail(self, run_id: str) -> RunDetail:
        """The Run and every Attempt; :class:`~qinglong.contracts.errors.NotFound` if unknown."""
        ...

    async def request_cancel(self, run_id: str, reason: CancelReason = CancelReason.OPERATOR) -> RunState:
        """A queued (or retry-waiting) Run ends ``cancelled`` at once; a dispatching or running one
        gets a durable cancel request (its worker learns it in its next heartbeat reply and
        stops the job); a terminal one is left as it is. Returns the Run's state after;
        :class:`~qinglong.contracts.errors.NotFound` for an unknown Run."""
        ...

    async def log_state(self, attempt_id: str) -> StoredLogState:
        """The Attempt's state and how much of its log is stored (one snapshot)."""
        ...

    async def read_log(self, attempt_id: str, offset: int, size: int) -> bytes:
        """Up to ``size`` stored log bytes from ``offset`` (fewer at the end; empty past it)."""
        ...

    async def recent_run_skips(self, limit: int = 20) -> Sequence[RunSkipView]:
        """The newest Runs skipped before they started (their task's overlap rules or its queue
        bound), newest first: each left the Runs as a skip record with its reason."""
        ...


@record
class WorkerView:
    """A worker id's current session as the operator sees it: ``state`` is ``live`` (open, its
    lease running), ``expired`` (its lease ran out: fenced) or ``closed``; ``running`` its leased
    Attempts; ``free_slots`` what a live session can still take (0 otherwise)."""

    worker_id: str
    state: str
    labels: tuple[str, ...]
    capacity: int
    running: int
    free_slots: int
    opened_at_ms: int
    heartbeat_at_ms: int
    lease_expires_at_ms: int
    closed_at_ms: int | None


def worker_state(closed_at_ms: int | None, lease_expires_at_ms: int, now_ms: int) -> str:
    """``closed``, ``expired`` (the lease ran out at or before ``now_ms``) or ``live``."""
    if closed_at_ms is not None:
        return "closed"
    return "expired" if lease_expires_at_ms <= now_ms else "live"


def free_slots(state: str, capacity: int, running: int) -> int:
    """What a session can still take: its capacity less its leased Attempts, while live."""
    return max(0, capacity - running) if state == "live" else 0


@runtime_checkable
class ListsWorkers(Protocol):
    """A run control whose Runs are taken by workers lists their sessions (``backend.run_control()``
    on the cluster)."""

    async def list_workers(self, now_ms: int, limit: int = 200,
                           worker_ids: Sequence[str] | None = None) -> Sequence[WorkerView]:
        """Every worker id's current session, live ones first, then by worker id; with
        ``worker_ids``, only those (the limit counts what is listed, not what is left out)."""
        ...


def run_state_filter(state: "RunState | str | None") -> "RunState | None":
    """A listing's state filter: None, or a :class:`RunState`; anything else is a
    :class:`~qinglong.contracts.errors.UserError` listing the states, on every backend alike."""
    if state is None:
        return None
    try:
        return RunState(state)
    except ValueError:
        raise UserError(f"unknown run state {state!r}: expected one of "
                        f"{', '.join(s.value for s in RunState)}") from None


#: The longest idempotency key of a manual Run (``task run --idempotency-key``, the API's
#: ``Idempotency-Key`` header), in characters.
MAX_MANUAL_KEY_CHARS = 200


def check_manual_key(label: str, key: object) -> str:
    """An idempotency key of a manual Run: 1 to :data:`MAX_MANUAL_KEY_CHARS` printable
    characters, refused in the same words by the CLI, the API and every store (``label`` names
    the option, the header or the argument)."""
    if not isinstance(key, str) or not key or not key.isprintable():
        raise UserError(f"{label}: expected 1 to {MAX_MANUAL_KEY_CHARS} printable characters (got {quoted(key)})")
    if len(key) > MAX_MANUAL_KEY_CHARS:  # longer than the quote: it says how long
        raise UserError(f"{label}: expected at most {MAX_MANUAL_KEY_CHARS} characters (got {quoted(key)})")
    return key


def manual_idempotency_key(key: str) -> str:
    """``ql3:manual:v1:<key>``: the key of a manual Run."""
    return f"ql3:manual:v1:{key}"


__all__ = ["StoredLogState", "RunControl", "run_state_filter", "manual_idempotency_key", "WorkerView",
           "MAX_MANUAL_KEY_CHARS", "check_manual_key",
           "ListsWorkers", "worker_state", "free_slots"]
