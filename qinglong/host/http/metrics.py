"""``/metrics``: every metric of :data:`qinglong.contracts.observe.METRICS`, produced with
prometheus_client from a registry of this process only.

Process figures (rounds, admissions and their lag, claims, races, dispatches, ends) are counted from
each round's :class:`~qinglong.contracts.records.RoundReport` and the dispatcher's observers, from the
moment the HTTP surface opened. Store-derived gauges come from ``backend.reader().store_stats()``,
read at scrape time at most once per :data:`STATS_CACHE_MS` and bounded by
:data:`STATS_READ_TIMEOUT_MS`; a failed read counts in ``qinglong_metrics_read_errors_total`` and the
scrape serves the last values.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from qinglong.contracts.observe import (
    ENDED_OUTCOMES, LAG_BUCKETS_S, METRICS, ROUND_BUCKETS_S, STATS_CACHE_MS, STATS_READ_TIMEOUT_MS, MetricType,
    StatusFinding, StoreStats, assess, status_grace_ms,
)
from qinglong.contracts.records import MisfirePolicy, RoundReport

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "StatsCache", "grace_of"]

SPECS = {spec.name: spec for spec in METRICS}
#: The metrics read from the store at scrape time (the rest are this process's counts).
STORE_METRICS = ("qinglong_schedules_due", "qinglong_schedule_oldest_due_seconds", "qinglong_schedules_total",
                 "qinglong_runs", "qinglong_task_queued", "qinglong_workers", "qinglong_worker_free_slots",
                 "qinglong_runs_without_worker", "qinglong_tasks_failing", "qinglong_tasks_not_succeeding")
RACE_KINDS = ("fence_lost", "cas_miss", "released")
ROUND_RESULTS = ("ok", "incomplete", "failed")
ATTEMPT_OUTCOMES = ENDED_OUTCOMES


def grace_of(lifecycle: Any) -> int:
    """The verdict's grace for a running ``qinglong run`` (its profile and ``[scheduler]``
    settings), as :func:`~qinglong.contracts.observe.status_grace_ms` and ``qinglong status``
    compute it."""
    scheduler = lifecycle.settings.scheduler
    return status_grace_ms(scheduler.cadence_ms, scheduler.lease_ms, leased=lifecycle.profile == "cluster")


class StatsCache:
    """One bounded store read per :data:`STATS_CACHE_MS` however many scrapes ask (they share it).

    It keeps the reading before the newest one too, so the page and ``qinglong_status_verdict``
    judge a backlog's trend as ``qinglong status`` does with its two readings."""

    def __init__(self, reader: Any, clock: Any = time.monotonic, *, grace_ms: int | None = None) -> None:
        self._reader = reader
        self._clock = clock
        self._lock = asyncio.Lock()
        self._read_at: float | None = None
        self.grace_ms = grace_ms
        self.before: StoreStats | None = None
        self.stats: StoreStats | None = None
        self.errors = 0
        self.last_error: str | None = None

    async def refresh(self) -> StoreStats | None:
        """Read unless the last read (ok or failed) is fresher than the cache; the newest values."""
        async with self._lock:
            now = self._clock()
            if self._read_at is not None and (now - self._read_at) * 1000 < STATS_CACHE_MS:
                return self.stats
            try:
                stats = await asyncio.wait_for(self._reader.store_stats(), STATS_READ_TIMEOUT_MS / 1000)
                self.before, self.stats = self.stats, stats
                self.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a timeout or a store error: stale values, never a failed scrape
                self.errors += 1
                self.last_error = "timed out" if isinstance(exc, asyncio.TimeoutError) else exc.__class__.__name__
            self._read_at = self._clock()
            return self.stats

    @property
    def finding(self) -> StatusFinding | None:
        """The verdict of the last two readings (:func:`~qinglong.contracts.observe.assess`), or
        None before the first reading or without a grace."""
        if self.stats is None or self.grace_ms is None:
            return None
        return assess(self.before, self.stats, grace_ms=self.grace_ms)


