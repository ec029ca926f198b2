"""The delivery loop: every event of the store's outbox reaches its channels at least once.

A lifecycle component of ``qinglong run`` (the ``stack`` phase), on every profile whose backend
keeps an outbox (:class:`~qinglong.contracts.capabilities.EventingBackend`). Each pass:

1. routes the events not routed yet to the channels that want them
   (:func:`~qinglong.contracts.events.wants`: the task's ``notify`` table, else the settings'
   default), one pending delivery per event and channel, in one transaction;
2. claims the deliveries due that head their channel and subject (order per task), holding each
   for ``lease_ms`` so another replica's loop leaves it alone;
3. sends them (at most ``concurrency`` at once), each bounded by ``send_timeout_ms``, and records
   the try: delivered, pending again after :func:`~qinglong.contracts.events.delivery_retry`'s
   backoff, or dead after ``max_tries``;
4. once a minute, deletes one batch of events older than the retention whose deliveries all
   ended, with those deliveries.

A crash between a send and its record sends the delivery again after its lease: at least once,
with the same event id, which receivers dedupe on. A failed try stores only what is safe to show:
:class:`~qinglong.contracts.events.DeliveryFailed`'s words, else the exception's type.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Mapping, Sequence

from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.events import (
    Delivery,
    DeliveryFailed,
    DeliveryPolicy,
    DeliveryState,
    EventOutbox,
    Message,
    Notifier,
    NotifyPolicy,
    SCHEDULER_NOT_READY,
    delivery_retry,
    log_tail_lines,
    wants,
)
from qinglong.contracts.hookspecs import ComponentPhase

#: How often a pass also deletes ended deliveries older than the retention (one batch).
PRUNE_EVERY_MS = 60_000
#: The longest error text a try records.
MAX_ERROR_CHARS = 300


def safe_error(exc: BaseException) -> str:
    """What a failed try records: a notifier's own words, else only the exception's type (a
    library's message may quote a URL with its credentials)."""
    if isinstance(exc, DeliveryFailed):
        text = str(exc) or "delivery failed"
    elif isinstance(exc, asyncio.TimeoutError):
        text = "timed out"
    else:
        text = exc.__class__.__name__
    return text[:MAX_ERROR_CHARS]


class DeliveryLoop:
    """Routes, sends and records the outbox's events (see the module)."""

    name = "event-delivery"
    phase = ComponentPhase.STACK

    def __init__(self, outbox: EventOutbox, notifiers: Mapping[str, Notifier],
                 diagnostics: DiagnosticSink, clock_ms: Callable[[], int], *,
                 policy: DeliveryPolicy = DeliveryPolicy(),
                 default_notify: NotifyPolicy = NotifyPolicy.ON_FAILURE, poll_ms: int = 500,
                 batch: int = 100, lease_ms: int = 60_000, send_timeout_ms: int = 10_000,
                 concurrency: int = 8, log_lines: int = 20, log_bytes: int = 16_384,
                 retention_ms: int = 7 * 86_400_000,
                 operator_channels: Sequence[str] = ()) -> None:
        self._outbox = outbox
        self._notifiers = dict(notifiers)
        self._channels = tuple(self._notifiers)
        self._operator_channels = tuple(operator_channels)
        self._diagnostics = diagnostics
        self._clock_ms = clock_ms
        self._policy = policy
        self._default = default_notify
        self._poll_s = poll_ms / 1000
        self._batch = batch
        self._lease_ms = lease_ms
        self._send_timeout_s = send_timeout_ms / 1000
        self._limit = asyncio.Semaphore(concurrency)
        self._log_lines = log_lines
        self._log_bytes = log_bytes
        self._retention_ms = retention_ms
        self._next_prune_ms: int | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Counters (the HTTP surface's metrics and the tests read them).
        self.delivered = 0
        self.failed_tries = 0
        self.dead = 0
        self.passes = 0
        self.pruned = 0

    def choose(self, event) -> Sequence[str]:
        return wants(event, self._default, self._channels, self._operator_channels)

    def wake(self, *_: object) -> None:
        """Start the next pass now (a Run just ended)."""
        self._wake.set()

    #: The lifecycle calls this with each Run end its dispatcher records (edge, standalone).
    on_run_finished = wake

    async def message(self, delivery: Delivery) -> Message:
        event = delivery.event
        if event.run_id is None or self._log_lines <= 0:
            return Message(event)
        context = await self._outbox.run_context(event.run_id, self._log_bytes)
        return Message(event, log_tail_lines(context.log_tail, context.env_values,
                                             self._log_lines, cut=context.log_cut))

    async def _send(self, delivery: Delivery) -> None:
        notifier = self._notifiers.get(delivery.channel)
        ok, error = False, None
        async with self._limit:
            try:
                if notifier is None:
                    raise DeliveryFailed(f"channel {delivery.channel!r} is not configured")
                message = await self.message(delivery)
                await asyncio.wait_for(notifier.send(message), self._send_timeout_s)
                ok = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = safe_error(exc)
        retry_in = None if ok else delivery_retry(self._policy, delivery.tries + 1)
        state = await self._outbox.record_try(delivery.event.event_id, delivery.channel, ok=ok,
                                              error=error, now_ms=self._clock_ms(),
                                              retry_in_ms=retry_in)
        if ok:
            self.delivered += 1
            return
        self.failed_tries += 1
        fields = {"event_id": delivery.event.event_id, "channel": delivery.channel,
                  "tries": delivery.tries + 1, "error": error}
        if state is DeliveryState.DEAD:
            self.dead += 1
            self._diagnostics.emit(DiagnosticEvent(
                "error", "events.delivery_dead",
                f"an event was not delivered on channel {delivery.channel!r} after "
                f"{delivery.tries + 1} tries", fields))
        else:
            self._diagnostics.emit(DiagnosticEvent(
                "warning", "events.delivery_failed",
                f"an event could not be delivered on channel {delivery.channel!r}; "
                f"trying again in {retry_in} ms", fields))

    async def run_once(self) -> int:
        """One pass; the number of deliveries tried."""
        self.passes += 1
        now = self._clock_ms()
        while await self._outbox.route(self.choose, now, self._batch) >= self._batch:
            await asyncio.sleep(0)
        due = await self._outbox.claim_due(self._clock_ms(), self._lease_ms, self._batch)
        if due:
            await asyncio.gather(*(self._send(d) for d in due))
        if self._next_prune_ms is None or now >= self._next_prune_ms:
            self._next_prune_ms = now + PRUNE_EVERY_MS
            self.pruned += await self._outbox.prune(now - self._retention_ms, self._batch)
        return len(due)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            tried = 0
            try:
                tried = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._diagnostics.emit(DiagnosticEvent(
                    "error", "events.pass_failed",
                    f"an event delivery pass failed: {exc.__class__.__name__}: {exc}"))
            if tried:
                continue  # a send may have released the next delivery of its subject
            waits = [asyncio.ensure_future(self._stopping.wait()),
                     asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(waits, timeout=self._poll_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="qinglong-events")

    async def stop(self) -> None:
        """Finish the current pass (its sends are bounded by ``send_timeout_ms``), start no other."""
        self._stopping.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None

class SchedulerWatch:
    """Writes ``scheduler.not_ready`` once when this process's scheduler has completed no round
    for ``after_ms`` (rounds failing, the loop gone), and ``scheduler.ready`` once at its first
    completed round after that, each through the outbox's episode (keyed by the scheduler's
    owner), so a restart neither repeats nor loses one.

    A store that cannot be reached cannot take the first event while it is down: the watch keeps
    the episode's start and writes both once a round completes again. At start it closes an
    episode a previous run of the same owner left open (that run stopped while not ready)."""

    name = "scheduler-watch"
    phase = ComponentPhase.STACK

    def __init__(self, outbox: EventOutbox, diagnostics: DiagnosticSink,
                 clock_ms: Callable[[], int], owner: str, *, after_ms: int,
                 check_ms: int | None = None) -> None:
        self._outbox = outbox
        self._diagnostics = diagnostics
        self._clock_ms = clock_ms
        self._owner = owner
        self._key = f"scheduler.not_ready/{owner}"
        self._after_ms = after_ms
        self._check_s = (check_ms if check_ms is not None else min(5_000, max(100, after_ms // 4))) / 1000
        self._last_ok_ms: int | None = None
        self._failures = 0
        #: the start of an episode not written yet (the store may be what is down)
        self._unwritten_since: int | None = None
        #: an episode may be open in the store (at start: a previous run may have left one)
        self._maybe_open = True
        self._started_ms = clock_ms()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Events this watch wrote (tests read them).
        self.written = 0

    def observe_round(self, report: object, elapsed_ms: int) -> None:
        """A round ended (``report`` None: it failed)."""
        if report is None:
            self._failures += 1
            return
        self._failures = 0
        self._last_ok_ms = self._clock_ms()
        if self._unwritten_since is not None or self._maybe_open:
            self._wake.set()

    def _detail(self, since_ms: int, now_ms: int) -> dict:
        return {"owner": self._owner, "last_round_ms": self._last_ok_ms, "since_ms": since_ms,
                "failed_rounds": self._failures, "after_ms": self._after_ms,
                "checked_at_ms": now_ms}

    async def check(self) -> None:
        """One look: open the episode when the scheduler is not ready, close it when it is."""
        now = self._clock_ms()
        since = self._last_ok_ms if self._last_ok_ms is not None else self._started_ms
        if now - since >= self._after_ms:
            if self._unwritten_since is None:
                self._unwritten_since = since
            await self._open(now)
            return
        if self._unwritten_since is not None and self._last_ok_ms is not None:
            await self._open(now)  # the store was down: the episode is written as it ends
        if self._maybe_open and self._unwritten_since is None and self._last_ok_ms is not None:
            if await self._outbox.operator_episode(
                    self._key, SCHEDULER_NOT_READY, active=False, subject=f"scheduler/{self._owner}",
                    reason=f"scheduler {self._owner}: rounds complete again",
                    detail={"owner": self._owner, "last_round_ms": self._last_ok_ms}):
                self.written += 1
                self._diagnostics.emit(DiagnosticEvent(
                    "info", "events.scheduler_ready", "the scheduler completes rounds again",
                    {"owner": self._owner}))
            self._maybe_open = False

    async def _open(self, now: int) -> None:
        since = self._unwritten_since
        assert since is not None
        if await self._outbox.operator_episode(
                self._key, SCHEDULER_NOT_READY, active=True, subject=f"scheduler/{self._owner}",
                reason=(f"scheduler {self._owner}: no completed round for "
                        f"{(now - since) // 1000} s"),
                detail=self._detail(since, now)):
            self.written += 1
            self._diagnostics.emit(DiagnosticEvent(
                "warning", "events.scheduler_not_ready",
                f"the scheduler has completed no round for {(now - since) // 1000} s",
                {"owner": self._owner}))
        self._unwritten_since = None
        self._maybe_open = True

    async def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store may be down: look again at the next tick
                self._diagnostics.emit(DiagnosticEvent(
                    "warning", "events.scheduler_watch_failed",
                    f"the scheduler watch could not write to the store: {exc.__class__.__name__}"))
            waits = [asyncio.ensure_future(self._stopping.wait()),
                     asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(waits, timeout=self._check_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    async def start(self) -> None:
        self._started_ms = self._clock_ms()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="qinglong-scheduler-watch")

    async def stop(self) -> None:
        """Stop looking (a stop is orderly: it is no episode)."""
        self._stopping.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None


__all__ = ["DeliveryLoop", "SchedulerWatch", "safe_error"]
