"""The cron provider: DST behaviour, consistency of its two queries, seconds, milliseconds, validation.

The documented rule (``qinglong/plugins/cron/provider.py``): a wall time inside a DST gap fires
once at the first instant after the jump; a repeated wall time fires once, at its first instant;
nothing fires during the second pass of a repeated hour. Put differently, a matching wall time W
fires at the first instant whose local wall time is at or after W, and wall times that map to the
same instant fire once. ``first_instant_at_or_after_wall`` below computes exactly that by brute
force, independently of the provider, and serves as the oracle around every transition.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.contracts.errors import TriggerSpecError
from qinglong.plugins.cron.provider import CronProvider

CRON = CronProvider()
SECOND_MS = 1_000
MINUTE_MS = 60_000
HOUR_MS = 3_600_000


def spec(expression: str, zone: str = "UTC"):
    """A validated cron spec."""
    return CRON.validate({"expression": expression, "timezone": zone})


def local_ms(zone: str, wall: str, fold: int = 0) -> int:
    """Epoch ms of a local wall time; ``fold=1`` picks the second pass of a repeated hour."""
    aware = datetime.fromisoformat(wall).replace(tzinfo=ZoneInfo(zone), fold=fold)
    return int(aware.timestamp()) * 1000


def local_text(zone: str, ms: int) -> str:
    """``2024-03-31T03:00:00+02:00`` for an epoch ms, to make failures readable."""
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).isoformat()


def walk(cron_spec, after_ms: int, count: int) -> list[int]:
    """``count`` occurrences after ``after_ms`` by repeated ``next_after``."""
    found = []
    for _ in range(count):
        after_ms = CRON.next_after(cron_spec, after_ms)
        found.append(after_ms)
    return found


def walk_local(zone: str, expression: str, start_wall: str, count: int) -> list[str]:
    """The next ``count`` occurrences after a local wall time, as local ISO texts with offsets."""
    return [local_text(zone, ms) for ms in walk(spec(expression, zone), local_ms(zone, start_wall), count)]


# --- Europe/Berlin ------------------------------------------------------------------------------
# 2024-03-31 02:00 CET -> 03:00 CEST (gap 02:00-03:00); 2024-10-27 03:00 CEST -> 02:00 CET (02:00-03:00 twice).


def test_berlin_spring_gap_daily_0230_fires_once_at_0300_cest():
    """02:30 does not exist on 31 March; the daily Run happens at 03:00 CEST, once, and is not lost."""
    assert walk_local("Europe/Berlin", "30 2 * * *", "2024-03-30T12:00:00", 3) == [
        "2024-03-31T03:00:00+02:00",
        "2024-04-01T02:30:00+02:00",
        "2024-04-02T02:30:00+02:00",
    ]


def test_berlin_spring_gap_every_15_minutes_collapses_into_one_fire_at_0300():
    """02:00, 02:15, 02:30, 02:45 (absent) and 03:00 are one instant: one Run, not five duplicates."""
    assert walk_local("Europe/Berlin", "*/15 * * * *", "2024-03-31T01:30:00", 4) == [
        "2024-03-31T01:45:00+01:00",
        "2024-03-31T03:00:00+02:00",
        "2024-03-31T03:15:00+02:00",
        "2024-03-31T03:30:00+02:00",
    ]


def test_berlin_fall_back_daily_0230_fires_once_at_the_cest_instant():
    """02:30 happens twice on 27 October; the Run happens at the first (CEST) one and not again at CET."""
    assert walk_local("Europe/Berlin", "30 2 * * *", "2024-10-26T12:00:00", 2) == [
        "2024-10-27T02:30:00+02:00",
        "2024-10-28T02:30:00+01:00",
    ]


def test_berlin_fall_back_every_20_minutes_pauses_during_the_repeated_hour():
    """The second pass through 02:00-03:00 fires nothing; otherwise 02:00, 02:20, 02:40 would run twice."""
    assert walk_local("Europe/Berlin", "*/20 * * * *", "2024-10-27T01:30:00", 5) == [
        "2024-10-27T01:40:00+02:00",
        "2024-10-27T02:00:00+02:00",
        "2024-10-27T02:20:00+02:00",
        "2024-10-27T02:40:00+02:00",
        "2024-10-27T03:00:00+01:00",
    ]
    inside_second_pass = local_ms("Europe/Berlin", "2024-10-27T02:10:00", fold=1)
    every_20 = spec("*/20 * * * *", "Europe/Berlin")
    assert local_text("Europe/Berlin", CRON.next_after(every_20, inside_second_pass)) == "2024-10-27T03:00:00+01:00"
    assert local_text("Europe/Berlin", CRON.latest_at_or_before(every_20, inside_second_pass)) == (
        "2024-10-27T02:40:00+02:00"
    )


# --- America/New_York ---------------------------------------------------------------------------
# 2024-03-10 02:00 EST -> 03:00 EDT; 2024-11-03 02:00 EDT -> 01:00 EST (01:00-02:00 twice).


def test_new_york_spring_gap_daily_0230_fires_once_at_0300_edt():
    """The absent 02:30 fires at 03:00 EDT that day, once."""
    assert walk_local("America/New_York", "30 2 * * *", "2024-03-09T12:00:00", 2) == [
        "2024-03-10T03:00:00-04:00",
        "2024-03-11T02:30:00-04:00",
    ]


def test_new_york_spring_gap_every_20_minutes_collapses_into_one_fire():
    """02:00, 02:20, 02:40 (absent) and 03:00 are one Run at 03:00 EDT."""
    assert walk_local("America/New_York", "*/20 * * * *", "2024-03-10T01:30:00", 3) == [
        "2024-03-10T01:40:00-05:00",
        "2024-03-10T03:00:00-04:00",
        "2024-03-10T03:20:00-04:00",
    ]


def test_new_york_fall_back_daily_0130_fires_once_at_the_edt_instant():
    """01:30 happens twice on 3 November; the Run happens at 01:30 EDT only."""
    assert walk_local("America/New_York", "30 1 * * *", "2024-11-02T12:00:00", 2) == [
        "2024-11-03T01:30:00-04:00",
        "2024-11-04T01:30:00-05:00",
    ]


def test_new_york_fall_back_every_15_minutes_pauses_during_the_repeated_hour():
    """After 01:45 EDT the next Run is 02:00 EST, an hour and a quarter later; nothing in the second pass."""
    assert walk_local("America/New_York", "*/15 * * * *", "2024-11-03T01:30:00", 3) == [
        "2024-11-03T01:45:00-04:00",
        "2024-11-03T02:00:00-05:00",
        "2024-11-03T02:15:00-05:00",
    ]


# --- Australia/Lord_Howe ------------------------------------------------------------------------
# 30-minute shifts. 2024-10-06 02:00 +10:30 -> 02:30 +11 (gap 02:00-02:30);
# 2024-04-07 02:00 +11 -> 01:30 +10:30 (01:30-02:00 twice).


def test_lord_howe_spring_gap_of_30_minutes_fires_gap_times_once_at_0230():
    """02:00 and 02:20 (absent) and 02:30 share the first instant after the half-hour jump: one Run."""
    assert walk_local("Australia/Lord_Howe", "*/10 * * * *", "2024-10-06T01:45:00", 4) == [
        "2024-10-06T01:50:00+10:30",
        "2024-10-06T02:30:00+11:00",
        "2024-10-06T02:40:00+11:00",
        "2024-10-06T02:50:00+11:00",
    ]
    assert walk_local("Australia/Lord_Howe", "15 2 * * *", "2024-10-05T12:00:00", 2) == [
        "2024-10-06T02:30:00+11:00",
        "2024-10-07T02:15:00+11:00",
    ]


def test_lord_howe_fall_back_of_30_minutes_fires_repeated_times_once():
    """01:30-02:00 happens twice on 7 April; each wall time fires at its first instant only."""
    assert walk_local("Australia/Lord_Howe", "*/15 * * * *", "2024-04-07T01:20:00", 4) == [
        "2024-04-07T01:30:00+11:00",
        "2024-04-07T01:45:00+11:00",
        "2024-04-07T02:00:00+10:30",
        "2024-04-07T02:15:00+10:30",
    ]
    assert walk_local("Australia/Lord_Howe", "45 1 * * *", "2024-04-06T12:00:00", 2) == [
        "2024-04-07T01:45:00+11:00",
        "2024-04-08T01:45:00+10:30",
    ]


def test_kolkata_half_hour_offset_without_dst_is_plain_arithmetic():
    """+05:30 all year: 09:00 IST is 03:30 UTC every day."""
    occurrences = walk(spec("0 9 * * *", "Asia/Kolkata"), local_ms("UTC", "2024-06-01T00:00:00"), 3)
    assert [local_text("UTC", ms) for ms in occurrences] == [
        "2024-06-01T03:30:00+00:00",
        "2024-06-02T03:30:00+00:00",
        "2024-06-03T03:30:00+00:00",
    ]


# --- the brute-force oracle around every transition ----------------------------------------------

_EPOCH = datetime(1970, 1, 1)


def _wall_seconds(t: int, tz: ZoneInfo) -> int:
    """Local wall time of epoch second ``t``, as seconds of a naive clock starting at 1970-01-01."""
    return int((datetime.fromtimestamp(t, tz).replace(tzinfo=None) - _EPOCH).total_seconds())


@lru_cache(maxsize=None)
def _offsets_and_jumps(day: int, tz: ZoneInfo) -> tuple[frozenset[int], tuple[int, ...]]:
    """UTC offsets and transition instants within two days of ``day``, by scanning (15 min, then 1 s)."""
    low, high = (day - 2) * 86_400, (day + 3) * 86_400
    offsets, jumps = set(), []
    previous = _wall_seconds(low, tz) - low
    offsets.add(previous)
    for t in range(low + 900, high + 1, 900):
        offset = _wall_seconds(t, tz) - t
        offsets.add(offset)
        if offset != previous:
            u = t - 900
            while _wall_seconds(u, tz) - u == previous:
                u += 1
            jumps.append(u)
        previous = offset
    return frozenset(offsets), tuple(jumps)


def first_instant_at_or_after_wall(wall_seconds: int, tz: ZoneInfo) -> int:
    """The first epoch second whose local wall time is at or after ``wall_seconds`` (the DST rule).

    Such an instant either shows exactly that wall time (then it is ``wall - offset`` for one of
    the zone's offsets) or is a forward jump over it (a transition instant); the earliest
    candidate that qualifies is the answer.
    """
    offsets, jumps = _offsets_and_jumps(wall_seconds // 86_400, tz)
    for t in sorted({wall_seconds - o for o in offsets} | set(jumps)):
        if _wall_seconds(t, tz) >= wall_seconds:
            return t
    raise AssertionError("no instant found")


def oracle_occurrences(zone: str, matches, step_s: int, start_utc: str, hours: int) -> list[int]:
    """Brute force: every matching wall time in a window, mapped by the rule, deduplicated (epoch ms)."""
    tz = ZoneInfo(zone)
    begin = int(datetime.fromisoformat(start_utc).replace(tzinfo=timezone.utc).timestamp())
    first_wall = _wall_seconds(begin, tz) - 2 * 3600
    last_wall = _wall_seconds(begin + hours * 3600, tz) + 2 * 3600
    wall = first_wall - first_wall % step_s
    fires = set()
    while wall <= last_wall:
        if matches(_EPOCH + timedelta(seconds=wall)):
            fires.add(first_instant_at_or_after_wall(wall, tz))
        wall += step_s
    return sorted(t * 1000 for t in fires if begin <= t <= begin + hours * 3600)


ORACLE_CASES = [
    # (zone, a UTC instant two hours before the transition)
    ("Europe/Berlin", "2024-03-30T23:00:00"),
    ("Europe/Berlin", "2024-10-26T23:00:00"),
    ("America/New_York", "2024-03-10T05:00:00"),
    ("America/New_York", "2024-11-03T04:00:00"),
    ("Australia/Lord_Howe", "2024-04-06T13:00:00"),
    ("Australia/Lord_Howe", "2024-10-05T13:30:00"),
    ("Asia/Kolkata", "2024-06-01T00:00:00"),
    ("UTC", "2024-06-01T00:00:00"),
]
ORACLE_EXPRESSIONS = [
    # (expression, wall-time predicate, the step that enumerates candidate wall times, window hours)
    ("*/5 * * * *", lambda d: d.second == 0 and d.minute % 5 == 0, 60, 8),
    ("*/20 * * * *", lambda d: d.second == 0 and d.minute % 20 == 0, 60, 8),
    ("0 * * * *", lambda d: d.second == 0 and d.minute == 0, 60, 26),
    ("30 * * * *", lambda d: d.second == 0 and d.minute == 30, 60, 26),
    ("45 1,2 * * *", lambda d: d.second == 0 and d.minute == 45 and d.hour in (1, 2), 60, 26),
    ("*/30 * * * * *", lambda d: d.second % 30 == 0, 30, 4),
]


@pytest.mark.parametrize("zone,start_utc", ORACLE_CASES, ids=[f"{z}@{s}" for z, s in ORACLE_CASES])
@pytest.mark.parametrize("expression,matches,step_s,hours", ORACLE_EXPRESSIONS, ids=[e[0] for e in ORACLE_EXPRESSIONS])
def test_occurrences_around_transitions_follow_the_first_instant_at_or_after_wall_rule(
    zone, start_utc, expression, matches, step_s, hours
):
    """Across each 2024 transition, ``next_after`` and ``latest_at_or_before`` agree with brute force.

    A disagreement is a lost Run (a gap time not fired), a duplicate (a repeated time fired twice)
    or a Run at the wrong instant.
    """
    expected = oracle_occurrences(zone, matches, step_s, start_utc, hours)
    cron_spec = spec(expression, zone)
    begin = expected[0]
    got = [begin] + walk(cron_spec, begin, len(expected) - 1)
    assert [local_text(zone, ms) for ms in got] == [local_text(zone, ms) for ms in expected]
    for earlier, later in zip(expected, expected[1:]):
        for probe in (earlier, earlier + 1, (earlier + later) // 2, later - 1):
            assert CRON.next_after(cron_spec, probe) == later
            assert CRON.latest_at_or_before(cron_spec, probe) == earlier


# --- consistency laws between next_after and latest_at_or_before ---------------------------------

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata")
TRANSITIONS_MS = tuple(
    int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()) * 1000
    for text in (
        "2024-03-10T07:00:00", "2024-11-03T06:00:00", "2024-03-31T01:00:00",
        "2024-10-27T01:00:00", "2024-04-06T15:00:00", "2024-10-05T15:30:00",
    )
)
EXPRESSIONS = st.one_of(
    st.sampled_from(["* * * * * *", "*/7 * * * * *", "*/15 * * * *", "*/20 * * * *", "0 * * * *", "30 2 * * *"]),
    st.tuples(st.integers(0, 59), st.integers(0, 23)).map(lambda mh: f"{mh[0]} {mh[1]} * * *"),
    st.tuples(st.integers(0, 59), st.sampled_from([1, 2, 3])).map(lambda mh: f"{mh[0]} {mh[1]} * * 0,6"),
)
TIMES = st.one_of(
    st.integers(1_577_836_800_000, 2_082_758_400_000),
    st.builds(lambda t, d: t + d, st.sampled_from(TRANSITIONS_MS), st.integers(-3 * HOUR_MS, 3 * HOUR_MS)),
)
LAW_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@LAW_SETTINGS
@given(EXPRESSIONS, st.sampled_from(ZONES), TIMES)
def test_next_after_and_latest_at_or_before_agree_on_the_same_occurrences(expression, zone, t):
    """The two queries must describe one set of occurrences.

    With ``n = next_after(t)`` and ``p = latest_at_or_before(t)``:

    * ``p <= t < n`` and both are occurrences: ``latest_at_or_before(n) == n``, ``next_after(p - 1) == p``;
    * nothing lies between them: ``next_after(p) == n`` and ``latest_at_or_before(n - 1) == p``;
    * occurrences are whole seconds (whole minutes for five fields), so every ms of a second answers alike.

    ``fire_once`` admits ``latest_at_or_before(observation)`` and moves the cursor to
    ``next_after(observation)``; if the two disagreed, an occurrence would be admitted twice or never.
    """
    cron_spec = spec(expression, zone)
    n = CRON.next_after(cron_spec, t)
    p = CRON.latest_at_or_before(cron_spec, t)
    assert p <= t < n
    assert CRON.latest_at_or_before(cron_spec, n) == n
    assert CRON.next_after(cron_spec, p - 1) == p
    assert CRON.next_after(cron_spec, p) == n
    assert CRON.latest_at_or_before(cron_spec, n - 1) == p
    granularity = SECOND_MS if len(expression.split()) == 6 else MINUTE_MS
    assert n % granularity == 0 and p % granularity == 0
    second = t - t % SECOND_MS
    for same_second in (second, second + 1, second + 999):
        if p <= same_second < n:
            assert CRON.next_after(cron_spec, same_second) == n
            assert CRON.latest_at_or_before(cron_spec, same_second) == p


# --- seconds and milliseconds --------------------------------------------------------------------


def test_every_second_fires_on_whole_seconds_strictly_after_the_given_millisecond():
    """``next_after`` is strictly after: at 1000 ms the next is 2000 ms, so the 1000 ms Run is not repeated."""
    every_second = spec("* * * * * *")
    assert CRON.next_after(every_second, 1_000) == 2_000
    assert CRON.next_after(every_second, 999) == 1_000
    assert CRON.next_after(every_second, 1_001) == 2_000
    assert CRON.next_after(every_second, 1_999) == 2_000
    assert CRON.next_after(every_second, -1) == 0


def test_latest_at_or_before_includes_the_given_millisecond():
    """``latest_at_or_before`` is inclusive: at exactly 2000 ms the 2000 ms occurrence is due now."""
    every_second = spec("* * * * * *")
    assert CRON.latest_at_or_before(every_second, 2_000) == 2_000
    assert CRON.latest_at_or_before(every_second, 1_999) == 1_000
    assert CRON.latest_at_or_before(every_second, 2_001) == 2_000
    assert CRON.latest_at_or_before(every_second, -1) == -1_000


def test_six_fields_put_seconds_first():
    """``5 * * * * *`` is second 5 of every minute, not minute 5: a seconds-last reading fires 60 times too often."""
    at_second_5 = spec("5 * * * * *")
    assert walk(at_second_5, 0, 3) == [5_000, 65_000, 125_000]
    every_10_seconds = spec("*/10 * * * * *")
    assert walk(every_10_seconds, 0, 3) == [10_000, 20_000, 30_000]
    second_30_of_minute_0 = spec("30 0 * * * *")
    assert walk(second_30_of_minute_0, 0, 2) == [30_000, HOUR_MS + 30_000]


def test_five_fields_fire_on_whole_minutes():
    """Five fields are minute-first with second 0: ``*/5 * * * *`` fires at 5, 10, 15 minutes past."""
    assert walk(spec("*/5 * * * *"), 0, 3) == [5 * MINUTE_MS, 10 * MINUTE_MS, 15 * MINUTE_MS]


def test_february_29_fires_only_in_leap_years():
    """A rare but valid expression is accepted and lands on 29 February."""
    leap = spec("0 0 29 2 *")
    first = CRON.next_after(leap, local_ms("UTC", "2025-01-01T00:00:00"))
    assert local_text("UTC", first) == "2028-02-29T00:00:00+00:00"


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,field",
    [
        ({"expression": "* * * *"}, "expression"),  # four fields
        ({"expression": "* * * * * * *"}, "expression"),  # seven fields
        ({"expression": ""}, "expression"),
        ({"expression": 5}, "expression"),
        ({}, "expression"),
        ({"expression": "61 * * * *"}, "expression"),  # minute out of range
        ({"expression": "* 24 * * *"}, "expression"),  # hour out of range
        ({"expression": "0 0 32 * *"}, "expression"),  # day of month out of range
        ({"expression": "0 0 * 13 *"}, "expression"),  # month out of range
        ({"expression": "0 0 * * 8"}, "expression"),  # weekday out of range
        ({"expression": "60 * * * * *"}, "expression"),  # second out of range
        ({"expression": "*/0 * * * *"}, "expression"),  # zero step
        ({"expression": "0 0 30 2 *"}, "expression"),  # 30 February never happens
        ({"expression": "0 0 31 4 *"}, "expression"),  # 31 April never happens
        ({"expression": "* * * * *", "timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"expression": "* * * * *", "timezone": "../../etc/passwd"}, "timezone"),
        ({"expression": "* * * * *", "timezone": ""}, "timezone"),
        ({"expression": "* * * * *", "timezone": 1}, "timezone"),
        ({"expression": "* * * * *", "tz": "UTC"}, "tz"),  # unknown key
        ({"expression": "* * * * *", "timezone": "UTC", "seconds": True}, "seconds"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(raw, field):
    """A bad spec must be refused at publish time with the field named, not fail later in a scheduler round."""
    with pytest.raises(TriggerSpecError) as caught:
        CRON.validate(raw)
    assert caught.value.kind == "cron"
    assert caught.value.field == field
    assert field in str(caught.value)


def test_a_spec_that_is_not_a_table_is_refused():
    """A list or string spec is refused naming ``spec``."""
    with pytest.raises(TriggerSpecError) as caught:
        CRON.validate(["* * * * *"])  # type: ignore[arg-type]
    assert caught.value.field == "spec"


def test_validation_normalises_and_is_idempotent():
    """The stored spec is normalised (single spaces, UTC default) and validating it again changes nothing.

    If re-validation changed the spec, an unchanged definition would publish a new revision and
    reset the cursor.
    """
    normalised = CRON.validate({"expression": "  */5   *  * * * "})
    assert normalised == {"expression": "*/5 * * * *", "timezone": "UTC"}
    assert CRON.validate(normalised) == normalised
    berlin = CRON.validate({"expression": "30 2 * * *", "timezone": "Europe/Berlin"})
    assert CRON.validate(berlin) == berlin


def test_describe_names_expression_and_zone():
    """Operators see what a trigger does in ``qinglong schedules``."""
    assert CRON.describe(spec("30 2 * * *", "Europe/Berlin")) == "cron '30 2 * * *' in Europe/Berlin"


# --- purity and the crontab macros ---------------------------------------------------------------


@pytest.mark.parametrize("expression", [
    "R 0 * * *", "0 r * * *", "R(0-29) * * * *", "0 0 1,R * *", "H 0 * * *", "H/15 * * * *",
    "H(0-29)/10 * * * *", "0 0 H * * *",
])
def test_random_and_hashed_fields_are_refused_because_next_after_must_be_pure(expression):
    """croniter draws ``R`` afresh on every parse: ``next_after`` answered differently on each call, so
    each round (and each replica) saw another next fire time, and an occurrence could be fired twice
    or never. ``H`` needs a per-job seed croniter does not get here. Both are refused naming the field."""
    with pytest.raises(TriggerSpecError) as caught:
        CRON.validate({"expression": expression})
    assert caught.value.field == "expression"
    assert "random" in str(caught.value) or "hashed" in str(caught.value)


def test_names_that_contain_r_or_h_are_still_plain_cron():
    """Month and weekday names (``mar``, ``thu``) are deterministic and must stay accepted."""
    assert walk(spec("0 0 * mar thu"), local_ms("UTC", "2024-01-01T00:00:00"), 2) == [
        local_ms("UTC", "2024-03-07T00:00:00"), local_ms("UTC", "2024-03-14T00:00:00")]


@pytest.mark.parametrize("macro, fields", [
    ("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"),
])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "Australia/Lord_Howe"])
def test_crontab_macros_fire_exactly_as_their_five_fields(macro, fields, zone):
    """``@daily`` was refused ("1 field"); accepted, it must mean exactly crontab(5)'s ``0 0 * * *``,
    DST rule included, in both queries, or a macro trigger would fire at other instants."""
    as_macro, as_fields = spec(macro.upper(), zone), spec(fields, zone)
    assert as_macro == {"expression": macro, "timezone": zone}  # stored lower case, as written
    assert CRON.validate(as_macro) == as_macro
    for start in (local_ms("UTC", "2024-03-30T00:00:00"), local_ms("UTC", "2024-10-05T00:00:00")):
        assert walk(as_macro, start, 5) == walk(as_fields, start, 5)
        assert CRON.latest_at_or_before(as_macro, start) == CRON.latest_at_or_before(as_fields, start)


def test_reboot_and_unknown_macros_are_refused():
    """``@reboot`` is not a schedule: it would never fire, silently."""
    for macro in ("@reboot", "@every_5m", "@"):
        with pytest.raises(TriggerSpecError, match="not a schedule macro"):
            CRON.validate({"expression": macro})


@LAW_SETTINGS
@given(EXPRESSIONS | st.sampled_from(["@hourly", "@daily", "@weekly", "@monthly", "@yearly"]),
       st.sampled_from(ZONES), TIMES)
def test_next_after_is_the_same_on_every_reading(expression, zone, t):
    """A provider is pure: a spec validated twice and asked twice answers alike (the store relies on it
    to re-decide an occurrence after a crash)."""
    first, second = spec(expression, zone), spec(expression, zone)
    assert first == second
    assert CRON.next_after(first, t) == CRON.next_after(second, t) == CronProvider().next_after(first, t)
