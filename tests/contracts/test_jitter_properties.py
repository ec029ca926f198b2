"""Properties of a trigger's random delay (``qinglong.contracts.jitter``) and of decisions on it.

A broken law here moves a jittered start outside its window, moves it on a restart (a second
process computing another time: an occurrence admitted twice or never), bunches the starts the
jitter is meant to spread, or lets the misfire grace count from the nominal time, so every
jittered occurrence later than the grace would be skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.contracts.decision import decide
from qinglong.contracts.jitter import MAX_JITTER_MS, JitteredSchedule, jitter_offset_ms
from qinglong.contracts.records import DecisionKind, MisfirePolicy
from qinglong.plugins.cron.provider import CronProvider
from qinglong.testing.decision_laws import apply, cursor_at, make_head, settle

PROPERTY_SETTINGS = settings(max_examples=120, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])

MINUTE_MS = 60_000
CRON = CronProvider()
IDS = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,20}", fullmatch=True)
INSTANTS = st.integers(1_577_836_800_000, 2_082_758_400_000)
WINDOWS = st.integers(1, MAX_JITTER_MS)


@PROPERTY_SETTINGS
@given(IDS, IDS, INSTANTS, WINDOWS)
def test_the_delay_lies_inside_its_window(project, trigger, occurrence, window):
    """A delay outside [0, window) would start a job before its time or after its window."""
    offset = jitter_offset_ms(project, trigger, occurrence, window)
    assert 0 <= offset < window
    assert offset == jitter_offset_ms(project, trigger, occurrence, window)


def test_the_delay_is_pinned_so_an_upgrade_does_not_move_a_start():
    """The hash is part of the contract: a new formula would move every jittered start of every
    trigger on upgrade, owing some occurrences twice."""
    assert jitter_offset_ms("ops", "nightly", 1_767_321_000_000, 300_000) == 3_400
    assert jitter_offset_ms("ops", "nightly", 1_767_407_400_000, 300_000) == 45_792


@settings(max_examples=5, deadline=None)
@given(IDS, IDS, st.lists(st.tuples(INSTANTS, WINDOWS), min_size=1, max_size=50))
def test_another_process_with_another_hash_seed_draws_the_same_delays(project, trigger, cases):
    """A restart (a new process, another PYTHONHASHSEED) that drew other delays would move an
    occurrence the first process had already placed."""
    code = ("import json, sys\nfrom qinglong.contracts.jitter import jitter_offset_ms\n"
            "p, t, cases = json.load(sys.stdin)\n"
            "print(json.dumps([jitter_offset_ms(p, t, o, w) for o, w in cases]))")
    here = [jitter_offset_ms(project, trigger, o, w) for o, w in cases]
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps([project, trigger, cases]),
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert json.loads(out.stdout) == here


@settings(max_examples=25, deadline=None)
@given(IDS, IDS, st.integers(1_000, MAX_JITTER_MS), INSTANTS)
def test_delays_spread_evenly_over_the_window(project, trigger, window, start):
    """4,000 consecutive minutes fall into 8 equal parts of the window within 30 % of 500 each
    (7 standard deviations): a bunched draw would start the jobs together anyway."""
    buckets = [0] * 8
    for k in range(4_000):
        offset = jitter_offset_ms(project, trigger, start + k * MINUTE_MS, window)
        buckets[offset * 8 // window] += 1
    assert all(350 <= n <= 650 for n in buckets), buckets


EXPRESSIONS = st.sampled_from(["* * * * *", "*/5 * * * *", "30 2 * * *", "*/10 * * * * *",
                               "0 9 * * 1-5", "15 * * * *"])


@st.composite
def jittered(draw):
    """(plain spec, jittered schedule) for a generated cron trigger and window."""
    spec = CRON.validate({"expression": draw(EXPRESSIONS),
                          "timezone": draw(st.sampled_from(["UTC", "Europe/Berlin"]))})
    window = draw(st.sampled_from([1, 1_000, 5 * MINUTE_MS, 3_600_000]) | WINDOWS)
    return spec, JitteredSchedule(CRON, draw(IDS), draw(IDS), window)


@PROPERTY_SETTINGS
@given(jittered(), INSTANTS)
def test_jittered_times_keep_the_order_of_their_occurrences(case, start):
    """Each jittered time lies in [N, min(N + window, next N)), so the jittered times strictly
    increase and each maps back to its own occurrence: two occurrences never share a start and
    no start overtakes the next occurrence's."""
    spec, schedule = case
    nominal = CRON.next_after(spec, start)
    previous = None
    for _ in range(30):
        following = CRON.next_after(spec, nominal)
        moved = schedule.jittered(spec, nominal)
        assert nominal <= moved < min(nominal + schedule.window_ms, following)
        assert schedule.nominal_of(spec, moved) == nominal
        if previous is not None:
            assert moved > previous
            assert schedule.next_after(spec, previous) == moved
        assert schedule.latest_at_or_before(spec, moved) == moved
        if previous is not None:
            assert schedule.latest_at_or_before(spec, moved - 1) == previous
        previous, nominal = moved, following


