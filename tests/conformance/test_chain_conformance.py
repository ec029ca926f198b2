"""Chained Runs (trigger kind ``after``) on every store: the downstream Run admitted with the
upstream outcome, once per upstream Run and trigger, only for a matching outcome; loops refused
when published. The upstream Run is admitted by a real round and ended through each store's own
operator path (the same statement that ends a Run in production admits the downstream one)."""

from __future__ import annotations

import pytest

from qinglong.contracts.chain import chain_idempotency_key
from qinglong.contracts.errors import NotFound, UserError
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
from qinglong.plugins.chain import AfterProvider
from qinglong.testing.conformance.harness import providers
from qinglong.testing.conformance.store import every_second, initialized

from tests.conformance.test_outbox_conformance import admitted_runs, cancel

SECOND = 1000


def after(trigger_id: str, task: str, upstream: str, on: str = "any", enabled: bool = True):
    return TriggerDefinition("p1", trigger_id, task, "after", {"task": upstream, "on": on},
                             MisfirePolicy.FIRE_ONCE, 60_000, enabled)


async def chain_ready(h, *tasks: str) -> None:
    await h.restart({**providers(), "after": AfterProvider()})
    await h.publisher.create_project("p1")
    for task in ("t1", *tasks):
        await h.publisher.put_task("p1", task, {"command": ["true"]})


async def runs_of(h, trigger_id: str):
    return await h.reader.recent_runs(limit=100, trigger_id=trigger_id)


async def test_an_upstream_end_admits_one_downstream_run_keyed_by_run_and_trigger(harness):
    """The downstream Run must exist exactly when the upstream ended (one transaction): keyed by
    the upstream Run and the trigger, a second end of the same Run admits no second one."""
    await chain_ready(harness, "t2", "t3")
    await harness.publisher.put_trigger(after("down", "t2", "t1"))
    await harness.publisher.put_trigger(after("also", "t3", "t1"))
    [upstream] = await admitted_runs(harness, 1)
    assert await runs_of(harness, "down") == []
    await cancel(harness, upstream)
    await cancel(harness, upstream)
    [down] = await runs_of(harness, "down")
    [also] = await runs_of(harness, "also")
    assert down.idempotency_key == chain_idempotency_key(upstream, "down")
    assert also.idempotency_key == chain_idempotency_key(upstream, "also")
    assert down.state == "queued" and down.run_id != also.run_id


async def test_only_a_matching_outcome_or_an_enabled_trigger_admits(harness):
    """A chain 'on success' started by a cancel (or a disabled one started at all) would run work
    the operator did not ask for."""
    await chain_ready(harness, "t2", "t3")
    await harness.publisher.put_trigger(after("ok", "t2", "t1", on="success"))
    await harness.publisher.put_trigger(after("bad", "t2", "t1", on="failure"))
    await harness.publisher.put_trigger(after("off", "t3", "t1", on="any", enabled=False))
    [upstream] = await admitted_runs(harness, 1)
    await cancel(harness, upstream)
    for trigger in ("ok", "bad", "off"):
        assert await runs_of(harness, trigger) == []


async def test_a_chained_run_ends_and_starts_the_next_link(harness):
    """A chain of three: the end of the second link's Run starts the third."""
    await chain_ready(harness, "t2", "t3")
    await harness.publisher.put_trigger(after("b", "t2", "t1"))
    await harness.publisher.put_trigger(after("c", "t3", "t2"))
    [upstream] = await admitted_runs(harness, 1)
    await cancel(harness, upstream)
    [second] = await runs_of(harness, "b")
    await cancel(harness, second.run_id)
    [third] = await runs_of(harness, "c")
    assert third.idempotency_key == chain_idempotency_key(second.run_id, "c")


async def test_a_loop_is_refused_at_publish_and_writes_nothing(harness):
    """A chain back to its own task would start Runs for ever."""
    await chain_ready(harness, "t2", "t3")
    await harness.publisher.put_trigger(after("b", "t2", "t1"))
    await harness.publisher.put_trigger(after("c", "t3", "t2"))
    with pytest.raises(UserError, match="loop: t1 -> t2 -> t3 -> t1"):
        await harness.publisher.put_trigger(after("back", "t1", "t3"))
    with pytest.raises(UserError, match="loop: t2 -> t2"):
        await harness.publisher.put_trigger(after("self", "t2", "t2"))
    with pytest.raises(NotFound):
        await harness.publisher.put_trigger(after("ghost", "t2", "nope"))
    names = {t.trigger_id for t in await harness.reader.list_triggers()} if hasattr(
        harness.reader, "list_triggers") else None
    if names is not None:
        assert names == {"b", "c"}
    # the cron trigger of the upstream task is unaffected by a chain on it
    await initialized(harness, "a", every_second("a"))
