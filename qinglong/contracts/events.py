"""Events out: the outbox every store writes, its deliveries, and the notifier contract.

When a Run ends (succeeded, failed, timed out, cancelled, lost), and when a trigger's occurrences
are skipped by its misfire policy, the store writes one :class:`OutboxEvent` **in the same
transaction as the change**: a crash can neither lose one nor invent one. Each event has an id
that never changes (receivers dedupe on it) and a sequence number that orders it.

The host's delivery loop routes each event to the channels that want it (one :class:`Delivery`
per event and channel), sends every delivery at least once through a :class:`Notifier`, in order
per channel and subject (a task, or a trigger for its skips): a delivery waits while an earlier one
of its subject on its channel is pending. A failed send is tried again after
:func:`delivery_retry`'s backoff; after ``max_tries`` it is ``dead`` and stops holding the ones
behind it.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from .frozen import record

#: The Run states an event is written for (every terminal state), as event kinds ``run.<state>``.
RUN_EVENT_STATES = ("succeeded", "failed", "timed_out", "cancelled", "lost")
#: A trigger's occurrences skipped by its misfire policy (an operator-level event).
TRIGGER_SKIPPED = "trigger.skipped"
#: Operator events: a worker's session ended with Runs held (cluster).
WORKER_LOST = "worker.lost"
#: Queued Runs no live worker can take, for longer than a grace (cluster), and the end of that.
QUEUE_STALLED = "queue.stalled"
QUEUE_RESUMED = "queue.resumed"
#: A scheduler without a completed round for a while, and its recovery.
SCHEDULER_NOT_READY = "scheduler.not_ready"
SCHEDULER_READY = "scheduler.ready"
#: An episode's kind -> the kind of the event that ends it (written once per episode each).
EPISODE_RECOVERY = {SCHEDULER_NOT_READY: SCHEDULER_READY, QUEUE_STALLED: QUEUE_RESUMED}
#: The operator events; they go only to the channels that subscribe to them
#: (``operator_events = true``), whatever a task or the default says.
OPERATOR_KINDS = frozenset({WORKER_LOST, QUEUE_STALLED, QUEUE_RESUMED, SCHEDULER_NOT_READY,
                            SCHEDULER_READY})
#: Every event kind a store writes.
EVENT_KINDS = (tuple(f"run.{state}" for state in RUN_EVENT_STATES) + (TRIGGER_SKIPPED,)
               + tuple(sorted(OPERATOR_KINDS)))
#: The kinds that are a failure for ``notify = "on-failure"`` (a cancel is an operator's decision).
FAILURE_KINDS = frozenset({"run.failed", "run.timed_out", "run.lost", TRIGGER_SKIPPED})


class NotifyPolicy(str, enum.Enum):
    """Which of a task's events reach its channels."""

    ON_FAILURE = "on-failure"
    ALWAYS = "always"
    NEVER = "never"