class _StoreCollector(Collector):
    """The store-derived gauges, from the cache's last reading (none before the first one)."""

    def __init__(self, cache: StatsCache, running: Any) -> None:
        self._cache = cache
        self._running = running

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._cache.stats
        running = self._running()
        if running is None and stats is not None:
            running = stats.running
        yield _gauge("qinglong_running", value=running) if running is not None else _gauge("qinglong_running")
        grace = self._cache.grace_ms
        yield (_gauge("qinglong_status_grace_seconds", value=grace / 1000) if grace is not None
               else _gauge("qinglong_status_grace_seconds"))
        finding = self._cache.finding
        yield (_gauge("qinglong_status_verdict", value=int(finding.verdict)) if finding is not None
               else _gauge("qinglong_status_verdict"))
        if stats is None:  # announced, without samples, until the first reading
            for name in STORE_METRICS:
                yield _gauge(name)
            return
        yield _gauge("qinglong_schedules_due", value=stats.schedules_due)
        yield _gauge("qinglong_schedule_oldest_due_seconds", value=stats.oldest_due_seconds)
        family = _gauge("qinglong_schedules_total")
        family.add_metric(["true"], stats.schedules_enabled)
        family.add_metric(["false"], max(0, stats.schedules_total - stats.schedules_enabled))
        yield family
        family = _gauge("qinglong_runs")
        for state, count in sorted(stats.runs_by_state.items()):
            family.add_metric([state], count)
        yield family
        family = _gauge("qinglong_task_queued")
        for task, count in sorted(stats.queued_by_task.items()):
            project, _, task_id = task.partition("/")
            family.add_metric([project, task_id], count)
        yield family
        family = _gauge("qinglong_workers")
        for state, count in sorted(stats.workers_by_state.items()):
            family.add_metric([state], count)
        yield family
        yield (_gauge("qinglong_worker_free_slots", value=stats.worker_free_slots)
               if stats.worker_free_slots is not None else _gauge("qinglong_worker_free_slots"))
        yield _gauge("qinglong_tasks_failing", value=stats.tasks_failing)
        yield _gauge("qinglong_tasks_not_succeeding", value=stats.tasks_not_succeeding)
        yield (_gauge("qinglong_runs_without_worker", value=stats.runs_without_worker)
               if stats.runs_without_worker is not None else _gauge("qinglong_runs_without_worker"))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def _gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    """The family of a contract gauge: with its one sample, or empty (labelled samples added by
    the caller; none at all for a figure this store does not have)."""
    spec = SPECS[name]
    assert spec.type is MetricType.GAUGE
    if value is not None:
        return GaugeMetricFamily(name, spec.help, value=value)
    return GaugeMetricFamily(name, spec.help, labels=list(spec.labels))


def _counter(name: str, registry: CollectorRegistry) -> Counter:
    spec = SPECS[name]
    return Counter(name, spec.help, list(spec.labels), registry=registry)


