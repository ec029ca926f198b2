"""Properties of the profile-neutral decision contract (``qinglong.contracts.decision.decide``).

Both scheduler backends commit whatever ``decide`` returns, so a broken law here is a lost or
duplicated Run in every profile. The laws are checked with the real cron provider over generated
expressions, zones (including the DST zones and Lord Howe's 30-minute shift), cursors, publish and
observation times, misfire policies and graces, and with a fixed-period provider that has no cron
at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from qinglong.contracts.decision import decide, initialization_base_ms
from qinglong.contracts.errors import TriggerSpecError
from qinglong.contracts.records import (
    NO_MORE_OCCURRENCES_MS,
    DecisionKind,
    MisfirePolicy,
    ScheduleCursor,
)
from qinglong.plugins.cron.provider import CronProvider
from qinglong.testing.decision_laws import (
    apply,
    assert_decision_laws,
    cursor_at,
    expected_admissions,
    initialization_base,
    make_head,
    occurrences_between,
    settle,
)

PROPERTY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata")

#: Instants (UTC) of the 2024 transitions of the DST zones, so generated times often straddle one.
TRANSITIONS_MS = tuple(
    int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()) * 1000
    for text in (
        "2024-03-10T07:00:00",  # New York springs forward
        "2024-11-03T06:00:00",  # New York falls back
        "2024-03-31T01:00:00",  # Berlin springs forward
        "2024-10-27T01:00:00",  # Berlin falls back
        "2024-04-06T15:00:00",  # Lord Howe falls back 30 minutes
        "2024-10-05T15:30:00",  # Lord Howe springs forward 30 minutes
    )
)
YEARS_2020_2035_MS = (1_577_836_800_000, 2_082_758_400_000)

CRON = CronProvider()


# --- generators -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CronCase:
    """A generated cron spec with the nominal spacing of its occurrences (to size graces and gaps)."""

    expression: str
    period_ms: int


def cron_cases() -> st.SearchStrategy[CronCase]:
    """Every second, */N seconds, */N minutes, hourly, daily at h:m, and weekday sets."""
    every_second = st.just(CronCase("* * * * * *", SECOND_MS))
    every_n_seconds = st.sampled_from([5, 10, 15, 30]).map(lambda n: CronCase(f"*/{n} * * * * *", n * SECOND_MS))
    every_n_minutes = st.sampled_from([1, 2, 5, 7, 10, 15, 20, 30]).map(
        lambda n: CronCase(f"*/{n} * * * *", n * MINUTE_MS)
    )
    hourly = st.integers(0, 59).map(lambda m: CronCase(f"{m} * * * *", HOUR_MS))
    hour = st.one_of(st.sampled_from([1, 2, 3]), st.integers(0, 23))  # 1-3 h are the DST hours
    daily = st.tuples(st.integers(0, 59), hour).map(lambda mh: CronCase(f"{mh[0]} {mh[1]} * * *", DAY_MS))
    weekdays = st.tuples(
        st.integers(0, 59), hour, st.sets(st.integers(0, 6), min_size=1, max_size=7)
    ).map(lambda t: CronCase(f"{t[0]} {t[1]} * * {','.join(map(str, sorted(t[2])))}", DAY_MS))
    return st.one_of(every_second, every_n_seconds, every_n_minutes, hourly, daily, weekdays)


def instants() -> st.SearchStrategy[int]:
    """Epoch ms between 2020 and 2035, half of them within six hours of a DST transition."""
    anywhere = st.integers(*YEARS_2020_2035_MS)
    near_transition = st.builds(
        lambda t, d: t + d, st.sampled_from(TRANSITIONS_MS), st.integers(-6 * HOUR_MS, 6 * HOUR_MS)
    )
    return st.one_of(anywhere, near_transition)


def graces(period_ms: int) -> st.SearchStrategy[int]:
    """Misfire graces from zero to about thirty periods (bounded so a backlog stays cheap)."""
    usual = [g for g in (0, 1, 999, SECOND_MS, MINUTE_MS) if g <= 30 * period_ms]
    return st.one_of(st.sampled_from(usual), st.integers(0, 30 * period_ms))


POLICIES = st.sampled_from(list(MisfirePolicy))


def backlogs(period_ms: int) -> st.SearchStrategy[int]:
    """How late an observation is: within a few periods, a few thousand periods, or up to 400 days."""
    return st.one_of(
        st.integers(0, 50 * period_ms), st.integers(0, 3_000 * period_ms), st.integers(0, 400 * DAY_MS)
    )


def observations_near(period_ms: int, cursor_ms: int | None) -> st.SearchStrategy[int]:
    """Any instant for a fresh cursor; else one close to the cursor (before it, or late by a backlog)."""
    if cursor_ms is None:
        return instants()
    return st.one_of(
        st.builds(lambda d: cursor_ms + d, st.integers(-40 * period_ms, 0)),
        st.builds(lambda d: cursor_ms + d, backlogs(period_ms)),
    )


@st.composite
def cron_schedules(draw):
    """(provider, head) for a generated cron trigger in a generated zone, policy and grace."""
    case = draw(cron_cases())
    zone = draw(st.sampled_from(ZONES))
    spec = CRON.validate({"expression": case.expression, "timezone": zone})
    head = make_head("cron", spec, draw(POLICIES), draw(graces(case.period_ms)))
    return CRON, head, case.period_ms


# --- a provider without cron ------------------------------------------------------------------


class FixedPeriodProvider:
    """Occurrences at ``offset_ms + k * period_ms`` for every integer k; optionally none after ``until_ms``."""

    kind = "fixed_period"

    def validate(self, spec):
        """Return the spec unchanged (test provider)."""
        return dict(spec)

    def next_after(self, spec, after_ms):
        """First ``offset + k * period`` strictly after ``after_ms``."""
        period, offset = spec["period_ms"], spec.get("offset_ms", 0)
        nxt = offset + ((after_ms - offset) // period + 1) * period
        until = spec.get("until_ms")
        return None if until is not None and nxt > until else nxt

    def latest_at_or_before(self, spec, at_ms):
        """Last ``offset + k * period`` at or before ``at_ms``."""
        period, offset = spec["period_ms"], spec.get("offset_ms", 0)
        latest = offset + ((at_ms - offset) // period) * period
        until = spec.get("until_ms")
        if until is not None and latest > until:
            return self.latest_at_or_before(spec, until)
        return latest

    def describe(self, spec):
        """``every <period> ms from <offset>``."""
        return f"every {spec['period_ms']} ms from {spec.get('offset_ms', 0)}"


FIXED = FixedPeriodProvider()


@st.composite
def fixed_schedules(draw):
    """(provider, head) for a fixed-period trigger."""
    period = draw(st.sampled_from([1, 7, SECOND_MS, 1_500, MINUTE_MS, HOUR_MS, DAY_MS]) | st.integers(1, DAY_MS))
    spec = {"period_ms": period, "offset_ms": draw(st.integers(-period, period))}
    head = make_head("fixed_period", spec, draw(POLICIES), draw(graces(period)))
    return FIXED, head, period


def any_schedules():
    """Cron schedules and fixed-period schedules."""
    return st.one_of(cron_schedules(), fixed_schedules())


# --- the laws of one decision: qinglong.testing.decision_laws, shared with plugin authors ---------


# --- properties -------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(cron_schedules(), instants())
def test_repeated_next_after_yields_strictly_increasing_occurrences(schedule, start_ms):
    """Occurrences must strictly increase; otherwise a cursor could stall (no Runs) or go back (duplicates)."""
    provider, head, _ = schedule
    current = start_ms
    for _ in range(25):
        nxt = provider.next_after(head.spec, current)
        assert nxt is not None and nxt > current
        current = nxt


@PROPERTY_SETTINGS
@given(any_schedules(), instants(), st.data())
def test_fire_once_admits_at_most_one_run_whatever_the_backlog(schedule, cursor_from_ms, data):
    """A ``fire_once`` misfire admits one Run, the latest due; a backlog replay would flood workers."""
    provider, head, period = schedule
    backlog_ms = data.draw(backlogs(period))
    head = make_head(head.kind, head.spec, MisfirePolicy.FIRE_ONCE, head.misfire_grace_ms)
    cursor = cursor_at(head, provider.next_after(head.spec, cursor_from_ms))
    observed = cursor.next_fire_at_ms + backlog_ms
    decision = decide(head, cursor, observed, provider)
    assert_decision_laws(decision, head, cursor, observed, provider)
    if backlog_ms > head.misfire_grace_ms:
        assert decision.kind is DecisionKind.MISFIRE_FIRE_ONCE
        assert decision.scheduled_for_ms == provider.latest_at_or_before(head.spec, observed)
    admitted: list[int] = []
    settle(head, cursor, observed, provider, admitted)
    if backlog_ms > head.misfire_grace_ms:
        assert len(admitted) == 1


@PROPERTY_SETTINGS
@given(any_schedules(), instants(), st.data())
def test_skip_policy_never_admits_a_misfired_occurrence(schedule, cursor_from_ms, data):
    """``skip`` must admit nothing once the cursor is older than the grace; a Run there is unwanted work."""
    provider, head, period = schedule
    backlog_ms = data.draw(backlogs(period))
    head = make_head(head.kind, head.spec, MisfirePolicy.SKIP, head.misfire_grace_ms)
    cursor = cursor_at(head, provider.next_after(head.spec, cursor_from_ms))
    observed = cursor.next_fire_at_ms + backlog_ms
    decision = decide(head, cursor, observed, provider)
    assert_decision_laws(decision, head, cursor, observed, provider)
    if backlog_ms > head.misfire_grace_ms:
        assert decision.kind is DecisionKind.MISFIRE_SKIP
        assert decision.scheduled_for_ms is None and not decision.admits_run
        assert decision.skipped is not None and decision.skipped.first_ms == cursor.next_fire_at_ms
        assert decision.skipped.last_ms <= observed
        admitted: list[int] = []
        after = settle(head, apply(decision, cursor), observed, provider, admitted)
        assert admitted == [] and after.next_fire_at_ms > observed


@PROPERTY_SETTINGS
@given(any_schedules(), st.one_of(st.none(), instants()), st.data())
def test_every_decision_keeps_the_cursor_laws(schedule, cursor_from_ms, data):
    """skip/fire_once move the cursor past the observation; fire past the admitted one, within
    grace; initialize to the first occurrence after min(published, observed).

    If a cursor stayed at or before the observation after a misfire, the next round would decide
    the same backlog again (a second Run); if ``fire`` left it on the admitted occurrence, that
    occurrence would be admitted twice; an initial cursor past an occurrence owed since the
    publish would lose it.
    """
    provider, head, period = schedule
    nxt = None if cursor_from_ms is None else provider.next_after(head.spec, cursor_from_ms)
    observed_ms = data.draw(observations_near(period, nxt))
    published = None
    if nxt is None:
        published = data.draw(publish_times(observed_ms, period, head.misfire_grace_ms))
    cursor = cursor_at(head, nxt, published_at_ms=published)
    decision = decide(head, cursor, observed_ms, provider)
    assert_decision_laws(decision, head, cursor, observed_ms, provider)


@PROPERTY_SETTINGS
@given(any_schedules(), st.one_of(st.none(), instants()), st.data())
def test_the_same_inputs_give_the_same_decision(schedule, cursor_from_ms, data):
    """Both backends and every replica must reach the same decision; otherwise profiles fire differently."""
    provider, head, period = schedule
    nxt = None if cursor_from_ms is None else provider.next_after(head.spec, cursor_from_ms)
    cursor = cursor_at(head, nxt)
    observed_ms = data.draw(observations_near(period, nxt))
    first = decide(head, cursor, observed_ms, provider)
    # A fresh provider and equal (not identical) records must not matter either.
    again = decide(
        make_head(head.kind, dict(head.spec), head.misfire_policy, head.misfire_grace_ms),
        cursor_at(head, nxt),
        observed_ms,
        type(provider)(),
    )
    assert first == again == decide(head, cursor, observed_ms, provider)


def publish_times(start_ms: int, period_ms: int, grace_ms: int) -> st.SearchStrategy[int | None]:
    """When the revision was published, relative to its first observation ``start_ms``: unknown,
    just before it, within or beyond the grace before it, or after it (a clock that went back)."""
    return st.one_of(
        st.none(),
        st.builds(lambda d: start_ms - d, st.integers(0, 3 * period_ms)),
        st.builds(lambda d: start_ms - d, st.integers(0, grace_ms + 2 * period_ms)),
        st.builds(lambda d: start_ms - d, st.sampled_from([0, 1, 300, grace_ms, grace_ms + 1])),
        st.builds(lambda d: start_ms - d, st.integers(0, 400 * period_ms)),
        st.builds(lambda d: start_ms + d, st.integers(1, 40 * period_ms)),
    )


@st.composite
def observation_runs(draw, backward: bool):
    """(schedule, initialization time, observations, publish time) with gaps sized to the
    schedule's spacing."""
    provider, head, period = draw(any_schedules())
    start = draw(instants())
    published = draw(publish_times(start, period, head.misfire_grace_ms))
    low = -40 * period if backward else 0
    step = st.one_of(
        st.integers(low, 40 * period),
        st.integers(low, head.misfire_grace_ms + period),
        st.integers(head.misfire_grace_ms + 1, head.misfire_grace_ms + 400 * period),
        st.sampled_from([0, 1, 999, 1_000, period, head.misfire_grace_ms, head.misfire_grace_ms + 1]),
    )
    steps = draw(st.lists(step, min_size=1, max_size=8))
    observations, now = [], start
    for delta in steps:
        now = now + delta
        observations.append(now)
    return provider, head, start, observations, published


