"""Event sources' one admission function on every store: one Run per trigger and event id,
only for an enabled trigger of the kind named, the trigger's task head pinned."""

from __future__ import annotations

import pytest

from qinglong.contracts.errors import UserError
from qinglong.contracts.event_sources import occurrence_key
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
from qinglong.plugins.chain import AfterProvider, AtStartProvider
from qinglong.testing.conformance.harness import providers


def at_start(trigger_id: str, enabled: bool = True):
    return TriggerDefinition("p1", trigger_id, "t1", "at_start", {}, MisfirePolicy.FIRE_ONCE,
                             60_000, enabled)


async def ready(h):
    await h.restart({**providers(), "after": AfterProvider(), "at_start": AtStartProvider()})
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", {"command": ["true"]})


async def admit(h, trigger_id: str, event_id: str, kind: str = "at_start", payload=None):
    return await h.backend.occurrences().admit_occurrence(kind, trigger_id, event_id, payload,
                                                          await h.now_ms())


async def test_the_same_event_twice_admits_one_run_keyed_by_trigger_and_event(harness):
    """A source that redelivers an event (a restart, a retried message) must not start the job
    twice; a new event must start it again."""
    await ready(harness)
    await harness.publisher.put_trigger(at_start("boot"))
    first = await admit(harness, "boot", "start-1")
    again = await admit(harness, "boot", "start-1")
    other = await admit(harness, "boot", "start-2")
    assert first.created and not again.created and other.created
    assert again.run_id == first.run_id != other.run_id
    runs = {r.run_id: r for r in await harness.reader.recent_runs(limit=10, trigger_id="boot")}
    assert runs[first.run_id].idempotency_key == occurrence_key("at_start", "boot", "start-1")
    assert runs[first.run_id].state == "queued" and len(runs) == 2


async def test_a_disabled_unknown_or_other_kind_trigger_admits_nothing(harness):
    """The fence of cron admission: a source must not start a trigger the operator disabled, or
    one of another kind under a stale id."""
    await ready(harness)
    await harness.publisher.put_trigger(at_start("off", enabled=False))
    await harness.publisher.put_trigger(at_start("on"))
    for trigger_id, kind in (("off", "at_start"), ("nope", "at_start"), ("on", "webhook")):
        result = await admit(harness, trigger_id, "e1", kind=kind)
        assert result.run_id is None and not result.created and result.refused
    assert await harness.reader.recent_runs(limit=10, trigger_id="off") == []
    assert await harness.reader.recent_runs(limit=10, trigger_id="on") == []


async def test_a_bad_event_id_or_payload_is_refused_writing_nothing(harness):
    await ready(harness)
    await harness.publisher.put_trigger(at_start("boot"))
    with pytest.raises(UserError, match="event id"):
        await admit(harness, "boot", "")
    with pytest.raises(UserError, match="payload"):
        await admit(harness, "boot", "e", payload={"blob": "x" * 70_000})
    assert await harness.reader.recent_runs(limit=10, trigger_id="boot") == []


async def test_listing_triggers_of_a_kind_returns_only_that_kind_from_the_store(harness):
    """The at_start source asks for the triggers of its kind at every start: were the filter not
    the store's, a start would hold the head of every cron trigger (10,000 cost 11 MiB on edge)
    and a source would see triggers of another kind."""
    await ready(harness)
    for trigger_id in ("a-cron", "c-cron"):
        await harness.publisher.put_trigger(TriggerDefinition(
            "p1", trigger_id, "t1", "cron", {"expression": "0 0 1 1 *"}, MisfirePolicy.FIRE_ONCE, 60_000))
    await harness.publisher.put_trigger(at_start("b-boot"))
    await harness.publisher.put_trigger(at_start("d-off", enabled=False))
    reader = harness.reader
    heads = await reader.list_triggers(kind="at_start")
    assert [(h.trigger_id, h.kind, h.enabled) for h in heads] == [
        ("b-boot", "at_start", True), ("d-off", "at_start", False)]
    assert [h.trigger_id for h in await reader.list_triggers(kind="at_start", limit=1)] == ["b-boot"]
    assert [h.trigger_id for h in await reader.list_triggers("p1", kind="cron")] == ["a-cron", "c-cron"]
    assert await reader.list_triggers("other", kind="cron") == []
    assert len(await reader.list_triggers()) == 4
