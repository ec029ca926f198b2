"""The store figures behind ``/metrics``: one bounded read per cache period however many scrapes,
and a failed read served as the last values with an error counted, on a real edge store."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from http_helpers import cli, fetch, surface_port, write_settings
from qinglong.contracts.observe import STATS_CACHE_MS
from qinglong.host.containers import build_container
from qinglong.host.http.metrics import Metrics, StatsCache
from qinglong.host.settings import load_settings


def _values(text: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_a_failed_store_read_serves_the_last_values_and_counts_an_error(tmp_path):
    """A scrape that fails when the store does is a gap in every graph exactly when the operator
    needs them; a scrape storm that reaches the store each time loads a router's disk or a cluster's
    database with one read per scrape."""
    settings = write_settings(tmp_path, http="")
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "t", "--", "true")
    cli(settings, "trigger", "add", "ops", "tr", "--task", "t", "--cron", "0 0 1 1 *")
    cli(settings, "trigger", "add", "ops", "off", "--task", "t", "--cron", "0 0 1 1 *", "--disabled")
    now = [1000.0]

    async def scenario() -> None:
        backend = build_container(load_settings(settings)).backend()
        await backend.open(create=False)
        cache = StatsCache(backend.reader(), clock=lambda: now[0])
        metrics = Metrics(cache, profile="edge", version="test", running=lambda: None)
        first = _values(await metrics.scrape())
        assert first[("qinglong_schedules_total", (("enabled", "true"),))] == 1
        assert first[("qinglong_schedules_total", (("enabled", "false"),))] == 1
        assert first[("qinglong_metrics_read_errors_total", ())] == 0
        read = cache.stats
        await backend.close()  # from here on every read of the store fails
        now[0] += STATS_CACHE_MS / 1000 / 2
        again = await asyncio.gather(*(metrics.scrape() for _ in range(20)))  # a storm inside the period
        assert cache.stats is read and cache.errors == 0, "a scrape inside the cache period read the store"
        assert all(_values(text) == first for text in again)
        now[0] += STATS_CACHE_MS / 1000
        failed = _values(await metrics.scrape())
        assert cache.errors == 1 and cache.stats is read
        assert failed[("qinglong_metrics_read_errors_total", ())] == 1
        assert failed[("qinglong_schedules_total", (("enabled", "true"),))] == 1  # the last values
        assert failed[("qinglong_schedules_due", ())] == first[("qinglong_schedules_due", ())]

    asyncio.run(scenario())


def test_livez_and_readyz_fail_when_the_scheduler_loop_died_outside_a_stop(tmp_path):
    """A process whose scheduler loop ended (a bug, a cancelled task) but that still answers 200
    is never restarted: it admits nothing while every probe says all is well."""
    settings = write_settings(tmp_path)

    async def scenario() -> None:
        lifecycle = build_container(load_settings(settings)).lifecycle()
        await lifecycle.start()
        try:
            port = surface_port(lifecycle)
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, fetch, port, "/livez") == (200, b"alive\n")
            assert await loop.run_in_executor(None, fetch, port, "/readyz") == (200, b"ready\n")
            task = lifecycle.loop._task
            task.cancel()  # the loop dies while nobody asked for a stop
            try:
                await task
            except asyncio.CancelledError:
                pass
            problem = b"the scheduler loop is not running\n"
            assert await loop.run_in_executor(None, fetch, port, "/livez") == (503, b"not alive: " + problem)
            assert await loop.run_in_executor(None, fetch, port, "/readyz") == (503, b"not ready: " + problem)
        finally:
            await lifecycle.stop()

    asyncio.run(scenario())
