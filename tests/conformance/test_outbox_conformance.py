"""The outbox on every store (SQLite, PostgreSQL 18 and 15): an event per Run end and per skip,
written with the change; routing, the per-subject order of deliveries, leases and tries.

Runs are admitted by real rounds and ended through each store's own operator path (the SQLite
execution store's cancel, the cluster's ``request_cancel`` function), so the event comes from the
same statement that ends the Run in production.
"""

from __future__ import annotations

import pytest

from qinglong.contracts.events import DeliveryState
from qinglong.contracts.execution import CancelReason, RunState
from qinglong.testing.conformance.store import every_second, initialized, seed

SECOND = 1000


def outbox(h):
    return h.backend.outbox()


async def cancel(h, run_id: str) -> RunState:
    if h.name == "sqlite":
        return await h.backend.execution().request_cancel(run_id, CancelReason.OPERATOR,
                                                          await h.now_ms())
    return await h.backend.run_control().request_cancel(run_id, CancelReason.OPERATOR)


async def admitted_runs(h, n: int, trigger_id: str = "a", task: str = "t1") -> list[str]:
    """Admit ``n`` Runs of an every-second trigger through real rounds; their ids, oldest first."""
    await initialized(h, trigger_id, every_second(trigger_id, task=task))
    await h.elapse(n * SECOND)
    report = await h.run_round()
    assert report.admitted >= n, report
    runs = await h.reader.recent_runs(limit=100, trigger_id=trigger_id)
    return [r.run_id for r in sorted(runs, key=lambda r: r.scheduled_for_ms)][:n]


def everyone(event):
    return ["hook", "mail"]


async def test_a_run_that_ends_writes_one_event_with_its_outcome(harness):
    """A Run ended by an operator gets exactly one event naming it, its task and its state; a
    second cancel of the ended Run writes none (a duplicate notification would be sent)."""
    await seed(harness)
    [run_id] = await admitted_runs(harness, 1)
    assert await outbox(harness).list_events() == []
    assert await cancel(harness, run_id) is RunState.CANCELLED
    assert await cancel(harness, run_id) is RunState.CANCELLED
    [event] = await outbox(harness).list_events()
    assert (event.kind, event.run_id, event.state, event.project_id, event.task_id,
            event.trigger_id, event.subject) == ("run.cancelled", run_id, "cancelled", "p1", "t1",
                                                 "a", "p1/t1")
    assert event.reason and len(event.event_id) >= 32
    assert event.to_json()["event_id"] == event.event_id


async def test_a_run_still_in_flight_writes_no_event(harness):
    """Admission alone is no outcome: an event for a queued Run would announce an end that did
    not happen."""
    await seed(harness)
    await admitted_runs(harness, 2)
    assert await outbox(harness).list_events() == []


async def test_a_skip_writes_a_trigger_skipped_event(harness):
    """Occurrences skipped by the misfire policy are an operator event: losing it hides that
    scheduled work did not run."""
    await seed(harness)
    await initialized(harness, "a", every_second("a", grace_ms=1500))
    await harness.elapse(10 * SECOND)
    report = await harness.run_round()
    assert report.skipped == 1, report
    [event] = await outbox(harness).list_events()
    assert (event.kind, event.trigger_id, event.task_id, event.run_id) == (
        "trigger.skipped", "a", "t1", None)
    assert event.subject == "p1/trigger/a"
    assert event.detail["count"] >= 1 and event.detail["policy"] == "fire_once"


async def test_routing_twice_creates_each_delivery_once(harness):
    """Routing is at least once (a crash after routing, before its commit is seen, routes again):
    it must never create a second delivery of one event on one channel."""
    await seed(harness)
    [run_id] = await admitted_runs(harness, 1)
    await cancel(harness, run_id)
    now = await harness.now_ms()
    assert await outbox(harness).route(everyone, now, 10) == 1
    assert await outbox(harness).route(everyone, now, 10) == 0
    deliveries = await outbox(harness).list_deliveries()
    assert sorted(d.channel for d in deliveries) == ["hook", "mail"]
    assert {d.state for d in deliveries} == {DeliveryState.PENDING}