def run_observations(provider, head, start, observations, published_at_ms=None):
    """Initialize at ``start``, then settle at each observation; return the admitted occurrences."""
    admitted: list[int] = []
    cursor = settle(head, cursor_at(head, None, published_at_ms=published_at_ms), start, provider, admitted)
    assert cursor.next_fire_at_ms > start
    if published_at_ms is None or published_at_ms >= start:
        assert admitted == []  # nothing is owed from before the first observation
    for observed in observations:
        cursor = settle(head, cursor, observed, provider, admitted)
        assert cursor.next_fire_at_ms > observed
    return admitted


@PROPERTY_SETTINGS
@given(observation_runs(backward=False))
def test_repeated_decisions_admit_each_on_time_occurrence_exactly_once(run):
    """Deciding again and again at non-decreasing observations admits exactly what the model says.

    Every occurrence that is reached within its grace is admitted once (a miss is a lost Run),
    none twice (a duplicate Run), and a misfire admits the latest occurrence (fire_once) or none
    (skip).
    """
    provider, head, start, observations, published = run
    admitted = run_observations(provider, head, start, observations, published)
    assert admitted == sorted(set(admitted))
    assert admitted == expected_admissions(provider, head, start, observations, published)


@PROPERTY_SETTINGS
@given(observation_runs(backward=True))
def test_an_observation_jumping_backward_never_admits_an_occurrence_twice(run):
    """A clock that steps back (failover to a lagging node, NTP step) must not readmit an occurrence."""
    provider, head, start, observations, published = run
    admitted = run_observations(provider, head, start, observations, published)
    assert admitted == sorted(set(admitted))
    base = start if published is None else min(published, start)
    assert all(base < a <= max([start, *observations]) for a in admitted)
    assert admitted == expected_admissions(provider, head, start, observations, published)


