"""The store-derived figures (``Reader.store_stats()``) on every backend (see ``conftest.py``).

Each test runs on SQLite, PostgreSQL 18 and PostgreSQL 15 with one history and checks the figures
against what that history must give: exact counts where the history fixes them, and otherwise
the same definition applied to the store's own listings (a schedule is due when its cursor is at
or before the reading's time; a lag is admitted minus scheduled, its percentile nearest-rank).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from qinglong.contracts.errors import StoreUnavailable
from qinglong.contracts.execution import RunState
from qinglong.contracts.observe import (
    LAG_WINDOW_MS,
    RECENT_WINDOW_MS,
    STATS_READ_TIMEOUT_MS,
    StatsReader,
    StoreStats,
    percentile,
)

from qinglong.testing.conformance.store import SECOND, every_second, initialized, schedule, seed

YEARLY = "0 0 1 1 *"


def expected_due(schedules, now_ms: int) -> tuple[int, int | None]:
    """The backlog by definition: enabled schedules whose cursor is at or before ``now_ms``."""
    cursors = [s.next_fire_at_ms for s in schedules
               if s.enabled and s.next_fire_at_ms is not None and s.next_fire_at_ms <= now_ms]
    return len(cursors), (min(cursors) if cursors else None)


async def lags_in_window(h, stats: StoreStats) -> list[int]:
    """Admitted minus scheduled of the trigger Runs admitted in the lag window, ascending."""
    since = stats.now_ms - LAG_WINDOW_MS
    return sorted(r.admitted_at_ms - r.scheduled_for_ms for r in await h.reader.recent_runs(limit=10_000)
                  if r.admitted_at_ms >= since and r.trigger_revision >= 1)


async def test_every_reader_offers_the_bounded_stats_read(harness):
    """A backend without ``store_stats`` would leave /metrics and ``qinglong status`` blind on it."""
    assert isinstance(harness.reader, StatsReader)
    stats = await harness.reader.store_stats()
    assert isinstance(stats, StoreStats)
    assert abs(stats.now_ms - await harness.now_ms()) < 60_000  # the store's own clock


async def test_nothing_due_reads_an_empty_backlog_with_no_oldest_occurrence(harness):
    """A quiet store must read as clear: a backlog of 0 with an oldest-due time would page an
    operator (or a dashboard would show an age for nothing waiting)."""
    await seed(harness)
    await initialized(harness, "a", every_second("a", expression=YEARLY))
    await harness.publisher.put_trigger(every_second("off", expression=YEARLY))
    await harness.publisher.set_trigger_enabled("p1", "off", False)
    stats = await harness.reader.store_stats()
    assert (stats.schedules_total, stats.schedules_enabled) == (2, 1)
    assert (stats.schedules_due, stats.oldest_due_ms, stats.oldest_due_seconds) == (0, None, 0.0)
    assert stats.runs_by_state == {state.value: 0 for state in RunState}
    assert (stats.admission_lag_p50_ms, stats.admission_lag_p99_ms, stats.admitted_in_window) == (None, None, 0)
    assert (stats.skipped_recent, stats.lost_recent, stats.running) == (0, 0, 0)


async def test_a_stalled_store_reads_its_backlog_and_the_age_of_the_oldest_due(harness):
    """The backlog and its age are what tells an operator that nothing is admitting: both must
    count every due enabled schedule (none disabled, none awaiting initialization) and date the
    oldest from its cursor."""
    await seed(harness)
    await harness.publisher.put_trigger(every_second("a"))
    await harness.publisher.put_trigger(every_second("b"))
    await harness.publisher.put_trigger(every_second("off"))
    report = await harness.run_round()
    assert report.initialized == 3, report
    await harness.publisher.set_trigger_enabled("p1", "off", False)
    await harness.publisher.put_trigger(every_second("fresh"))  # awaiting initialization
    await harness.elapse(5 * SECOND)  # no round: a stopped scheduler
    stats = await harness.reader.store_stats()
    cursors = [(await schedule(harness, t)).next_fire_at_ms for t in ("a", "b")]
    assert stats.schedules_due == 2
    assert stats.oldest_due_ms == min(cursors)
    assert stats.oldest_due_seconds >= 4.0
    assert (stats.schedules_total, stats.schedules_enabled) == (4, 3)
    assert expected_due(await harness.reader.list_schedules(), stats.now_ms) == (2, min(cursors))


async def test_a_drained_backlog_reads_its_runs_and_admission_lag_percentiles(harness):
    """After a stall the lag percentiles must show how late the backlog was admitted (p99 over the
    grace pages the operator), and every admitted Run must be counted queued, on every store."""
    await seed(harness)
    await initialized(harness, "a", every_second("a"))
    await initialized(harness, "b", every_second("b"))
    await harness.elapse(4 * SECOND)
    report = await harness.run_round()
    assert report.admitted >= 8, report
    stats = await harness.reader.store_stats()
    lags = await lags_in_window(harness, stats)
    assert stats.admitted_in_window == len(lags) >= 8
    assert stats.admission_lag_p50_ms == percentile(lags, 0.5)
    assert stats.admission_lag_p99_ms == percentile(lags, 0.99)
    assert stats.admission_lag_p99_ms >= 3 * SECOND  # the oldest occurrence waited the stall
    runs = await harness.reader.recent_runs(limit=10_000)
    assert stats.runs_by_state == {**{state.value: 0 for state in RunState}, "queued": len(runs)}
    # the backlog by definition at the reading's instant (a per-second cron keeps coming due)
    assert (stats.schedules_due, stats.oldest_due_ms) == expected_due(
        await harness.reader.list_schedules(), stats.now_ms)


async def test_skips_count_their_occurrences_and_leave_the_recent_windows(harness):
    """Skips are what a misfire policy did not admit: the count must be of occurrences, and an
    hour later they (and the lag of old admissions) no longer read as recent."""
    await seed(harness)
    await initialized(harness, "a", every_second("a", grace_ms=1500))
    await harness.elapse(10 * SECOND)
    report = await harness.run_round()
    assert report.skipped == 1, report
    [skip] = await harness.reader.recent_skips()
    stats = await harness.reader.store_stats()
    assert stats.skipped_recent == skip.count >= 8
    await harness.elapse(RECENT_WINDOW_MS + SECOND)
    later = await harness.reader.store_stats()
    assert later.skipped_recent == 0
    assert (later.admitted_in_window, later.admission_lag_p50_ms, later.admission_lag_p99_ms) == (0, None, None)
    assert later.runs_by_state["queued"] == stats.runs_by_state["queued"]  # totals stay


async def test_a_working_scheduler_reads_as_live_and_none_as_zero(harness):
    """``live_schedulers == 0`` is what makes ``qinglong status`` say nobody is scheduling: it
    must be 0 before any scheduler worked the store and 1 once one does."""
    await seed(harness)
    await harness.publisher.put_trigger(every_second("a", expression=YEARLY))
    assert (await harness.reader.store_stats()).live_schedulers == 0
    await harness.backend.recover()  # a scheduler starts (edge: takes the owner lock)
    await harness.run_round()        # and completes a round (cluster: records it)
    assert (await harness.reader.store_stats()).live_schedulers == 1


@pytest.mark.parametrize("harness", ["pg18", "pg15"], indirect=True)
async def test_a_locked_table_makes_the_read_fail_within_its_bound_instead_of_hanging(harness):
    """A scrape that waited on a lock (a migration, a long ALTER) would hang every scrape and
    status call behind it; the read must give up within its timeout as StoreUnavailable."""
    import psycopg

    await seed(harness)
    locked = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(harness.server.superuser_dsn(harness.dbname)) as conn:
            conn.execute("LOCK TABLE qinglong.runs IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)
            conn.rollback()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert await asyncio.to_thread(locked.wait, 60)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as raised:
            await harness.reader.store_stats()
        waited = time.monotonic() - started
        assert f"{STATS_READ_TIMEOUT_MS} ms" in str(raised.value)
        # the timeout, not a hang: generous headroom for a loaded machine, far below forever
        assert waited < 30, waited
    finally:
        release.set()
        await asyncio.to_thread(holder.join, 60)
    # the pooled connection is usable again and the session kept its own timeout
    assert (await harness.reader.store_stats()).runs_by_state["queued"] == 0


@pytest.mark.parametrize("harness", ["sqlite"], indirect=True)
async def test_a_sqlite_read_past_its_bound_is_interrupted_and_leaves_the_connection_as_it_was(harness):
    """On a router's slow flash a scrape must not hold the one shared connection for long: past
    its bound the read is interrupted as StoreUnavailable, and the scheduler's connection keeps its
    own busy timeout and no leftover interrupt."""
    import sqlite3

    from qinglong.plugins.edge_sqlite.stats import read_store_stats

    await seed(harness)
    conn = sqlite3.connect(harness.path)
    with conn:  # a long history: the Runs-by-state count reads every row
        conn.executemany(
            "INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, "
            "task_digest, scheduled_for_ms, admitted_at_ms, state, idempotency_key, finished_at_ms) "
            "VALUES (?, 'p1', 'a', 1, 't1', 1, 'd', ?, ?, 'succeeded', ?, ?)",
            ((f"r{i}", i, i, f"k{i}", i) for i in range(200_000)))
    conn.close()
    store = harness.backend.store
    with pytest.raises(StoreUnavailable) as raised:
        await read_store_stats(store, harness.clock, timeout_ms=1)
    assert "within 1 ms" in str(raised.value)
    busy = await store.call(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0])
    assert busy == store.settings.busy_timeout_ms
    assert not await store.call(lambda c: c.in_transaction)
    stats = await harness.reader.store_stats()  # the default bound: the same store answers
    assert stats.runs_by_state["succeeded"] == 200_000


async def test_an_attempt_that_ended_lost_counts_in_the_recent_window_and_not_after_it(harness):
    """A lost Attempt is work whose outcome is unknown: a store that never counts one (the
    cluster's figure was fixed at 0) keeps ``qinglong status`` clear and the page silent after
    a worker died mid-job."""
    from tests.conformance.ending import end_current, outcome

    await seed(harness)
    await initialized(harness, "a", every_second("a"))
    await harness.elapse(2 * SECOND)
    assert (await harness.run_round()).admitted >= 1
    (run,) = [r for r in await harness.reader.recent_runs(limit=10) if r.trigger_id == "a"][-1:]
    await end_current(harness, run.run_id, outcome("lost"))
    stats = await harness.reader.store_stats()
    assert stats.lost_recent == 1
    if stats.attempts_finished is not None:  # a store whose ends no local dispatcher counts
        assert stats.attempts_finished["lost"] == 1
    await harness.elapse(RECENT_WINDOW_MS + SECOND)
    assert (await harness.reader.store_stats()).lost_recent == 0


async def test_each_tasks_outcome_figures_name_it_failing_until_it_succeeds(harness):
    """Runs that all fail must show in the health signal: a store that does not report a task
    whose last Run failed (with its streak and recent ratio) lets a job fail every day while the
    page says clear and ``qinglong status`` exits 0."""
    from qinglong.contracts.observe import FAILURE_STREAK_PERIODS, Verdict, assess
    from tests.conformance.ending import end_current, outcome

    await seed(harness)
    await harness.publisher.put_task("p1", "fine", {"command": ["true"]})
    await initialized(harness, "a", every_second("a"))
    await harness.publisher.put_trigger(every_second("b", task="fine"))
    await harness.run_round()
    await harness.elapse(8 * SECOND)
    for _ in range(8):  # a backlog inside the grace: one occurrence per decision
        await harness.run_round()
    runs = sorted((r for r in await harness.reader.recent_runs(limit=100)),
                  key=lambda r: (r.scheduled_for_ms, r.admitted_at_ms))
    by_trigger = {t: [r.run_id for r in runs if r.trigger_id == t] for t in ("a", "b")}
    assert len(by_trigger["a"]) >= 6 and by_trigger["b"], by_trigger
    waiting = iter(runs)

    async def end(run_id: str, result) -> None:
        """End ``run_id`` with ``result``, each Run waiting before it (of "fine") succeeded first:
        a worker claims in dispatch order. Ends are 10 ms apart, as real ends are."""
        for run in waiting:
            await harness.elapse(10)
            if run.run_id == run_id:
                await end_current(harness, run_id, result)
                return
            assert run.trigger_id == "b", "the plan ends t1's Runs in order"
            await end_current(harness, run.run_id, outcome("succeeded", 0))

    a = by_trigger["a"]
    for run_id, result in ((a[0], outcome("succeeded", 0)), (a[1], outcome("failed", 1)),
                           (a[2], outcome("cancelled")), (a[3], outcome("timed_out"))):
        await end(run_id, result)
    stats = await harness.reader.store_stats()
    assert (stats.tasks_failing, stats.tasks_not_succeeding) == (1, 0)
    (task,) = stats.failing_tasks
    assert (task.project_id, task.task_id, task.last_outcome) == ("p1", "t1", "timed_out")
    assert (task.failure_streak, task.succeeded_in_window, task.ended_in_window) == (2, 1, 3)
    assert task.last_success_at_ms is not None and task.last_finished_at_ms >= task.last_success_at_ms
    finding = assess(None, stats, grace_ms=60_000)
    assert finding.verdict is Verdict.FAILING
    assert finding.reasons[0].startswith("task p1/t1 is failing: its last run timed out, 2 in a row")

    await end(a[4], outcome("lost"))
    stats = await harness.reader.store_stats()
    assert FAILURE_STREAK_PERIODS == 3
    assert (stats.tasks_failing, stats.tasks_not_succeeding) == (1, 1)
    assert stats.failing_tasks[0].failure_streak == 3
    await end(a[5], outcome("succeeded", 0))
    stats = await harness.reader.store_stats()
    assert (stats.tasks_failing, stats.tasks_not_succeeding, stats.failing_tasks) == (0, 0, ())
