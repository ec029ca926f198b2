"""Cron occurrences on the first and last days of the calendar, in zones far from UTC.

croniter works on wall times of the years 1 to 9999. West of UTC the first instants of year 1
are still year 0 on the wall clock, and east of UTC the last instants of year 9999 are already
year 10000 there: neither can be a starting point for croniter, yet the occurrences that follow
(or precede) them are ordinary wall times of year 1 (or 9999).
"""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong.plugins.cron.provider import FIRST_SECOND, LAST_SECOND, CronProvider
from qinglong.testing.provider_laws import check_agreement, check_next_after

FIRST_MS, LAST_MS = FIRST_SECOND * 1000, LAST_SECOND * 1000 + 999
TWO_DAYS_MS = 2 * 86_400_000
#: West and east of UTC at each end: local mean times of year 1 (Los Angeles -7:52:58, Pago Pago
#: +12:37:12, Kiritimati -10:29:20) and the zones' offsets of year 9999 (Kiritimati +14).
ZONES = ["America/Los_Angeles", "America/St_Johns", "Pacific/Kiritimati", "Pacific/Pago_Pago",
         "Asia/Tokyo", "Etc/GMT+12", "Etc/GMT-14", "Australia/Sydney", "UTC"]
EXPRESSIONS = ["* * * * *", "*/7 * * * * *", "0 0 * * *", "@yearly", "59 23 31 12 *", "30 4 * * 2",
               "0 12 1 1 *", "59 59 23 * * *"]
NEAR_AN_END = st.one_of(st.integers(FIRST_MS, FIRST_MS + TWO_DAYS_MS), st.integers(LAST_MS - TWO_DAYS_MS, LAST_MS))


def _spec(expression: str, zone: str):
    return CronProvider().validate({"expression": expression, "timezone": zone})


@settings(max_examples=400, deadline=None)
@given(expression=st.sampled_from(EXPRESSIONS), zone=st.sampled_from(ZONES), first=NEAR_AN_END,
       gap_ms=st.integers(0, TWO_DAYS_MS))
def test_an_occurrence_near_an_end_of_the_calendar_is_found_from_any_earlier_or_later_instant(
        expression, zone, first, gap_ms):
    """From an instant whose wall clock is year 0 (or 10000), ``next_after`` (or
    ``latest_at_or_before``) said there was no occurrence, while a later (or earlier) instant had
    one: ``cron next`` hid every fire time of a calendar's first day, and a ``fire_once`` misfire
    observed on its last one would admit nothing. Each answer is found from every instant before
    (after) it, and the provider laws hold there."""
    provider = CronProvider()
    spec = _spec(expression, zone)
    second = min(first + gap_ms, LAST_MS)
    later_next = provider.next_after(spec, second)
    if later_next is not None:
        found = provider.next_after(spec, first)
        assert found is not None and found <= later_next, (first, second, found, later_next)
    earlier_latest = provider.latest_at_or_before(spec, first)
    if earlier_latest is not None:
        found = provider.latest_at_or_before(spec, second)
        assert found is not None and found >= earlier_latest, (first, second, found, earlier_latest)
    for at_ms in (first, second):
        check_next_after(provider, spec, at_ms)
        check_agreement(provider, spec, at_ms)


def _instant_ms(wall: datetime, zone: str) -> int:
    return int(wall.replace(tzinfo=ZoneInfo(zone)).timestamp()) * 1000


def test_the_first_fire_times_west_of_utc_are_the_first_wall_times_of_year_one():
    """At 0001-01-01T00:00:00Z it is still 0000-12-31 in Los Angeles: the first fire time after
    it is 0001-01-01T00:00:00 there (07:52:58 UTC in local mean time), not none at all."""
    provider = CronProvider()
    for zone in ("America/Los_Angeles", "Pacific/Kiritimati", "Etc/GMT+12"):
        first_wall = _instant_ms(datetime(1, 1, 1), zone)
        assert provider.next_after(_spec("* * * * *", zone), FIRST_MS) == first_wall
        assert provider.next_after(_spec("@yearly", zone), FIRST_MS) == first_wall
        assert provider.latest_at_or_before(_spec("@yearly", zone), first_wall) == first_wall
        assert provider.latest_at_or_before(_spec("@yearly", zone), first_wall - 1) is None
        # 0001-01-01 is a Monday: the first Tuesday 04:30 is the next day
        assert provider.next_after(_spec("30 4 * * 2", zone), FIRST_MS) == _instant_ms(datetime(1, 1, 2, 4, 30), zone)


def test_the_last_fire_times_east_of_utc_are_the_last_wall_times_of_year_9999():
    """At 9999-12-31T23:59:59Z it is already year 10000 in Kiritimati (+14): the latest fire time
    at or before it is 9999-12-31T23:59:59 there (09:59:59 UTC), not none at all."""
    provider = CronProvider()
    for zone in ("Pacific/Kiritimati", "Etc/GMT-14", "Asia/Tokyo"):
        last_wall = _instant_ms(datetime(9999, 12, 31, 23, 59, 59), zone)
        every_second = _spec("* * * * * *", zone)
        assert provider.latest_at_or_before(every_second, LAST_MS) == last_wall
        assert provider.latest_at_or_before(every_second, last_wall) == last_wall
        assert provider.latest_at_or_before(_spec("59 23 31 12 *", zone), LAST_MS) == last_wall - 59_000
        assert provider.next_after(every_second, last_wall) is None
    assert datetime.fromtimestamp(last_wall // 1000, timezone.utc).year == 9999
