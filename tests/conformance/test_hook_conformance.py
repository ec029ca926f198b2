"""Incoming webhook deliveries (kind ``hook``) on every store: one Run per trigger and delivery
id, keyed ``ql3:hook:v1:<trigger>:<delivery id>``, only while the trigger admits; the payload
kept with the Run where the store keeps event payloads."""

from __future__ import annotations

from qinglong.contracts.hooks import HOOK_KIND
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
from qinglong.plugins.chain import HookProvider
from qinglong.testing.conformance.harness import providers

SECRET = "x" * 40


def hook(trigger_id: str, enabled: bool = True):
    return TriggerDefinition("p1", trigger_id, "t1", HOOK_KIND, {"secret": SECRET}, MisfirePolicy.FIRE_ONCE,
                             60_000, enabled)


async def ready(h):
    await h.restart({**providers(), HOOK_KIND: HookProvider()})
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", {"command": ["true"]})


async def deliver(h, trigger_id, delivery, body="{}"):
    payload = {"body": body, "content_type": "application/json", "delivery": delivery}
    return await h.backend.occurrences().admit_occurrence(HOOK_KIND, trigger_id, delivery, payload,
                                                          await h.now_ms())


async def test_the_same_delivery_twice_is_one_run_under_the_hook_key(harness):
    """A sender's retry of one delivery must not run the job twice; the key names the trigger and
    the delivery so another delivery does run it."""
    await ready(harness)
    await harness.publisher.put_trigger(hook("gh"))
    first = await deliver(harness, "gh", "d-1", '{"a": 1}')
    again = await deliver(harness, "gh", "d-1", '{"a": 2}')
    other = await deliver(harness, "gh", "d-2")
    assert first.created and not again.created and other.created
    assert again.run_id == first.run_id != other.run_id
    runs = {r.run_id: r for r in await harness.reader.recent_runs(limit=10, trigger_id="gh")}
    assert runs[first.run_id].idempotency_key == "ql3:hook:v1:gh:d-1" and len(runs) == 2
    keeper = getattr(harness.backend.occurrences(), "event_payload", None)
    if keeper is not None:  # the first delivery's payload, never the repeat's
        assert '"body":"{\\"a\\": 1}"' in await keeper(first.run_id)


async def test_a_disabled_hook_admits_nothing(harness):
    """An operator who disabled a hook must not see a delivery start its job."""
    await ready(harness)
    await harness.publisher.put_trigger(hook("off", enabled=False))
    result = await deliver(harness, "off", "d-1")
    assert result.run_id is None and result.refused
    assert await harness.reader.recent_runs(limit=10, trigger_id="off") == []