@PROPERTY_SETTINGS
@given(any_schedules(), instants(), st.integers(1, 12))
def test_on_time_observations_admit_every_occurrence_whatever_the_policy(schedule, start, rounds):
    """Observed within the grace of each occurrence, no policy may drop one: the schedule is simply on time."""
    provider, head, period = schedule
    grace = max(head.misfire_grace_ms, period)
    head = make_head(head.kind, head.spec, head.misfire_policy, grace)
    observations = [start + grace * i for i in range(1, rounds + 1)]
    admitted = run_observations(provider, head, start, observations)
    assert admitted == occurrences_between(provider, head.spec, start, observations[-1])


# --- initialization from the publish time -------------------------------------------------------


@PROPERTY_SETTINGS
@given(any_schedules(), instants(), st.data())
def test_initialization_counts_from_the_earlier_of_publish_and_observation(schedule, observed, data):
    """The first cursor is the first occurrence strictly after min(published, observed).

    Counting from the observation would lose an occurrence between the publish and the
    scheduler's first look; counting from a publish time later than the observation (a clock that
    stepped back) would skip the occurrences before it without a record.
    """
    provider, head, period = schedule
    published = data.draw(publish_times(observed, period, head.misfire_grace_ms))
    cursor = cursor_at(head, None, published_at_ms=published)
    decision = decide(head, cursor, observed, provider)
    assert decision.kind is DecisionKind.INITIALIZE
    assert_decision_laws(decision, head, cursor, observed, provider)
    assert initialization_base_ms(cursor, observed) == initialization_base(cursor, observed)
    base = initialization_base(cursor, observed)
    assert occurrences_between(provider, head.spec, base, decision.next_fire_at_ms - 1) == []