@PROPERTY_SETTINGS
@given(jittered(), INSTANTS, st.sampled_from(list(MisfirePolicy)), st.integers(0, 3 * MINUTE_MS),
       st.lists(st.integers(0, 20 * MINUTE_MS), min_size=1, max_size=12))
def test_decisions_on_a_jittered_trigger_keep_every_law(case, published, policy, grace, steps):
    """The decision laws hold on jittered times (qinglong.testing.decision_laws checks each
    decision, its delay included); no occurrence is admitted twice, none before its jittered
    time, and with on-time observations each one exactly once at its jittered time."""
    spec, schedule = case
    head = make_head("cron", spec, policy, grace, jitter_ms=schedule.window_ms)
    head = type(head)(**{**{f: getattr(head, f) for f in head.__slots__},
                         "project_id": schedule.project_id, "trigger_id": schedule.trigger_id})
    admitted: list[int] = []
    cursor = settle(head, cursor_at(head, None, published_at_ms=published), published, CRON, admitted)
    observed = published
    for step in steps:
        observed += step
        cursor = settle(head, cursor, observed, CRON, admitted)
    assert admitted == sorted(set(admitted))
    assert all(t <= observed for t in admitted)
    nominals = [schedule.nominal_of(spec, t) for t in admitted]
    assert len(set(nominals)) == len(nominals) and all(n > published for n in nominals)
    if all(step <= grace for step in steps):
        first = schedule.first_after_nominal(spec, published)
        expected = []
        while first is not None and first <= observed:
            expected.append(first)
            first = schedule.next_after(spec, first)
        assert admitted == expected


def test_the_misfire_grace_counts_from_the_jittered_time():
    """An occurrence observed within the grace of its jittered time fires; counted from the
    nominal time instead, a delay longer than the grace would skip every occurrence."""
    spec = CRON.validate({"expression": "30 2 * * *", "timezone": "UTC"})
    head = make_head("cron", spec, MisfirePolicy.SKIP, 10_000, jitter_ms=3_600_000)
    schedule = JitteredSchedule(CRON, "p1", "t1", 3_600_000)
    nominal = CRON.next_after(spec, 1_767_225_600_000)
    moved = schedule.jittered(spec, nominal)
    assert moved - nominal > 10_000  # this occurrence's delay is longer than the grace
    cursor = cursor_at(head, moved)
    assert decide(head, cursor, moved - 1, CRON).kind is DecisionKind.NOT_DUE
    fire = decide(head, cursor, moved + 10_000, CRON)
    assert fire.kind is DecisionKind.FIRE and fire.scheduled_for_ms == moved
    assert fire.jitter_ms == moved - nominal
    assert decide(head, cursor, moved + 10_001, CRON).kind is DecisionKind.MISFIRE_SKIP
    assert apply(fire, cursor).next_fire_at_ms == schedule.jittered(spec, nominal + 86_400_000)


def test_a_new_jitter_never_owes_again_an_occurrence_the_old_revision_had():
    """Republished after an occurrence started, with a jitter that would move it past the
    publish: the new revision starts at the next occurrence, or the job would run twice."""
    spec = CRON.validate({"expression": "0 * * * *", "timezone": "UTC"})
    nominal = 1_767_225_600_000  # 2026-01-01 00:00 UTC
    head = make_head("cron", spec, MisfirePolicy.FIRE_ONCE, 60_000, jitter_ms=3_600_000)
    schedule = JitteredSchedule(CRON, "p1", "t1", 3_600_000)
    published = nominal + 1
    assert schedule.next_after(spec, published) == schedule.jittered(spec, nominal)
    init = decide(head, cursor_at(head, None, published_at_ms=published), published, CRON)
    assert init.next_fire_at_ms == schedule.jittered(spec, nominal + 3_600_000)
