"""The decision contract's laws, applied to the ``interval`` provider with Qinglong's kit.

``qinglong.contracts.decision.decide`` turns any provider's occurrences into Runs. The laws and the
reference model come from ``qinglong.testing.decision_laws``, the same functions Qinglong checks
cron with (``tests/contracts/test_decision_properties.py``), so this distribution proves, on its
own, that its kind fires every on-time occurrence exactly once, never twice, and at most once per
misfire.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.contracts.decision import decide
from qinglong.contracts.records import DecisionKind, MisfirePolicy
from qinglong.testing.decision_laws import (
    assert_decision_laws,
    cursor_at,
    expected_admissions,
    make_head,
    settle,
)
from qinglong_interval import IntervalProvider

INTERVAL = IntervalProvider()
LAWS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICIES = st.sampled_from(list(MisfirePolicy))
INSTANTS = st.integers(1_577_836_800_000, 2_082_758_400_000)  # 2020-2035


def interval_head(spec, policy: MisfirePolicy, grace_ms: int):
    """An interval trigger head at revision 1."""
    return make_head("interval", spec, policy, grace_ms)


@st.composite
def schedules(draw):
    """(head, every_ms) for a generated interval trigger with a policy and a grace of up to 30 periods."""
    every = draw(st.one_of(st.sampled_from([1_000, 1_500, 60_000, 3_600_000]), st.integers(1_000, 86_400_000)))
    spec = INTERVAL.validate({"every_ms": every, "anchor_ms": draw(st.integers(-every, every))})
    grace = draw(st.one_of(st.sampled_from([0, 1, 999, 1_000]), st.integers(0, 30 * every)))
    return interval_head(spec, draw(POLICIES), grace), every


@LAWS
@given(schedules(), INSTANTS, st.data())
def test_fire_once_admits_at_most_one_run_whatever_the_backlog(schedule, start, data):
    """A backlog of any length becomes one Run (the latest); replaying it would flood the workers."""
    head, every = schedule
    head = interval_head(head.spec, MisfirePolicy.FIRE_ONCE, head.misfire_grace_ms)
    cursor = cursor_at(head, INTERVAL.next_after(head.spec, start))
    backlog = data.draw(st.integers(head.misfire_grace_ms + 1, head.misfire_grace_ms + 10**6 * every))
    admitted: list[int] = []
    settle(head, cursor, cursor.next_fire_at_ms + backlog, INTERVAL, admitted)
    assert admitted == [INTERVAL.latest_at_or_before(head.spec, cursor.next_fire_at_ms + backlog)]


@LAWS
@given(schedules(), INSTANTS, st.data())
def test_skip_never_admits_a_misfired_occurrence(schedule, start, data):
    """``skip`` drops a late backlog entirely; a Run there is work the operator asked not to do."""
    head, every = schedule
    head = interval_head(head.spec, MisfirePolicy.SKIP, head.misfire_grace_ms)
    cursor = cursor_at(head, INTERVAL.next_after(head.spec, start))
    observed = cursor.next_fire_at_ms + data.draw(st.integers(head.misfire_grace_ms + 1, 10**6 * every))
    admitted: list[int] = []
    after = settle(head, cursor, observed, INTERVAL, admitted)
    assert admitted == [] and after.next_fire_at_ms > observed


@LAWS
@given(schedules(), st.one_of(st.none(), INSTANTS), INSTANTS)
def test_the_same_inputs_give_the_same_decision_and_keep_the_cursor_laws(schedule, cursor_from, observed):
    """Every replica decides alike, and each decision moves the cursor where the contract says."""
    head, _ = schedule
    cursor = cursor_at(head, None if cursor_from is None else INTERVAL.next_after(head.spec, cursor_from))
    decision = decide(head, cursor, observed, INTERVAL)
    assert decision == decide(head, cursor, observed, IntervalProvider())
    assert_decision_laws(decision, head, cursor, observed, INTERVAL)
    if decision.kind is DecisionKind.FIRE:  # an interval steps exactly one period
        assert decision.next_fire_at_ms == decision.scheduled_for_ms + head.spec["every_ms"]


@st.composite
def observation_runs(draw):
    """(head, initialization time, observations), where observations may also step backward."""
    head, every = draw(schedules())
    start = draw(INSTANTS)
    step = st.one_of(
        st.integers(-40 * every, 40 * every),
        st.integers(0, head.misfire_grace_ms + every),
        st.integers(head.misfire_grace_ms + 1, head.misfire_grace_ms + 400 * every),
    )
    observations, now = [], start
    for delta in draw(st.lists(step, min_size=1, max_size=8)):
        now += delta
        observations.append(now)
    return head, start, observations


@LAWS
@given(observation_runs())
def test_repeated_decisions_admit_each_on_time_occurrence_once_and_never_twice(run):
    """Across a run of observations (also jumping backward) admissions match the model, in order, without duplicates."""
    head, start, observations = run
    admitted: list[int] = []
    cursor = settle(head, cursor_at(head, None), start, INTERVAL, admitted)
    assert admitted == []
    for observed in observations:
        cursor = settle(head, cursor, observed, INTERVAL, admitted)
    assert admitted == sorted(set(admitted))
    assert admitted == expected_admissions(INTERVAL, head, start, observations)


def test_an_occurrence_past_the_calendar_is_no_further_occurrence():
    """``every_ms = 10**20`` is a spec the provider accepts, and its first occurrence lies past
    year 9999 and past 64 bits: a cursor holding it cannot be stored (a store's integer
    overflows) nor shown as a date. The decision must say there is no further occurrence."""
    from qinglong.contracts.records import NO_MORE_OCCURRENCES_MS

    now = 1_800_000_000_000
    for spec, jitter in (({"every_ms": 10**20}, 0), ({"every_ms": 10**20}, 60_000),
                         ({"every_ms": 253_402_300_800_000 - now, "anchor_ms": now}, 0)):
        head = make_head("interval", INTERVAL.validate(spec), MisfirePolicy.FIRE_ONCE, 60_000, jitter_ms=jitter)
        decision = decide(head, cursor_at(head, None), now, INTERVAL)
        assert decision.kind is DecisionKind.INITIALIZE
        assert decision.next_fire_at_ms == NO_MORE_OCCURRENCES_MS