class DeliveryState(str, enum.Enum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


@record
class OutboxEvent:
    """One event as its store wrote it. ``subject`` orders deliveries (``<project>/<task>`` for a
    Run's events, ``<project>/trigger/<trigger>`` for a trigger's); ``notify`` is what the task's
    spec said about notifications when the Run ended (None: the defaults)."""

    event_id: str
    seq: int
    kind: str
    subject: str
    project_id: str
    task_id: str
    trigger_id: str
    run_id: str | None
    state: str | None
    exit_code: int | None
    duration_ms: int | None
    reason: str | None
    at_ms: int
    notify: Mapping[str, Any] | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The event as its receivers read it (the ``seq`` is the store's, not a promise)."""
        return {"event_id": self.event_id, "kind": self.kind, "project": self.project_id or None,
                "task": self.task_id or None, "trigger": self.trigger_id or None,
                "run": self.run_id, "state": self.state, "exit_code": self.exit_code,
                "duration_ms": self.duration_ms, "reason": self.reason, "at_ms": self.at_ms,
                **({"detail": dict(self.detail)} if self.detail else {})}


@record
class Delivery:
    """One event on one channel."""

    event: OutboxEvent
    channel: str
    state: DeliveryState
    tries: int
    next_try_at_ms: int | None
    last_error: str | None
    delivered_at_ms: int | None
    created_at_ms: int


@record
class DeliveryPolicy:
    """How often and how patiently a delivery is tried."""

    max_tries: int = 8
    backoff_ms: int = 1_000
    backoff_cap_ms: int = 300_000

    def __post_init__(self) -> None:
        if self.max_tries < 1 or self.backoff_ms < 0 or self.backoff_cap_ms < self.backoff_ms:
            raise ValueError("delivery policy: expected max_tries >= 1 and 0 <= backoff_ms <= "
                             "backoff_cap_ms")


def delivery_retry(policy: DeliveryPolicy, tries: int) -> int | None:
    """After ``tries`` failed sends (>= 1), the delay before the next one in ms, or None: the
    delivery is dead. The delay doubles from ``backoff_ms`` and never exceeds ``backoff_cap_ms``."""
    if tries < 1:
        raise ValueError(f"tries: expected >= 1, got {tries}")
    if tries >= policy.max_tries:
        return None
    return min(policy.backoff_cap_ms, policy.backoff_ms * (1 << min(tries - 1, 40)))


def wants(event: OutboxEvent, default: NotifyPolicy, channels: Sequence[str],
          operator_channels: Sequence[str] = ()) -> tuple[str, ...]:
    """The channels (of ``channels``, the configured ones, in order) an event goes to.

    A Run's task may say ``notify = {"when": "on-failure" | "always" | "never", "channels": [...]}``
    in its spec; what it leaves out is ``default`` and every configured channel. A trigger's event
    goes to every channel unless the default is ``never``. An operator event
    (:data:`OPERATOR_KINDS`) goes to the channels of ``operator_channels`` and no other."""
    if event.kind in OPERATOR_KINDS:
        return tuple(c for c in channels if c in operator_channels)
    notify = event.notify or {}
    try:
        policy = NotifyPolicy(notify.get("when", default.value))
    except ValueError:
        policy = default
    named = notify.get("channels")
    chosen = [c for c in channels if named is None or c in named]
    if policy is NotifyPolicy.NEVER:
        return ()
    if policy is NotifyPolicy.ON_FAILURE and event.kind not in FAILURE_KINDS:
        return ()
    return tuple(chosen)


def check_notify(task_id: str, value: Any) -> dict[str, Any]:
    """A task's ``notify`` table, checked: ``when`` one of :class:`NotifyPolicy`'s values,
    ``channels`` a list of channel names; nothing else. A refusal names the key."""
    from .errors import UserError

    if not isinstance(value, Mapping):
        raise UserError(f"task {task_id!r}: notify: expected a table with when and/or channels")
    unknown = sorted(str(k) for k in value if k not in ("when", "channels"))
    if unknown:
        raise UserError(f"task {task_id!r}: notify.{unknown[0]}: unknown key (expected when, "
                        "channels)")
    if "when" in value and value["when"] not in {p.value for p in NotifyPolicy}:
        raise UserError(f"task {task_id!r}: notify.when: expected on-failure, always or never")
    channels = value.get("channels", [])
    if (not isinstance(channels, list) or len(channels) > 32
            or not all(isinstance(c, str) and 0 < len(c) <= 63 for c in channels)):
        raise UserError(f"task {task_id!r}: notify.channels: expected a list of channel names")
    return dict(value)


def check_episode(key: str, kind: str, subject: str, reason: str,
                  detail: Mapping[str, Any]) -> None:
    """Refuse, with ``ValueError``, an operator episode a store would not keep: a kind that is
    not a key of :data:`EPISODE_RECOVERY`, an empty or long key or subject, a long reason."""
    if kind not in EPISODE_RECOVERY:
        raise ValueError(f"operator episode: kind {kind!r} is not one of "
                         f"{', '.join(sorted(EPISODE_RECOVERY))}")
    if not 0 < len(key) <= 300 or not 0 < len(subject) <= 300 or len(reason) > 1000:
        raise ValueError("operator episode: expected a key and a subject of 1 to 300 characters "
                         "and a reason of at most 1000")
    if not isinstance(detail, Mapping):
        raise ValueError("operator episode: expected the detail as a mapping")


@runtime_checkable
class EventOutbox(Protocol):
    """The outbox of one store. Each method is one short transaction."""

    async def route(self, choose: Callable[[OutboxEvent], Sequence[str]], now_ms: int,
                    limit: int) -> int:
        """Route up to ``limit`` events not yet routed, in ``seq`` order: one pending delivery per
        channel ``choose`` names (none is fine), then mark the event routed. Returns how many
        events were routed. Routing an event twice creates nothing twice."""
        ...

    async def claim_due(self, now_ms: int, lease_ms: int, limit: int) -> Sequence[Delivery]:
        """Pending deliveries due at ``now_ms`` that head their channel and subject (no earlier
        pending delivery of the subject on the channel) and that no sender holds, oldest first;
        each is held for ``lease_ms`` (another replica's loop skips it meanwhile)."""
        ...

    async def record_try(self, event_id: str, channel: str, *, ok: bool, error: str | None,
                         now_ms: int, retry_in_ms: int | None) -> DeliveryState:
        """Record one send: delivered when ``ok``; else pending again in ``retry_in_ms``, or dead
        when it is None. A delivery already delivered or dead is left as it is. The state after."""
        ...

    async def list_deliveries(self, *, state: DeliveryState | None = None,
                              limit: int = 50) -> Sequence[Delivery]:
        """Deliveries newest first (by event, then channel), optionally of one state."""
        ...

    async def list_events(self, *, limit: int = 50) -> Sequence[OutboxEvent]:
        """Events newest first."""
        ...

    async def prune(self, older_than_ms: int, limit: int) -> int:
        """Delete up to ``limit`` routed events older than ``older_than_ms`` whose deliveries all
        ended (delivered or dead), with those deliveries; the number of events deleted."""
        ...

    async def operator_episode(self, key: str, kind: str, *, active: bool, subject: str,
                               reason: str, detail: Mapping[str, Any]) -> bool:
        """Open (``active``) or close the episode ``key`` of an operator condition ``kind`` (a key
        of :data:`EPISODE_RECOVERY`), in one transaction: the first opening writes a ``kind``
        event, the first close after it the recovery event (its detail adds ``since_ms``, when the
        episode opened); any other call writes nothing. Whether an event was written."""
        ...

    async def run_context(self, run_id: str, max_log_bytes: int) -> "RunContext":
        """What a message about the Run shows beyond its event: the tail of its last Attempt's log
        and the values of its task's environment (to redact from that tail)."""
        ...


@record
class RunContext:
    log_tail: bytes = b""
    #: The tail does not start at the log's start (its first line is partial).
    log_cut: bool = False
    env_values: tuple[str, ...] = ()


@record
class Message:
    """What a notifier sends: the event, and for a Run the last lines of its log (the task's env
    values already redacted)."""

    event: OutboxEvent
    log_lines: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**self.event.to_json(), "log_tail": list(self.log_lines)}

    def subject_line(self) -> str:
        e = self.event
        if e.run_id is not None:
            return f"[qinglong] {e.project_id}/{e.task_id}: run {e.state}"
        if e.kind in OPERATOR_KINDS:
            return f"[qinglong] {e.kind}: {e.subject}"
        return f"[qinglong] {e.project_id}: trigger {e.trigger_id} skipped occurrences"

    def text(self) -> str:
        """The message as plain text (mail bodies, push services)."""
        e = self.event
        lines = [self.subject_line(), f"event: {e.event_id}"]
        if e.run_id is not None:
            lines += [f"run: {e.run_id}", f"state: {e.state}", f"exit code: {e.exit_code}",
                      f"duration: {'-' if e.duration_ms is None else f'{e.duration_ms / 1000:.1f} s'}"]
        if e.reason:
            lines.append(f"reason: {e.reason}")
        if self.log_lines:
            lines += ["", "last lines of the log:", *self.log_lines]
        return "\n".join(lines) + "\n"


REDACTED = "[redacted]"


def redact_values(text: str, values: Sequence[str]) -> str:
    """``text`` with every occurrence of each value (longest first; values shorter than 4
    characters are left, they would blank common words) replaced by ``[redacted]``."""
    for value in sorted({v for v in values if isinstance(v, str) and len(v) >= 4}, key=len,
                        reverse=True):
        text = text.replace(value, REDACTED)
    return text


def log_tail_lines(tail: bytes, env_values: Sequence[str], max_lines: int, *,
                   cut: bool = False) -> tuple[str, ...]:
    """The last ``max_lines`` lines of a log tail, decoded (bad bytes replaced), with the env
    values redacted. ``cut``: the tail does not start at the log's start, so its first line is
    partial and dropped."""
    if max_lines <= 0 or not tail:
        return ()
    lines = tail.decode("utf-8", "replace").splitlines()
    if cut and lines:
        lines = lines[1:]
    return tuple(redact_values(line, env_values) for line in lines[-max_lines:])


class DeliveryFailed(Exception):
    """A notifier could not deliver; the words are safe to store and show (no secret)."""


@runtime_checkable
class Notifier(Protocol):
    """One configured channel. ``send`` delivers or raises (any exception is a failed try; the
    loop stores :class:`DeliveryFailed`'s words, or only the exception's type for others, so a
    secret in some library's message never reaches the store)."""

    name: str

    async def send(self, message: Message) -> None:
        ...


@record(slots=False)
class NotifierSpec:
    """A kind of channel a plugin offers (hook ``qinglong_notifiers``): ``create(name, options)``
    builds a :class:`Notifier` from one ``[notifications.channels.<name>]`` table, raising
    ``ValueError`` with a clear message for bad options (never echoing a secret)."""

    kind: str
    create: Callable[[str, Mapping[str, Any]], Notifier]
    description: str = ""


__all__ = ["RUN_EVENT_STATES", "TRIGGER_SKIPPED", "EVENT_KINDS", "FAILURE_KINDS", "NotifyPolicy",
           "WORKER_LOST", "QUEUE_STALLED", "QUEUE_RESUMED", "SCHEDULER_NOT_READY",
           "SCHEDULER_READY", "EPISODE_RECOVERY", "OPERATOR_KINDS",
           "DeliveryState", "OutboxEvent", "Delivery", "DeliveryPolicy", "delivery_retry", "wants",
           "check_notify", "check_episode",
           "EventOutbox", "RunContext", "Message", "REDACTED", "redact_values", "log_tail_lines",
           "DeliveryFailed", "Notifier", "NotifierSpec"]