def _histogram(name: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> Histogram:
    spec = SPECS[name]
    return Histogram(name, spec.help, list(spec.labels), buckets=buckets, registry=registry)


class Metrics:
    """This process's registry: its counters and histograms, plus the store gauges' collector."""

    def __init__(self, cache: StatsCache, *, profile: str, version: str, running: Any) -> None:
        try:  # the _created series double every counter for no operator use
            from prometheus_client import disable_created_metrics

            disable_created_metrics()
        except ImportError:  # older prometheus_client: the series stay, harmlessly
            pass
        self.registry = registry = CollectorRegistry(auto_describe=False)
        self._cache = cache
        self.admission_lag = _histogram("qinglong_admission_lag_seconds", LAG_BUCKETS_S, registry)
        self.admissions = _counter("qinglong_admissions_total", registry)
        self.skipped = _counter("qinglong_skipped_occurrences_total", registry)
        self.rounds = _counter("qinglong_rounds_total", registry)
        self.round_duration = _histogram("qinglong_round_duration_seconds", ROUND_BUCKETS_S, registry)
        self.claims = _counter("qinglong_claims_total", registry)
        self.races = _counter("qinglong_claim_races_total", registry)
        self.retries = _counter("qinglong_serialization_retries_total", registry)
        self.dispatch_lag = _histogram("qinglong_dispatch_lag_seconds", LAG_BUCKETS_S, registry)
        self.finished = _counter("qinglong_attempts_finished_total", registry)
        self.read_errors = _counter("qinglong_metrics_read_errors_total", registry)
        build = SPECS["qinglong_build_info"]
        Info(build.name.removesuffix("_info"), build.help, registry=registry).info(
            {"version": version, "profile": profile})
        for policy in MisfirePolicy:  # every label value present from the first scrape
            if policy.value != "fire_all":
                self.skipped.labels(policy.value)
        for result in ROUND_RESULTS:
            self.rounds.labels(result)
        for kind in RACE_KINDS:
            self.races.labels(kind)
        for outcome in ATTEMPT_OUTCOMES:
            self.finished.labels(outcome)
        registry.register(_StoreCollector(cache, running))
        self._running = running
        self._ends_seen: dict[str, int] | None = None

    def observe_round(self, report: RoundReport | None, elapsed_ms: int) -> None:
        """Fold one round (None: it failed) into the counters."""
        self.round_duration.observe(elapsed_ms / 1000)
        if report is None:
            self.rounds.labels("failed").inc()
            return
        self.rounds.labels("incomplete" if report.errors or report.fence_lost else "ok").inc()
        if report.admitted:
            self.admissions.inc(report.admitted)
        for lag_ms in report.admission_lags_ms:
            self.admission_lag.observe(lag_ms / 1000)
        for policy in report.skipped_policies:
            self.skipped.labels(policy).inc()
        unlabelled = report.skipped - len(report.skipped_policies)
        if unlabelled > 0:  # a backend that does not record the policies
            self.skipped.labels("unknown").inc(unlabelled)
        if report.claimed:
            self.claims.inc(report.claimed)
        if report.fence_lost:
            self.races.labels("fence_lost").inc(report.fence_lost)
        if report.cas_misses:
            self.races.labels("cas_miss").inc(report.cas_misses)
        if report.claims_released:
            self.races.labels("released").inc(report.claims_released)
        if report.serialization_retries:
            self.retries.inc(report.serialization_retries)

    def observe_dispatch(self, lag_ms: int) -> None:
        """One process started, ``lag_ms`` after its Run was admitted."""
        self.dispatch_lag.observe(lag_ms / 1000)

    def observe_finished(self, state: str) -> None:
        """One Attempt's end recorded by this process."""
        self.finished.labels(state).inc()

    async def scrape(self) -> bytes:
        """The exposition text: the store read first (cached, bounded), then every metric."""
        errors_before = self._cache.errors
        await self._cache.refresh()
        if self._cache.errors > errors_before:
            self.read_errors.inc(self._cache.errors - errors_before)
        self._count_store_ends()
        return generate_latest(self.registry)

    def _count_store_ends(self) -> None:
        """Where no dispatcher of this process records ends (the cluster: workers report them to
        the store), count the ends the store recorded since the first reading: the growth of its
        totals by outcome. A total that shrank (retention pruned old Runs) counts nothing."""
        stats = self._cache.stats
        if stats is None or stats.attempts_finished is None or self._running() is not None:
            return
        totals = dict(stats.attempts_finished)
        if self._ends_seen is not None:
            for outcome, total in totals.items():
                grown = total - self._ends_seen.get(outcome, 0)
                if grown > 0 and outcome in ATTEMPT_OUTCOMES:
                    self.finished.labels(outcome).inc(grown)
        self._ends_seen = totals
