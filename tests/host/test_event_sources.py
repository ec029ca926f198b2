"""Event sources through the host's wiring (``containers.event_sources``) on a real SQLite store:
a plugin's source admits through the context's one function; the built-in ``at_start``."""

from __future__ import annotations

import asyncio
import types

import pytest

import qinglong.plugins.chain as chain
from qinglong.contracts.errors import PluginLoadError
from qinglong.contracts.hookspecs import ComponentPhase, hookimpl
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
from qinglong.contracts.store import BackendContext, SchedulerLimits
from qinglong.host.containers import event_sources
from qinglong.host.plugins import PluginHost
from tests.support.aio import closing


class Sink:
    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)


class FileSource:
    """A plugin's source: admits one occurrence per event id it is given at start."""

    name = "files"
    phase = ComponentPhase.STACK

    def __init__(self, context, event_ids):
        self.context, self.event_ids, self.results = context, event_ids, []

    async def start(self):
        for trigger in await self.context.triggers("at_start"):
            for event_id in self.event_ids:
                self.results.append(await self.context.admit("at_start", trigger.trigger_id,
                                                             event_id, {"file": event_id}))

    async def stop(self):
        pass


class FilePlugin:
    def __init__(self, event_ids):
        self.event_ids = event_ids
        self.made = []

    @hookimpl
    def qinglong_event_sources(self, context):
        self.made.append(FileSource(context, self.event_ids))
        return self.made


async def backend_with_trigger(path):
    from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

    backend = create_backend(BackendContext(
        settings=EdgeSqliteSettings(path=str(path)),
        limits=SchedulerLimits(page_size=32, claim_budget=16, lease_ms=30_000, cadence_ms=1000),
        providers={"at_start": chain.AtStartProvider()}, diagnostics=Sink(),
        clock_ms=lambda: 1_800_000_000_000, owner="test"))
    await backend.open()
    await backend.migrate()
    await backend.publisher().create_project("p1")
    await backend.publisher().put_task("p1", "t1", {"command": ["true"]})
    await backend.publisher().put_trigger(TriggerDefinition(
        "p1", "boot", "t1", "at_start", {}, MisfirePolicy.FIRE_ONCE, 60_000))
    return backend


LOADED = types.SimpleNamespace(settings=None)


def test_hook_qinglong_event_sources_admits_through_the_one_function_once_per_event(tmp_path):
    """A source's occurrences must become Runs only through the store's admission (one Run per
    event id, the same event again nothing); the built-in at_start source admits once per start."""
    async def body():
        backend = await backend_with_trigger(tmp_path / "q.db")
        async with closing(backend):
            host = PluginHost()
            host.register(chain, "chain")
            plugin = FilePlugin(["a.txt", "b.txt", "a.txt"])
            host.register(plugin, "files")
            sources = event_sources(host, LOADED, backend, Sink(), lambda: 1_800_000_000_000,
                                    "edge@test")
            assert sorted(s.name for s in sources) == ["at-start", "files"]
            for source in sources:
                await source.start()
            created = [r.created for r in plugin.made[0].results]
            assert created == [True, True, False]
            runs = await backend.reader().recent_runs(limit=10, trigger_id="boot")
            assert len(runs) == 3  # a.txt, b.txt, and this start
            keys = sorted(r.idempotency_key for r in runs)
            assert keys[0].startswith("ql3:at_start:v1:boot:a.txt")

    asyncio.run(body())


def test_an_event_source_that_is_not_a_component_is_refused_naming_the_plugin(tmp_path):
    class Bad:
        @hookimpl
        def qinglong_event_sources(self, context):
            return ["not a component"]

    async def body():
        backend = await backend_with_trigger(tmp_path / "q.db")
        async with closing(backend):
            host = PluginHost()
            host.register(Bad(), "bad")
            with pytest.raises(PluginLoadError, match="bad.*qinglong_event_sources"):
                event_sources(host, LOADED, backend, Sink(), lambda: 0, "edge@test")

    asyncio.run(body())