@PROPERTY_SETTINGS
@given(any_schedules(), instants(), st.data())
def test_an_occurrence_owed_since_the_publish_is_decided_at_the_first_observation_once(schedule, observed, data):
    """Every occurrence in (published, observed] is settled by the decisions at that same
    observation: admitted (each one on time within the grace, or the latest by fire_once) or
    reported skipped, never silently lost, and never admitted again by a later observation.

    A store that waited a round after initializing would delay it a cadence; one that
    re-initialized from the observation would lose it; a cursor left at or before the observation
    would admit it twice.
    """
    provider, head, period = schedule
    published = observed - data.draw(st.integers(0, head.misfire_grace_ms + 3 * period))
    owed = occurrences_between(provider, head.spec, published, observed)
    assume(len(owed) <= 2_000)
    cursor = cursor_at(head, None, published_at_ms=published)
    admitted: list[int] = []
    skipped: list = []
    for _ in range(len(owed) + 2):
        decision = decide(head, cursor, observed, provider)
        assert_decision_laws(decision, head, cursor, observed, provider)
        if decision.kind is DecisionKind.NOT_DUE:
            break
        if decision.admits_run:
            admitted.append(decision.scheduled_for_ms)
        if decision.skipped is not None:
            skipped.append(decision.skipped)
        cursor = apply(decision, cursor)
    else:
        raise AssertionError(f"still due after {len(owed) + 2} decisions")
    assert cursor.next_fire_at_ms > observed
    assert admitted == sorted(set(admitted)) and set(admitted) <= set(owed)
    if owed and observed - owed[0] <= head.misfire_grace_ms:
        assert admitted == owed and skipped == []
    elif owed:
        assert admitted == ([owed[-1]] if head.misfire_policy is MisfirePolicy.FIRE_ONCE else [])
        for occurrence in owed:
            reported = [r for r in skipped if r.first_ms <= occurrence <= r.last_ms]
            assert (occurrence in admitted) != bool(reported), f"{occurrence} lost or both admitted and skipped"
        assert sum(r.count for r in skipped) == len(owed) - len(admitted)
    else:
        assert admitted == [] and skipped == []
    later: list[int] = []
    settle(head, cursor, observed + data.draw(st.integers(0, 3 * period)), provider, later)
    assert not set(later) & set(admitted), "an owed occurrence was admitted twice"