async def test_deliveries_of_one_task_go_in_order_on_each_channel(harness):
    """The second event of a task on a channel waits while the first is pending (also while it
    waits for a retry), and goes once the first is delivered or dead; another channel is not held
    back by this one."""
    await seed(harness)
    first, second = await admitted_runs(harness, 2)
    await cancel(harness, first)
    await cancel(harness, second)
    box = outbox(harness)
    now = await harness.now_ms()
    await box.route(everyone, now, 10)
    due = await box.claim_due(now, 60_000, 10)
    assert sorted((d.event.run_id, d.channel) for d in due) == sorted(
        [(first, "hook"), (first, "mail")])
    # the first fails on hook and waits 0 ms for its retry: it still heads its subject
    state = await box.record_try(due[0].event.event_id, "hook", ok=False, error="refused",
                                 now_ms=now, retry_in_ms=0)
    assert state is DeliveryState.PENDING
    assert await box.record_try(due[0].event.event_id, "mail", ok=True, error=None, now_ms=now,
                                retry_in_ms=None) is DeliveryState.DELIVERED
    due = await box.claim_due(now, 60_000, 10)
    assert sorted((d.event.run_id, d.channel, d.tries) for d in due) == sorted(
        [(first, "hook", 1), (second, "mail", 0)])
    # dead: the one behind it goes
    assert await box.record_try(due[0].event.event_id if due[0].channel == "hook" else
                                due[1].event.event_id, "hook", ok=False, error="refused",
                                now_ms=now, retry_in_ms=None) is DeliveryState.DEAD
    due = await box.claim_due(now, 60_000, 10)
    assert [(d.event.run_id, d.channel) for d in due] == [(second, "hook")]
    states = {(d.event.run_id, d.channel): (d.state, d.tries, d.last_error)
              for d in await box.list_deliveries()}
    assert states[(first, "hook")] == (DeliveryState.DEAD, 2, "refused")
    assert states[(first, "mail")] == (DeliveryState.DELIVERED, 1, None)


async def test_a_held_delivery_is_not_claimed_again_until_its_lease_ends(harness):
    """Two senders (replicas) must not send one delivery together; a sender that died leaves it
    to the next after its lease, so it is never lost either."""
    await seed(harness)
    [run_id] = await admitted_runs(harness, 1)
    await cancel(harness, run_id)
    box = outbox(harness)
    now = await harness.now_ms()
    await box.route(lambda e: ["hook"], now, 10)
    [held] = await box.claim_due(now, 5_000, 10)
    assert await box.claim_due(now + 4_999, 5_000, 10) == []
    [again] = await box.claim_due(now + 5_000, 5_000, 10)
    assert again.event.event_id == held.event.event_id
    assert await box.record_try(held.event.event_id, "hook", ok=True, error=None, now_ms=now,
                                retry_in_ms=None) is DeliveryState.DELIVERED
    # a late second record (the other sender) changes nothing
    assert await box.record_try(held.event.event_id, "hook", ok=False, error="late",
                                now_ms=now, retry_in_ms=None) is DeliveryState.DELIVERED
    [d] = await box.list_deliveries()
    assert (d.state, d.tries, d.last_error) == (DeliveryState.DELIVERED, 1, None)
    assert await box.list_deliveries(state=DeliveryState.PENDING) == []


async def test_an_event_no_channel_wants_is_routed_to_nothing(harness):
    """A task whose notifications are off (or no channel configured) must not leave its events
    unrouted forever, re-read by every pass."""
    await seed(harness)
    [run_id] = await admitted_runs(harness, 1)
    await cancel(harness, run_id)
    now = await harness.now_ms()
    assert await outbox(harness).route(lambda e: [], now, 10) == 1
    assert await outbox(harness).route(lambda e: ["hook"], now, 10) == 0
    assert await outbox(harness).list_deliveries() == []


async def test_retention_deletes_ended_deliveries_and_keeps_a_pending_one(harness):
    """The outbox must not grow without bound on a small device, yet a delivery still pending
    (a receiver down for days) must keep its event, or it would be lost."""
    await seed(harness)
    first, second = await admitted_runs(harness, 2, task="t1")
    await cancel(harness, first)
    await cancel(harness, second)
    box = outbox(harness)
    now = await harness.now_ms()
    await box.route(everyone, now, 10)
    due = await box.claim_due(now, 60_000, 10)
    for d in due:  # the first event: delivered on hook, dead on mail
        await box.record_try(d.event.event_id, d.channel, ok=d.channel == "hook", error="x",
                             now_ms=now, retry_in_ms=None)
    oldest = min(e.at_ms for e in await box.list_events())
    newest = max(e.at_ms for e in await box.list_events())
    assert await box.prune(oldest, 100) == 0  # nothing older than the cut
    assert await box.prune(newest + 1, 100) == 1  # the first event goes; the second is pending
    events = await box.list_events()
    assert [e.run_id for e in events] == [second]
    assert {(d.event.run_id, d.state) for d in await box.list_deliveries()} == {
        (second, DeliveryState.PENDING)}
