"""The example directory watcher on a real SQLite store and a real directory, wired as
``qinglong run`` wires event sources: each file is one Run, the same file seen again (another
look, a restart) none, a rewritten file a new one."""

from __future__ import annotations

import asyncio
import os
import types

import qinglong_dirwatch
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
from qinglong.contracts.store import BackendContext, SchedulerLimits
from qinglong.host.containers import event_sources
from qinglong.host.plugins import PluginHost
from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend


class Sink:
    def emit(self, event):
        pass


def test_each_new_or_changed_file_admits_one_run_and_a_restart_admits_none(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    async def body():
        backend = create_backend(BackendContext(
            settings=EdgeSqliteSettings(path=str(tmp_path / "q.db")),
            limits=SchedulerLimits(page_size=32, claim_budget=16, lease_ms=30_000, cadence_ms=1000),
            providers={"dir_watch": qinglong_dirwatch.DirWatchProvider()}, diagnostics=Sink(),
            clock_ms=lambda: 1_800_000_000_000, owner="test"))
        await backend.open()
        await backend.migrate()
        try:
            pub = backend.publisher()
            await pub.create_project("ops")
            await pub.put_task("ops", "ingest", {"command": ["true"]})
            await pub.put_trigger(TriggerDefinition("ops", "inbox", "ingest", "dir_watch",
                                                    {"path": str(inbox), "pattern": "*.csv"},
                                                    MisfirePolicy.FIRE_ONCE, 60_000))
            settings = types.SimpleNamespace(plugins=types.SimpleNamespace(settings={}))

            def source():
                host = PluginHost()
                host.register(qinglong_dirwatch, "dirwatch")
                [s] = event_sources(host, types.SimpleNamespace(settings=settings), backend,
                                    Sink(), lambda: 1_800_000_000_000, "edge@test")
                return s

            first = source()
            (inbox / "a.csv").write_text("1\n")
            (inbox / "b.csv").write_text("2\n")
            (inbox / "notes.txt").write_text("no\n")
            assert await first.scan_once() == 2
            assert await first.scan_once() == 0
            assert await source().scan_once() == 0  # a restart: the same files, no new Run
            os.utime(inbox / "a.csv", ns=(1, 2_000_000_000_000_000_000))
            assert await source().scan_once() == 1  # a.csv changed: a new event
            runs = await backend.reader().recent_runs(limit=10, trigger_id="inbox")
            assert len(runs) == 3
            assert all(r.idempotency_key.startswith("ql3:dir_watch:v1:inbox:") for r in runs)
        finally:
            await backend.close()

    asyncio.run(body())