def test_a_daily_job_published_just_before_its_time_still_runs_then():
    """Edited at 01:59:59.7 and first observed at 02:00:00.5, the 02:00 occurrence is admitted at
    that observation; counting from the observation would lose the day's run."""
    head = make_head("cron", CRON.validate({"expression": "0 2 * * *", "timezone": "UTC"}),
                     MisfirePolicy.SKIP, 60_000)
    two_am = int(datetime(2024, 5, 1, 2, tzinfo=timezone.utc).timestamp()) * 1000
    cursor = cursor_at(head, None, published_at_ms=two_am - 300)
    first = decide(head, cursor, two_am + 500, CRON)
    assert (first.kind, first.next_fire_at_ms) == (DecisionKind.INITIALIZE, two_am)
    second = decide(head, apply(first, cursor), two_am + 500, CRON)
    assert (second.kind, second.scheduled_for_ms, second.next_fire_at_ms) == (
        DecisionKind.FIRE, two_am, two_am + DAY_MS)


def test_an_occurrence_at_the_publish_instant_is_not_owed():
    """Strictly after the publish: a trigger published at 10:00:00.000 exactly does not owe the
    10:00 occurrence (it was not yet published when that instant began)."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.FIRE_ONCE, 5_000)
    decision = decide(head, cursor_at(head, None, published_at_ms=10_000), 12_500, FIXED)
    assert (decision.kind, decision.next_fire_at_ms) == (DecisionKind.INITIALIZE, 11_000)
    admitted: list[int] = []
    settle(head, cursor_at(head, None, published_at_ms=10_000), 12_500, FIXED, admitted)
    assert admitted == [11_000, 12_000]


def test_a_publish_time_after_the_observation_counts_from_the_observation():
    """A publish stamped later than the observation (the clock stepped back) must not push the
    first cursor past occurrences that are still ahead of the observation."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.FIRE_ONCE, 5_000)
    decision = decide(head, cursor_at(head, None, published_at_ms=50_000), 10_500, FIXED)
    assert (decision.kind, decision.next_fire_at_ms) == (DecisionKind.INITIALIZE, 11_000)


