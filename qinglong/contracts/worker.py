"""The worker protocol: how a remote worker pulls Runs, reports on them and is fenced.

On the cluster profile an admitted Run waits, queued, for a worker: a ``qinglong worker`` process
on any machine. The worker talks to the store only through the eight calls of
:class:`WorkerProtocol` (open session, heartbeat, claim, started, append log, complete, close
session). The PostgreSQL backend implements them as SECURITY DEFINER functions that the
gateway role may execute and nothing else; the HTTP gateway serves the same protocol to workers.

The promise is admission's: a Run runs at most once per Attempt, an Attempt is never started
twice, a finished job's outcome is never lost or invented, and a partitioned worker cannot run a
job at the same time as the worker that took it over. The pieces that hold it:

* **Session fence** ``(worker_id, session_id, generation)``. Opening a session increments the
  worker id's generation: every call of an older session is refused from then on. A session has a
  lease measured by the store's clock (default 45 s), renewed by each heartbeat (default every
  10 s); a session whose lease expired is refused too and must be opened again.
* **Lease fence** ``(attempt_id, lease_version, token)`` per claimed Attempt. The token is at least
  128 random bits, made by the worker (:func:`new_lease_token`); the store keeps only its SHA-256.
  Each claim of an Attempt increments its lease version. Every call after claim is checked against
  the whole session fence and the whole lease fence, and a refused call changes nothing.
* **Started before spawn.** A worker calls ``started`` (dispatching -> running) *before* it spawns
  the process and spawns only if that was accepted and its self-fence deadline is still ahead. So
  an Attempt that expires while ``dispatching`` provably never ran and goes back to the queue; one
  that expires ``running`` may have run and becomes ``lost`` (the retry policy decides, and a lost
  Attempt is retried only for an idempotent task).
* **Self-fencing** (:func:`fence_deadlines`). A worker that cannot renew its session must have
  stopped its jobs (TERM, then KILL to the process group) before its lease can expire in the
  store's time. Its deadline is measured on the monotonic clock from the *start* of its last
  successful heartbeat (the store renewed the lease no earlier than that), minus a margin.
* **Logs before completion.** The worker writes the log locally with the task's limit and ships
  the kept bytes in chunks of at most :data:`MAX_LOG_CHUNK_BYTES`, each at an explicit offset (a
  resent chunk is accepted once, a gap is refused). ``complete`` is refused with
  :attr:`CompletionResult.LOG_INCOMPLETE` until the store holds exactly the bytes it names.
* **Completion exactly once.** An accepted ``complete`` ends the Attempt and applies the retry
  policy in the same transaction; the exact replay of an accepted completion (same fences, same
  outcome) answers :attr:`CompletionResult.ALREADY_DONE`; anything else after the end is refused.

Expiry is not the worker's: every ``qinglong run`` replica ends expired leases, leaderless
(``SKIP LOCKED``, bounded per round, store time), and double-checks timeouts (an Attempt whose
deadline is long past with no completion ends ``timed_out``).

Times are integer epoch milliseconds in the store's clock unless named ``*_mono`` (a worker's
monotonic clock, seconds as :func:`time.monotonic` returns them).
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from .frozen import record
from .errors import QinglongError, quoted
from .execution import LABEL_PATTERN as _LABEL_PATTERN
from .execution import MAX_LABELS as _MAX_LABELS
from .execution import AttemptOutcome, CancelReason, ExecutionSpec, RunState

# --------------------------------------------------------------------------------------------
# Bounds, in one place (the store's functions enforce the same numbers; a test holds them equal)
# --------------------------------------------------------------------------------------------

#: Random bytes in a lease token (256 bits; the design asks at least 128).
LEASE_TOKEN_BYTES = 32
#: The most bytes one ``append_log`` call carries.
MAX_LOG_CHUNK_BYTES = 256 * 1024
#: Bounds of a session lease the store accepts, ms.
MIN_SESSION_LEASE_MS = 5_000
MAX_SESSION_LEASE_MS = 600_000
#: Most Attempts one session may hold at once (a worker's ``max_running`` is capped by it).
MAX_SESSION_CAPACITY = 256
#: Labels (a worker's, a task's): see :data:`~qinglong.contracts.execution.LABEL_PATTERN`.
MAX_LABELS = _MAX_LABELS
LABEL_PATTERN = _LABEL_PATTERN
#: Worker ids: 1-200 characters, no control characters.
MAX_WORKER_ID_CHARS = 200


# --------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------


class FenceRefused(QinglongError):
    """A call the store refused because its fence no longer holds; nothing changed. ``reason`` is
    one of the short codes below, ``message`` says it in words."""

    code = "fence_refused"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class SessionFenced(FenceRefused):
    """The session is not the worker id's current, open, unexpired one (a newer generation
    replaced it, it was closed, or its lease expired): the worker must stop every job it holds
    and open a new session."""

    code = "session_fenced"


class LeaseFenced(FenceRefused):
    """The Attempt is no longer leased to this call's fence (wrong token or lease version, the
    lease expired, the Attempt was taken back, ended or moved on): the worker must stop that job
    and forget it (its outcome is no longer this worker's to report)."""

    code = "lease_fenced"


#: SQLSTATE codes a store raises for the refusals (the PostgreSQL functions ``RAISE`` them; a
#: client maps them back). Class ``QL`` is ours: no PostgreSQL condition uses it.
SQLSTATE_SESSION_FENCED = "QL001"
SQLSTATE_LEASE_FENCED = "QL002"
SQLSTATE_BAD_CALL = "QL003"  # an argument out of bounds (too many labels, a chunk too big, ...)

#: :attr:`SessionFenced.reason` when a store says why: a worker opens a new session after one
#: that expired or was closed, but not after one another process replaced (a newer generation of
#: the same worker id, i.e. a second live worker with this id): opening again would fence that
#: worker, which would do the same in turn.
SESSION_REPLACED = "session_replaced"
SESSION_EXPIRED = "session_expired"
SESSION_CLOSED = "session_closed"


class LogRefused(QinglongError):
    """The store cannot keep more of this Attempt's log (its disk is full, say): the worker stops
    shipping it and completes with the bytes the store holds, the rest counted as missing."""

    code = "log_refused"


class BadWorkerCall(QinglongError):
    """A call with an argument outside the protocol's bounds: a bug in the caller."""

    code = "bad_worker_call"


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


@record
class SessionFence:
    worker_id: str
    session_id: str
    generation: int


@record
class Session:
    """An open session: its fence, its lease, and the store's clock when it was opened."""

    fence: SessionFence
    lease_ms: int
    capacity: int
    labels: tuple[str, ...]
    lease_expires_at_ms: int
    db_now_ms: int


@record
class LeaseFence:
    """What names one claim of one Attempt. ``token`` is the raw secret (the store keeps only
    its SHA-256): never log it."""

    attempt_id: str
    lease_version: int
    token: bytes = field(repr=False)


@record
class ClaimedAttempt:
    """An Attempt leased to this session, with what it runs (its task revision's payload, parsed
    by the worker with :func:`~qinglong.contracts.execution.parse_execution_spec`)."""

    run_id: str
    attempt_id: str
    attempt_no: int
    project_id: str
    task_id: str
    task_revision: int
    scheduled_for_ms: int
    payload: Mapping[str, Any]
    lease: LeaseFence
    lease_expires_at_ms: int
    db_now_ms: int
    #: What an event admitted the Run with (JSON text, at most
    #: :data:`~qinglong.contracts.event_sources.MAX_OCCURRENCE_PAYLOAD_BYTES`), or None; the job
    #: finds it in the file its environment names (``QINGLONG_EVENT_FILE``).
    event_payload: str | None = None


def bounded_event_payload(value: Any) -> str | None:
    """A claim's event payload as the worker hands it to a job: text of at most
    :data:`~qinglong.contracts.event_sources.MAX_OCCURRENCE_PAYLOAD_BYTES` bytes (what admission
    accepts), else None (whatever path carried the claim, a job never gets an unbounded file)."""
    from .event_sources import MAX_OCCURRENCE_PAYLOAD_BYTES

    if not isinstance(value, str) or len(value.encode("utf-8", "replace")) > MAX_OCCURRENCE_PAYLOAD_BYTES:
        return None
    return value


@record
class StopOrder:
    """A heartbeat's order to stop one of the Attempts the worker said it runs: a durable cancel
    request (``reason`` operator, timeout or replaced), or ``lease_lost`` when the Attempt is no
    longer this session's (expired and taken back, or ended by the control plane)."""

    attempt_id: str
    reason: str  # a CancelReason value, or "lease_lost"


LEASE_LOST = "lease_lost"


@record
class HeartbeatReply:
    lease_expires_at_ms: int
    db_now_ms: int
    stop: tuple[StopOrder, ...] = ()


@record
class StartedReply:
    """``deadline_ms``: when the Attempt's timeout expires, in the store's clock."""

    deadline_ms: int
    db_now_ms: int


#: The stop requests a worker makes for its own jobs: its timeout, its drain's shutdown. The
#: others (an operator's, a replacing Run's) are written by the control plane and reach the worker
#: in a heartbeat's stop orders.
OWN_STOP_REASONS = (CancelReason.TIMEOUT, CancelReason.SHUTDOWN)


@record
class OwnStop:
    """A stop request the worker made for its job itself (one of :data:`OWN_STOP_REASONS`),
    stated in the completion that reports the job's end, ``age_ms`` after the worker took it up.
    The store keeps it as the Attempt's cancel request (unless one is there already), dated on
    its own clock from the age, as the local dispatcher writes its own before signalling: so a
    timeout that fired after the job's exit is recorded beside the job's own outcome, and a
    stop on purpose suppresses the retry as anywhere else."""

    reason: CancelReason
    age_ms: int = 0


class CompletionResult(str, enum.Enum):
    ACCEPTED = "accepted"
    ALREADY_DONE = "already_done"      # the exact replay of an accepted completion
    LOG_INCOMPLETE = "log_incomplete"  # ship the missing log bytes first, then complete again


@record
class CompletionReply:
    result: CompletionResult
    #: the Run's state after (a terminal state, or retry_wait when Attempt N+1 was created)
    run_state: RunState
    #: bytes of log the store holds for the Attempt (what ``LOG_INCOMPLETE`` compares)
    log_bytes_stored: int
    next_attempt_no: int | None = None
    next_not_before_ms: int | None = None


@runtime_checkable
class WorkerProtocol(Protocol):
    """The eight calls. Each is one short transaction in the store; a refused call raises
    :class:`SessionFenced` or :class:`LeaseFenced` and changes nothing. A call whose reply was
    lost may be repeated: ``started``, ``append_log`` and ``complete`` are idempotent under the
    same fences, and ``claim`` leases an Attempt to at most one session at a time."""

    async def open_session(self, worker_id: str, labels: Sequence[str], capacity: int,
                           lease_ms: int) -> Session:
        """Open a new session of ``worker_id``: its generation is the previous one's + 1, which
        fences every call of the previous session from now on."""
        ...

    async def heartbeat(self, fence: SessionFence, running: Sequence[str]) -> HeartbeatReply:
        """Renew the session's lease and the leases of the Attempts ``running`` names (every
        Attempt the worker holds; one it does not name runs out its lease). The reply orders
        the worker to stop any of them that has a cancel request or is no longer leased to it."""
        ...

    async def claim(self, fence: SessionFence, tokens: Sequence[bytes]) -> Sequence[ClaimedAttempt]:
        """Lease up to ``len(tokens)`` queued, due Attempts (bounded by the session's free
        capacity), in dispatch order, honouring each task's concurrency policy cluster-wide and
        its required labels; each claimed Attempt gets one of the tokens."""
        ...

    async def started(self, fence: SessionFence, lease: LeaseFence) -> StartedReply:
        """dispatching -> running: the worker is about to spawn the process (it spawns only after
        this returns). Repeating it on a running Attempt under the same fences returns the same."""
        ...

    async def append_log(self, fence: SessionFence, lease: LeaseFence, offset: int, data: bytes) -> int:
        """Store ``data`` at ``offset`` of the Attempt's log; returns the bytes stored in all. A
        chunk already stored (same offset, same bytes) is accepted again without change; a chunk
        past the end (a gap) or differing from what is stored is a :class:`BadWorkerCall`."""
        ...

    async def complete(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome, *,
                       started: bool = True, log_missing_bytes: int = 0,
                       own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        """End the Attempt with ``outcome`` (``outcome.log_bytes`` must equal the bytes shipped)
        and apply the retry policy; ``started`` False when the process could not be spawned;
        ``log_missing_bytes``: bytes of the job's log that could not be shipped (the stored log
        is then marked incomplete); ``own_stop``: the stop request the worker made for this job
        itself, if any (:class:`OwnStop`), recorded with the end; ``exit_age_ms``: how long before
        this call the job exited, on the caller's clock (None: unknown): the Attempt's end is the
        store's now minus it, never before the start, so its duration is the job's, not the drain
        of its output that followed."""
        ...

    async def complete_late(self, worker_id: str, lease: LeaseFence, outcome: AttemptOutcome, *,
                            own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        """End a started Attempt with the outcome its job really had, without a live session: the
        lease token proves it. Accepted while no other Attempt of the Run has been leased (the
        Attempt may have been ended ``lost`` meanwhile, and a retry waiting for its time is
        withdrawn), recorded as late; any other end stands (:class:`LeaseFenced`). The log is
        what the store holds; ``outcome.log_bytes`` beyond it is recorded as a missing tail.
        ``own_stop`` and ``exit_age_ms`` as for :meth:`complete`, under this call's fences."""
        ...

    async def close_session(self, fence: SessionFence) -> None:
        """Close the session (a drained worker): an Attempt it still holds that never started
        goes back to the queue at once, a started one is ended ``lost`` (retry policy applies)."""
        ...

    async def close(self) -> None:
        """Release the connection(s)."""
        ...


@runtime_checkable
class CombinedCompletion(Protocol):
    """An optional addition to :class:`WorkerProtocol` (and to :class:`WorkerGateway`): a job's end
    and the claim for the slot it frees in one store transaction. A protocol without it is served
    by ``complete`` and the worker's own claim loop, which claims for the freed slot as it would
    anyway; one with it saves a round trip per job."""

    async def complete_and_claim(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome,
                                 tokens: Sequence[bytes], *, started: bool = True, log_missing_bytes: int = 0,
                                 own_stop: OwnStop | None = None, exit_age_ms: int | None = None,
                                 ) -> tuple[CompletionReply, Sequence[ClaimedAttempt]]:
        """``complete``, then a claim of up to ``len(tokens)`` Attempts as ``claim`` makes it
        (never waiting), in one transaction: a refusal of either changes nothing and raises as
        ``complete`` raises it. Not idempotent (a repeat would lease other Attempts), so a call
        whose reply was lost is repeated as ``complete`` alone."""
        ...


@record
class WorkerProtocolSpec:
    """What a plugin offers through ``qinglong_worker_protocols``: the store side of the worker
    gateway. ``create_gateway(dsn, application_name, pool_size, *, backend_settings)`` returns a
    :class:`WorkerGateway` (awaitable), the API tier's shared pool; ``backend_settings`` is the
    backend's validated ``[backend]`` section (or None), from which the store learns which role
    the gateway must log in as. Workers speak only to the gateway, never to a store."""

    name: str
    create_gateway: Any  # Callable[[str, str, int, KwArg(backend_settings)], Awaitable[WorkerGateway]]
    description: str = ""


# --------------------------------------------------------------------------------------------
# Registered workers and the gateway (workers speak to the API tier, never to the store)
# --------------------------------------------------------------------------------------------

#: A worker token's secret: this prefix + 43 characters of URL-safe base64 (256 random bits).
WORKER_TOKEN_PREFIX = "qlw_"


def new_worker_token() -> str:
    """A fresh worker token (shown once; the store keeps :func:`worker_token_digest` of it)."""
    return WORKER_TOKEN_PREFIX + secrets.token_urlsafe(32)


def worker_token_digest(secret: str) -> bytes:
    """What the store keeps and looks up of a worker token: its SHA-256 (32 bytes)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


@record
class WorkerRegistration:
    """A registered worker: what its token may do. ``projects`` empty: every project."""

    worker_id: str
    labels: tuple[str, ...]
    projects: tuple[str, ...]
    capacity: int
    created_at_ms: int = 0
    rotated_at_ms: int | None = None
    revoked_at_ms: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "labels": list(self.labels), "projects": list(self.projects),
                "capacity": self.capacity, "created_at_ms": self.created_at_ms,
                "rotated_at_ms": self.rotated_at_ms, "revoked_at_ms": self.revoked_at_ms,
                "state": "revoked" if self.revoked_at_ms is not None else "active"}


@runtime_checkable
class WorkerRegistry(Protocol):
    """Registered workers in a backend's store (the admin's side)."""

    async def register_worker(self, registration: WorkerRegistration, digest: bytes) -> None: ...

    async def rotate_worker(self, worker_id: str, digest: bytes, now_ms: int) -> WorkerRegistration: ...

    async def revoke_worker(self, worker_id: str) -> int: ...

    async def list_workers(self) -> Sequence[WorkerRegistration]: ...


@runtime_checkable
class WorkerGateway(WorkerProtocol, Protocol):
    """The worker protocol as the API tier's gateway holds it: a small bounded pool shared by every
    worker, the lookup of a token's registration, and the wake-up of waiting claims."""

    async def identify(self, digest: bytes) -> WorkerRegistration | None: ...

    def waiter(self) -> Any:
        """An awaitable flag (``wait()``, ``is_set()``, like ``asyncio.Event``) set when an Attempt
        may next have become claimable (taken before a claim that found nothing, so no
        notification in between is missed). A gateway may wake one waiter per notification
        rather than all: its waiter then also offers ``claimed(taken, asked)``, told what the
        claim after the wake-up took, and ``discard()``, called when it is no longer waited on,
        so a wake-up not used goes on to another waiting claim."""
        ...

    async def check(self) -> list[str]:
        """What keeps the gateway from serving (empty when ready)."""
        ...


def check_registration(worker_id: str, labels: Sequence[str], projects: Sequence[str], capacity: int) -> None:
    """Refuse, naming what was expected, a registration the store would refuse (a
    :class:`BadWorkerCall` the CLI reports as a usage error)."""
    import re

    if (not isinstance(worker_id, str) or not 1 <= len(worker_id) <= MAX_WORKER_ID_CHARS
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in worker_id)):
        # a value over the quote's 80 characters is quoted with its length
        raise BadWorkerCall(f"worker id: expected 1-{MAX_WORKER_ID_CHARS} characters without control characters "
                            f"(got {quoted(worker_id)})")
    bad = [label for label in labels if not isinstance(label, str) or not re.match(LABEL_PATTERN, label)]
    if len(labels) > MAX_LABELS or bad:
        got = f"got {quoted(bad[0])}" if bad else f"got {len(labels)}"
        raise BadWorkerCall(f"labels: expected at most {MAX_LABELS}, each 1-64 characters of letters, "
                            f"digits and _ . : = / - ({got})")
    from .store import check_granted_projects

    check_granted_projects("projects", projects)
    if not isinstance(capacity, int) or not 1 <= capacity <= MAX_SESSION_CAPACITY:
        raise BadWorkerCall(f"capacity: expected 1 to {MAX_SESSION_CAPACITY}")


# --------------------------------------------------------------------------------------------
# Pure pieces
# --------------------------------------------------------------------------------------------


def new_lease_token() -> bytes:
    """A fresh lease token: :data:`LEASE_TOKEN_BYTES` bytes from the OS's CSPRNG."""
    return secrets.token_bytes(LEASE_TOKEN_BYTES)


def token_digest(token: bytes) -> bytes:
    """What the store keeps of a token: its SHA-256 (PostgreSQL's ``sha256(bytea)`` is the same)."""
    return hashlib.sha256(token).digest()


@record
class FenceDeadlines:
    """Monotonic instants (seconds) derived from the start of the last successful heartbeat.

    * ``term_at``: send TERM to every job still running if no heartbeat succeeded since;
    * ``kill_at``: KILL whatever is left (``term_at`` + the kill grace);
    * ``fenced_at``: every job is gone; no job may be spawned from here on. It lies ``margin``
      before the earliest instant the store may consider the lease expired.
    """

    term_at: float
    kill_at: float
    fenced_at: float


def fence_deadlines(heartbeat_started_mono: float, lease_ms: int, margin_ms: int,
                    kill_grace_ms: int) -> FenceDeadlines:
    """The self-fence schedule after a heartbeat that started at ``heartbeat_started_mono``.

    The store renewed the lease at its statement time, which is no earlier than the moment the
    worker sent the call, so the lease lasts at least until ``heartbeat_started + lease`` on any
    clock that runs at the store's rate. ``margin_ms`` absorbs clock-rate differences and the time
    a KILL takes to land; the jobs must be dead by ``fenced_at`` = that instant minus the margin.
    """
    if lease_ms <= 0 or margin_ms < 0 or kill_grace_ms < 0:
        raise ValueError("lease must be positive, margin and kill grace not negative")
    fenced_at = heartbeat_started_mono + (lease_ms - margin_ms) / 1000.0
    kill_at = fenced_at - min(1.0, margin_ms / 1000.0) if margin_ms else fenced_at
    term_at = kill_at - kill_grace_ms / 1000.0
    return FenceDeadlines(term_at=term_at, kill_at=kill_at, fenced_at=fenced_at)


def check_worker_timing(lease_ms: int, heartbeat_ms: int, margin_ms: int, kill_grace_ms: int) -> str | None:
    """None when the timing can hold the fence, else what is wrong in words: a worker must be
    able to miss one heartbeat and still stop its jobs (TERM, grace, KILL) inside the lease."""
    if not MIN_SESSION_LEASE_MS <= lease_ms <= MAX_SESSION_LEASE_MS:
        return f"session_lease_ms {lease_ms} is outside {MIN_SESSION_LEASE_MS}..{MAX_SESSION_LEASE_MS}"
    need = 2 * heartbeat_ms + kill_grace_ms + margin_ms + 1000
    if need > lease_ms:
        return (f"session_lease_ms {lease_ms} is too short for heartbeat_ms {heartbeat_ms}, "
                f"kill_grace_ms {kill_grace_ms} and self_fence_margin_ms {margin_ms}: it must be at "
                f"least 2 x heartbeat + kill grace + margin + 1000 = {need}")
    return None


def log_chunks(offset: int, data: bytes, max_bytes: int = MAX_LOG_CHUNK_BYTES) -> list[tuple[int, bytes]]:
    """``data`` (which starts at ``offset`` of the log) cut into ``(offset, chunk)`` pieces of at
    most ``max_bytes``, in order."""
    if max_bytes < 1:
        raise ValueError("max_bytes must be positive")
    return [(offset + i, data[i:i + max_bytes]) for i in range(0, len(data), max_bytes)]


def labels_satisfy(required: Sequence[str], offered: Sequence[str]) -> bool:
    """A task's required labels are met by a worker that offers every one of them."""
    return set(required) <= set(offered)


__all__ = [name for name in dir() if not name.startswith("_")] + ["CancelReason", "ExecutionSpec"]
