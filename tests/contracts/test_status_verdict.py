"""Laws of the status verdict and the lag percentile (``qinglong.contracts.observe``).

``qinglong status`` exits with the verdict and the status page shows it, so a broken law here is a
monitor that pages for a healthy store, or stays quiet while nothing is admitted. Checked over
generated readings (pairs of them, for the trend) and generated lag samples.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from qinglong.contracts.execution import RunState
from qinglong.contracts.observe import StoreStats, Verdict, nearest_rank, percentile, status_verdict

LAWS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NOW = 1_800_000_000_000
GRACE = st.integers(min_value=0, max_value=120_000)


@st.composite
def readings(draw, *, healthy: bool = False) -> StoreStats:
    """A reading at ``NOW``; ``healthy``: a live scheduler and no lost Attempt."""
    due = draw(st.integers(min_value=0, max_value=10_000))
    oldest = NOW - draw(st.integers(min_value=0, max_value=3_600_000)) if due else None
    lag_p99 = draw(st.none() | st.integers(min_value=0, max_value=600_000))
    lag_p50 = None if lag_p99 is None else draw(st.integers(min_value=0, max_value=lag_p99))
    runs = {state.value: draw(st.integers(min_value=0, max_value=50)) for state in RunState}
    return StoreStats(
        now_ms=NOW, schedules_total=due + draw(st.integers(0, 100)),
        schedules_enabled=due, schedules_due=due, oldest_due_ms=oldest, runs_by_state=runs,
        admission_lag_p50_ms=lag_p50, admission_lag_p99_ms=lag_p99,
        admitted_in_window=0 if lag_p99 is None else draw(st.integers(1, 1000)),
        skipped_recent=draw(st.integers(0, 100)),
        lost_recent=0 if healthy else draw(st.integers(0, 3)),
        running=draw(st.integers(0, 10)),
        live_schedulers=draw(st.integers(1, 3)) if healthy else draw(st.integers(0, 3)),
        worker_free_slots=draw(st.none() | st.integers(0, 8)),
    )


def aged(stats: StoreStats, grace_ms: int) -> bool:
    return stats.schedules_due > 0 and stats.now_ms - stats.oldest_due_ms > grace_ms


def on_time(stats: StoreStats, grace_ms: int) -> StoreStats:
    """The same reading with the admission lag within the grace."""
    p99 = None if stats.admission_lag_p99_ms is None else min(stats.admission_lag_p99_ms, grace_ms)
    p50 = None if p99 is None else min(stats.admission_lag_p50_ms, p99)
    return dataclasses.replace(stats, admission_lag_p99_ms=p99, admission_lag_p50_ms=p50)


def within_grace(stats: StoreStats, grace_ms: int) -> StoreStats:
    """The same reading with its due occurrences (if any) waiting at most the grace."""
    if not aged(stats, grace_ms):
        return stats
    return dataclasses.replace(stats, oldest_due_ms=stats.now_ms - grace_ms)


@LAWS
@given(before=st.none() | readings(), now=readings(), grace=GRACE, workers=st.booleans())
def test_clear_has_no_reason_and_every_other_verdict_gives_one(before, now, grace, workers):
    """A non-zero exit without a reason leaves the operator guessing; a reason with exit 0 is a
    problem the monitor never sees."""
    finding = status_verdict(before, now, grace_ms=grace, expect_workers=workers)
    assert finding.verdict in (Verdict.CLEAR, Verdict.CONVERGING, Verdict.ATTENTION)
    assert int(finding.verdict) in (0, 10, 20)
    assert (finding.verdict is Verdict.CLEAR) == (finding.reasons == ())
    assert all(isinstance(r, str) and r and "\n" not in r for r in finding.reasons)


@LAWS
@given(before=st.none() | readings(), now=readings(), grace=GRACE)
def test_no_live_scheduler_or_a_lost_attempt_is_always_attention(before, now, grace):
    """Nobody scheduling, or work lost, must page whatever else looks fine."""
    assume(now.live_schedulers == 0 or now.lost_recent > 0)
    assert status_verdict(before, now, grace_ms=grace).verdict is Verdict.ATTENTION


@LAWS
@given(before=st.none() | readings(healthy=True), now=readings(healthy=True), grace=GRACE)
def test_a_healthy_store_without_an_aged_backlog_is_clear(before, now, grace):
    """A scheduler keeping up is read between an occurrence and its round now and then: occurrences
    due for less than the grace, however many, must not make a monitor flap."""
    now = within_grace(on_time(now, grace), grace)
    before = None if before is None else within_grace(before, grace)
    assert status_verdict(before, now, grace_ms=grace).verdict is Verdict.CLEAR


@LAWS
@given(before=readings(healthy=True), now=readings(healthy=True), grace=GRACE,
       waited=st.floats(min_value=0.0, max_value=1.0), empty=st.booleans())
def test_an_aged_backlog_gone_by_the_second_reading_is_converging(before, now, grace, waited, empty):
    """A scheduler that resumed after a stall drains the backlog at once and admits it late: that
    is recovery (10, wait), not a new problem (20, page), whatever the lag of those admissions."""
    assume(aged(before, grace))
    if empty or not now.schedules_due:  # drained, or only occurrences due within the grace
        now = dataclasses.replace(now, schedules_due=0, oldest_due_ms=None)
    else:
        now = dataclasses.replace(now, oldest_due_ms=NOW - int(waited * grace))
    finding = status_verdict(before, now, grace_ms=grace)
    assert finding.verdict is Verdict.CONVERGING
    assert any("the backlog drained" in reason for reason in finding.reasons)


@LAWS
@given(now=readings(healthy=True), grace=GRACE)
def test_an_aged_backlog_seen_once_is_attention(now, grace):
    """Without a second reading nothing says the backlog drains: late work must page."""
    assume(aged(now, grace))
    assert status_verdict(None, now, grace_ms=grace).verdict is Verdict.ATTENTION


@LAWS
@given(before=readings(healthy=True), now=readings(healthy=True), grace=GRACE)
def test_an_aged_backlog_converges_exactly_when_it_shrinks_or_moves(before, now, grace):
    """Converging (10) tells a monitor to wait; it must mean the backlog really drains: smaller,
    or as large with a newer oldest occurrence. A growing or frozen backlog is attention, and the
    late admissions of a draining one do not turn it into attention."""
    assume(aged(now, grace))
    finding = status_verdict(before, now, grace_ms=grace)
    moves = now.schedules_due < before.schedules_due or (
        now.schedules_due == before.schedules_due and before.oldest_due_ms is not None
        and now.oldest_due_ms > before.oldest_due_ms)
    assert finding.verdict is (Verdict.CONVERGING if moves else Verdict.ATTENTION)


@LAWS
@given(before=st.none() | readings(healthy=True), now=readings(healthy=True), grace=GRACE,
       over=st.integers(min_value=1, max_value=600_000), fresh=st.booleans())
def test_lag_over_the_grace_without_a_draining_backlog_is_attention(before, now, grace, over, fresh):
    """Late admissions with nothing draining mean the scheduler cannot keep up."""
    if before is not None and aged(before, grace):
        before = dataclasses.replace(before, schedules_due=0, oldest_due_ms=None)
    due = now.schedules_due if fresh else 0
    now = dataclasses.replace(now, admission_lag_p99_ms=grace + over, admission_lag_p50_ms=0,
                              admitted_in_window=max(1, now.admitted_in_window), schedules_due=due,
                              oldest_due_ms=NOW - grace if due else None)
    assert status_verdict(before, now, grace_ms=grace).verdict is Verdict.ATTENTION


@LAWS
@given(before=st.none() | readings(), now=readings(), grace=GRACE,
       worse=st.sampled_from(["no_scheduler", "lost", "late", "no_slot"]))
def test_a_worse_reading_never_gets_a_better_verdict(before, now, grace, worse):
    """Losing the scheduler, losing an Attempt, admitting later or running out of worker slots can
    only raise the exit code, never lower it."""
    change = {"no_scheduler": {"live_schedulers": 0}, "lost": {"lost_recent": now.lost_recent + 1},
              "late": {"admission_lag_p99_ms": grace + 1, "admission_lag_p50_ms": 0,
                       "admitted_in_window": max(1, now.admitted_in_window)},
              "no_slot": {"worker_free_slots": 0,
                          "runs_by_state": {**now.runs_by_state, "queued": 1}}}[worse]
    worse_now = dataclasses.replace(now, **change)
    first = status_verdict(before, now, grace_ms=grace, expect_workers=True).verdict
    second = status_verdict(before, worse_now, grace_ms=grace, expect_workers=True).verdict
    assert second >= first


@LAWS
@given(now=readings(healthy=True), slots=st.integers(0, 8), queued=st.integers(0, 20), grace=GRACE)
def test_waiting_runs_without_a_free_worker_slot_are_attention_only_where_workers_are_expected(
        now, slots, queued, grace):
    """Runs that no worker can take never start; where no workers exist (edge) that figure is
    not a finding."""
    now = dataclasses.replace(on_time(now, grace), schedules_due=0, oldest_due_ms=None,
                              worker_free_slots=slots, runs_by_state={**now.runs_by_state, "queued": queued})
    with_workers = status_verdict(None, now, grace_ms=grace, expect_workers=True).verdict
    without = status_verdict(None, now, grace_ms=grace, expect_workers=False).verdict
    assert without is Verdict.CLEAR
    assert with_workers is (Verdict.ATTENTION if queued and slots == 0 else Verdict.CLEAR)


# ---- percentile -------------------------------------------------------------------------------

QUANTILES = st.floats(min_value=0.001, max_value=1.0, allow_nan=False)


@LAWS
@given(values=st.lists(st.integers(min_value=-10_000, max_value=10_000_000), max_size=300), q=QUANTILES)
def test_percentile_is_the_nearest_rank_of_the_sorted_values(values, q):
    """The p50/p99 of ``status`` and ``/metrics`` must be a lag that happened, with at least the
    share q of the lags at or below it and less than q strictly below it."""
    ordered = sorted(values)
    result = percentile(ordered, q)
    if not ordered:
        assert result is None
        return
    assert result in ordered
    n = len(ordered)
    at_or_below = sum(1 for v in ordered if v <= result)
    below = sum(1 for v in ordered if v < result)
    rank = nearest_rank(n, q)
    assert 1 <= rank <= n and ordered[rank - 1] == result
    assert at_or_below >= rank and below < rank


@LAWS
@given(values=st.lists(st.integers(0, 1_000_000), min_size=1, max_size=200), a=QUANTILES, b=QUANTILES)
def test_percentile_grows_with_q_and_ends_at_the_maximum(values, a, b):
    """A p99 below the p50 would be nonsense on a dashboard; p100 is the worst lag seen."""
    ordered = sorted(values)
    low, high = sorted((a, b))
    assert percentile(ordered, low) <= percentile(ordered, high)
    assert percentile(ordered, 1.0) == ordered[-1]
    assert percentile(ordered, 1 / (10 * len(ordered))) == ordered[0]


@LAWS
@given(before=st.none() | readings(), now=readings(), cadence=st.integers(50, 60_000),
       lease=st.integers(1_000, 600_000), leased=st.booleans())
def test_every_surface_judges_with_one_grace_and_expects_workers_where_the_store_has_them(
        before, now, cadence, lease, leased):
    """The command, the page and the gauge all call ``assess``: a surface with its own grace or
    its own idea of whether workers are expected would disagree with the others on one store."""
    from qinglong.contracts.observe import assess, status_grace_ms

    grace = status_grace_ms(cadence, lease, leased=leased)
    assert grace == (3 * cadence + lease if leased else 5 * cadence)
    assert grace > cadence  # an occurrence observed one round late is never late
    assert assess(before, now, grace_ms=grace) == status_verdict(
        before, now, grace_ms=grace, expect_workers=now.worker_free_slots is not None)