# --- the fixed-period provider: exact expectations ----------------------------------------------


def test_fixed_period_fire_admits_the_cursor_and_moves_one_period():
    """An on-time occurrence is admitted and the cursor moves exactly one period; no skip or loss."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.FIRE_ONCE, 5_000)
    decision = decide(head, cursor_at(head, 10_000), 12_500, FIXED)
    assert (decision.kind, decision.scheduled_for_ms, decision.next_fire_at_ms) == (DecisionKind.FIRE, 10_000, 11_000)


def test_fixed_period_fire_once_admits_the_latest_and_reports_the_rest_as_skipped():
    """A backlog of 91 occurrences becomes one Run (the latest) and 90 skipped, never 91 Runs."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.FIRE_ONCE, 5_000)
    decision = decide(head, cursor_at(head, 10_000), 100_500, FIXED)
    assert decision.kind is DecisionKind.MISFIRE_FIRE_ONCE
    assert (decision.scheduled_for_ms, decision.next_fire_at_ms) == (100_000, 101_000)
    assert (decision.skipped.first_ms, decision.skipped.last_ms, decision.skipped.count) == (10_000, 99_000, 90)
    assert decision.skipped.count_exact


def test_fixed_period_skip_reports_every_skipped_occurrence_and_admits_none():
    """``skip`` counts what it dropped so operators can see it, and admits nothing."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.SKIP, 5_000)
    decision = decide(head, cursor_at(head, 10_000), 100_500, FIXED)
    assert decision.kind is DecisionKind.MISFIRE_SKIP and not decision.admits_run
    assert decision.next_fire_at_ms == 101_000
    assert (decision.skipped.first_ms, decision.skipped.last_ms, decision.skipped.count) == (10_000, 100_000, 91)


def test_huge_skipped_backlog_is_reported_as_a_lower_bound():
    """Counting a decade of milliseconds one by one would stall the round; the count is bounded instead."""
    head = make_head("fixed_period", {"period_ms": 1}, MisfirePolicy.SKIP, 0)
    decision = decide(head, cursor_at(head, 0), 10**12, FIXED)
    assert decision.next_fire_at_ms == 10**12 + 1
    assert not decision.skipped.count_exact and decision.skipped.count >= 1


def test_grace_boundary_is_inclusive():
    """An occurrence exactly ``grace`` old is still on time; one millisecond more is a misfire."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.SKIP, 5_000)
    assert decide(head, cursor_at(head, 10_000), 15_000, FIXED).kind is DecisionKind.FIRE
    assert decide(head, cursor_at(head, 10_000), 15_001, FIXED).kind is DecisionKind.MISFIRE_SKIP


