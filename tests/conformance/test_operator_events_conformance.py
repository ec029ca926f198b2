"""Operator episodes on every store (SQLite, PostgreSQL 18 and 15): an episode's event is written
with the change that opens it, once however often it is opened again, and its recovery event with
the change that closes it, once; what the delivery loop routes them to is only the channels that
subscribe to operator events."""

from __future__ import annotations

import pytest

from qinglong.contracts.events import NotifyPolicy, wants


def outbox(h):
    return h.backend.outbox()


async def episode(h, active: bool, key: str = "scheduler.not_ready/r1") -> bool:
    return await outbox(h).operator_episode(
        key, "scheduler.not_ready", active=active, subject="scheduler/r1",
        reason="no completed round", detail={"owner": "r1"})


async def test_an_episode_is_announced_once_and_recovers_once(harness):
    """A scheduler watch asks every few seconds while the scheduler is down, from every replica:
    a second not_ready or a second ready would page an operator twice for one outage."""
    assert await episode(harness, False) is False  # nothing open: no recovery to announce
    assert await episode(harness, True) is True
    assert await episode(harness, True) is False
    assert await episode(harness, False) is True
    assert await episode(harness, False) is False
    events = list(reversed(await outbox(harness).list_events()))
    assert [(e.kind, e.subject, e.run_id, e.project_id) for e in events] == [
        ("scheduler.not_ready", "scheduler/r1", None, ""),
        ("scheduler.ready", "scheduler/r1", None, "")]
    assert events[0].detail == {"owner": "r1"}
    assert events[1].detail["since_ms"] >= events[0].at_ms - 1000
    assert events[0].event_id != events[1].event_id


async def test_episodes_of_different_keys_are_separate_and_a_new_one_follows_a_recovery(harness):
    """Two replicas not ready are two outages; an outage after a recovery is a new one: merging
    them would hide the second."""
    assert await episode(harness, True, "scheduler.not_ready/a") is True
    assert await episode(harness, True, "scheduler.not_ready/b") is True
    assert await episode(harness, False, "scheduler.not_ready/a") is True
    assert await episode(harness, True, "scheduler.not_ready/a") is True
    kinds = [e.kind for e in reversed(await outbox(harness).list_events())]
    assert kinds == ["scheduler.not_ready", "scheduler.not_ready", "scheduler.ready",
                     "scheduler.not_ready"]


async def test_an_unknown_episode_kind_is_refused_and_writes_nothing(harness):
    """Only the operator kinds open episodes: another kind would forge a Run's event."""
    with pytest.raises(ValueError, match="kind 'run.failed'"):
        await outbox(harness).operator_episode("k", "run.failed", active=True, subject="s",
                                               reason="r", detail={})
    assert await outbox(harness).list_events() == []


async def test_operator_events_are_routed_only_to_subscribing_channels(harness):
    """A channel that did not subscribe (a team's task hook) must not receive operator pages,
    and one that did must receive them whatever the default says."""
    await episode(harness, True)

    def choose(event):
        return wants(event, NotifyPolicy.NEVER, ("team", "ops"), ("ops",))

    assert await outbox(harness).route(choose, await harness.now_ms(), 10) == 1
    [delivery] = await outbox(harness).list_deliveries()
    assert (delivery.channel, delivery.event.kind) == ("ops", "scheduler.not_ready")


class _Sink:
    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)


async def test_the_scheduler_watch_writes_not_ready_once_and_ready_once_across_a_restart(harness):
    """The host's watch on its scheduler: rounds failing past the bound are one not_ready however
    often it looks; a process killed while not ready leaves the episode open in the store, and
    the next start's first completed round writes the recovery (it is neither lost nor
    doubled)."""
    from qinglong.host.events import SchedulerWatch

    clock = [0]
    ok = object()

    def watch():
        return SchedulerWatch(outbox(harness), _Sink(), lambda: clock[0], "r1", after_ms=1000)

    first = watch()
    first.observe_round(ok, 1)
    await first.check()
    first.observe_round(None, 1)
    clock[0] = 900
    await first.check()
    assert await outbox(harness).list_events() == []  # within the bound: no alarm
    clock[0] = 1500
    await first.check()
    clock[0] = 3000
    await first.check()
    assert [e.kind for e in await outbox(harness).list_events()] == ["scheduler.not_ready"]
    # the process dies here; a new one starts and completes a round
    second = watch()
    clock[0] = 4000
    second.observe_round(ok, 1)
    await second.check()
    await second.check()
    kinds = [e.kind for e in reversed(await outbox(harness).list_events())]
    assert kinds == ["scheduler.not_ready", "scheduler.ready"]
    assert (first.written, second.written) == (1, 1)
