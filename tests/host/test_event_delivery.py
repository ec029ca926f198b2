"""The delivery loop over a real SQLite store: Runs ended through the execution store, events
routed, sent through notifiers, retried with backoff, dead after the last try; what a failed try
stores never holds a secret."""

from __future__ import annotations

import asyncio

from hypothesis import given, strategies as st

from qinglong.contracts.events import (
    DeliveryFailed,
    DeliveryPolicy,
    DeliveryState,
    NotifyPolicy,
    delivery_retry,
    log_tail_lines,
    redact_values,
)
from qinglong.contracts.execution import CancelReason
from qinglong.contracts.store import BackendContext, SchedulerLimits
from qinglong.host.events import DeliveryLoop
from tests.support.aio import closing


class Sink:
    def __init__(self) -> None:
        self.events = []

    def emit(self, event) -> None:
        self.events.append(event)


class Clock:
    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


class Recorder:
    """A channel that records what it was sent and fails its first ``fail`` sends."""

    def __init__(self, name: str, fail: int = 0, error: Exception | None = None) -> None:
        self.name = name
        self.fail = fail
        self.error = error or DeliveryFailed("HTTP 503")
        self.sent = []

    async def send(self, message) -> None:
        if self.fail:
            self.fail -= 1
            raise self.error
        self.sent.append(message)


async def open_store(path, clock):
    from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

    backend = create_backend(BackendContext(
        settings=EdgeSqliteSettings(path=str(path)),
        limits=SchedulerLimits(page_size=32, claim_budget=16, lease_ms=30_000, cadence_ms=1000),
        providers={}, diagnostics=Sink(), clock_ms=clock, owner="test"))
    await backend.open()
    await backend.migrate()
    pub = backend.publisher()
    await pub.create_project("p1")
    await pub.put_task("p1", "t1", {"command": ["true"], "env": {"API_KEY": "hunter2-secret"}})
    await pub.put_task("p1", "quiet", {"command": ["true"], "notify": {"when": "never"}})
    return backend


async def end_runs(backend, clock, task: str, n: int) -> list[str]:
    store = backend.execution()
    ids = []
    for i in range(n):
        run_id, _ = await store.admit_manual_run("p1", task, f"{task}-{i}-{clock.ms}", clock.ms)
        await store.request_cancel(run_id, CancelReason.OPERATOR, clock.ms)
        ids.append(run_id)
    return ids


def loop_of(backend, clock, notifiers, **kw):
    return DeliveryLoop(backend.outbox(), {n.name: n for n in notifiers}, Sink(), clock,
                        default_notify=NotifyPolicy.ALWAYS, **kw)


def test_each_event_is_delivered_once_per_channel_in_order_with_its_stable_id(tmp_path):
    """Receivers dedupe on the event id and read a task's events in order: a second delivery of
    a delivered event, a reordering, or an event of a task whose notify is never, would break
    them."""
    async def body():
        clock = Clock()
        backend = await open_store(tmp_path / "q.db", clock)
        async with closing(backend):
            runs = await end_runs(backend, clock, "t1", 3)
            await end_runs(backend, clock, "quiet", 1)
            hook, mail = Recorder("hook"), Recorder("mail")
            loop = loop_of(backend, clock, [hook, mail])
            while await loop.run_once():
                pass
            assert await loop.run_once() == 0
            for channel in (hook, mail):
                assert [m.event.run_id for m in channel.sent] == runs
            assert [m.event.event_id for m in hook.sent] == [m.event.event_id for m in mail.sent]
            ids = {d.event.event_id for d in await backend.outbox().list_deliveries()}
            assert len(ids) == 3

    asyncio.run(body())


def test_a_failing_channel_is_retried_with_backoff_then_dead_and_releases_the_next(tmp_path):
    """A receiver that is down must get the event again later (not lost), not in a hot loop,
    and a receiver down for good must not hold the task's later events for ever."""
    async def body():
        clock = Clock()
        backend = await open_store(tmp_path / "q.db", clock)
        async with closing(backend):
            first, second = await end_runs(backend, clock, "t1", 2)
            hook = Recorder("hook", fail=3)
            sink = Sink()
            loop = DeliveryLoop(backend.outbox(), {"hook": hook}, sink, clock,
                                policy=DeliveryPolicy(max_tries=3, backoff_ms=1000,
                                                      backoff_cap_ms=1500),
                                default_notify=NotifyPolicy.ALWAYS)
            assert await loop.run_once() == 1  # try 1 of the first fails
            assert await loop.run_once() == 0  # its backoff runs; the second waits behind it
            clock.ms += 999
            assert await loop.run_once() == 0
            clock.ms += 1
            assert await loop.run_once() == 1  # try 2 fails: next in 1500 (capped, not 2000)
            clock.ms += 1499
            assert await loop.run_once() == 0
            clock.ms += 1
            assert await loop.run_once() == 1  # try 3 fails: dead
            assert await loop.run_once() == 1  # the second goes, and is delivered
            states = {d.event.run_id: (d.state, d.tries, d.last_error)
                      for d in await backend.outbox().list_deliveries()}
            assert states == {first: (DeliveryState.DEAD, 3, "HTTP 503"),
                              second: (DeliveryState.DELIVERED, 1, None)}
            assert [m.event.run_id for m in hook.sent] == [second]
            assert [e.code for e in sink.events if e.level == "error"] == ["events.delivery_dead"]

    asyncio.run(body())


def test_a_failed_try_stores_no_library_message_that_could_hold_a_secret(tmp_path):
    """A client library's error may quote a URL with its credentials: the store (and so
    `qinglong notifications`) must keep only the error's type."""
    async def body():
        clock = Clock()
        backend = await open_store(tmp_path / "q.db", clock)
        async with closing(backend):
            await end_runs(backend, clock, "t1", 1)
            hook = Recorder("hook", fail=1,
                            error=OSError("connect to https://user:pa55word@example failed"))
            loop = loop_of(backend, clock, [hook])
            await loop.run_once()
            [d] = await backend.outbox().list_deliveries()
            assert d.last_error == "OSError" and d.state is DeliveryState.PENDING

    asyncio.run(body())


@given(st.integers(1, 100), st.integers(0, 10_000), st.integers(0, 100_000), st.integers(1, 200))
def test_delivery_retry_doubles_within_the_cap_and_ends_at_max_tries(max_tries, base, extra, tries):
    policy = DeliveryPolicy(max_tries, base, base + extra)
    delay = delivery_retry(policy, tries)
    if tries >= max_tries:
        assert delay is None
    else:
        assert delay == min(base + extra, base * 2 ** (tries - 1))
        if tries > 1:
            assert delay >= delivery_retry(policy, tries - 1)


@given(st.lists(st.text(min_size=4, max_size=12), max_size=4), st.text(max_size=80))
def test_redaction_leaves_no_env_value_of_four_characters_or_more(values, text):
    line = text + "".join(values)
    out = redact_values(line, values)
    for v in values:
        if v not in "[redacted]":
            assert v not in out or v in "[redacted]"


def test_log_tail_lines_keeps_the_last_lines_and_drops_a_cut_first_line():
    tail = b"tial first\nsecond\nthird API=hunter2x\n"
    assert log_tail_lines(tail, ["hunter2x"], 10, cut=True) == ("second", "third API=[redacted]")
    assert log_tail_lines(tail, [], 1) == ("third API=hunter2x",)