def test_cursor_exactly_at_the_observation_is_due():
    """``next_fire_at_ms == observed`` fires now; treating it as not due would delay every Run a round."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.SKIP, 0)
    decision = decide(head, cursor_at(head, 10_000), 10_000, FIXED)
    assert (decision.kind, decision.scheduled_for_ms) == (DecisionKind.FIRE, 10_000)


def test_initialize_never_admits_the_occurrence_at_the_observation():
    """The first cursor is strictly after the observation: publishing at 10:00 does not fire 10:00 retroactively."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.FIRE_ONCE, 5_000)
    decision = decide(head, cursor_at(head, None), 10_000, FIXED)
    assert (decision.kind, decision.next_fire_at_ms, decision.admits_run) == (DecisionKind.INITIALIZE, 11_000, False)


def test_a_provider_with_no_more_occurrences_parks_the_cursor_forever():
    """After the last occurrence the cursor is NO_MORE_OCCURRENCES_MS, which is never due, so nothing refires."""
    head = make_head("fixed_period", {"period_ms": 1_000, "until_ms": 3_000}, MisfirePolicy.FIRE_ONCE, 60_000)
    decision = decide(head, cursor_at(head, 3_000), 3_500, FIXED)
    assert (decision.kind, decision.scheduled_for_ms, decision.next_fire_at_ms) == (
        DecisionKind.FIRE, 3_000, NO_MORE_OCCURRENCES_MS
    )
    assert decide(head, apply(decision, cursor_at(head, 3_000)), 10**15, FIXED).kind is DecisionKind.NOT_DUE


class _StuckProvider(FixedPeriodProvider):
    kind = "fixed_period"

    def next_after(self, spec, after_ms):
        return after_ms  # not strictly after: would make the cursor stall on one occurrence


def test_a_provider_that_does_not_advance_is_refused():
    """A cursor that does not move would admit the same occurrence forever; ``decide`` refuses it."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.FIRE_ONCE, 60_000)
    with pytest.raises(TriggerSpecError, match="next_after"):
        decide(head, cursor_at(head, 1_000), 1_500, _StuckProvider())


def test_a_cursor_of_another_revision_is_refused():
    """A stale cursor belongs to an older revision; deciding with it could fire the old schedule."""
    head = make_head("fixed_period", {"period_ms": 1_000}, MisfirePolicy.FIRE_ONCE, 60_000, revision=2)
    with pytest.raises(ValueError, match="revision"):
        decide(head, ScheduleCursor(1, 1_000, None, 1), 1_500, FIXED)


def test_a_provider_of_another_kind_is_refused():
    """Deciding a cron trigger with another kind's arithmetic would fire the wrong occurrences."""
    head = make_head("cron", {"expression": "* * * * *", "timezone": "UTC"}, MisfirePolicy.FIRE_ONCE, 0)
    with pytest.raises(ValueError, match="cannot decide"):
        decide(head, cursor_at(head, None), 0, FIXED)
