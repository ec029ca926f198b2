"""Cron occurrences in an IANA time zone, as integer epoch milliseconds.

Spec (normalised)::

    {"expression": "*/5 * * * *", "timezone": "Europe/Berlin"}

Five fields are ``minute hour day-of-month month day-of-week``; six fields put **seconds first**
(``"*/10 * * * * *"`` fires every ten seconds). The time zone defaults to ``UTC``. The crontab(5)
macros are accepted and stored as written (lower case): ``@hourly`` (``0 * * * *``), ``@daily`` and
its synonym ``@midnight`` (``0 0 * * *``), ``@weekly`` (``0 0 * * 0``), ``@monthly`` (``0 0 1 * *``),
``@yearly`` and its synonym ``@annually`` (``0 0 1 1 *``); ``@reboot`` is not a schedule and is
refused.

A provider is pure: the same spec and instant give the same answer on every call and in every
process. croniter's random field ``R`` (a new draw on every parse) and hashed field ``H`` (which
needs a per-job seed) are therefore refused, as is anything else croniter would not answer the
same way twice. Being pure is also what lets the provider remember its last :data:`MEMO_SIZE`
answers in each direction: at a minute boundary thousands of triggers of one expression ask the
same question, and croniter (about 60 us an answer in UTC, twice that in a DST zone) is then
asked once.

Cron describes wall-clock times. Daylight-saving transitions are handled by one rule, which keeps
occurrences strictly increasing and never fires a wall time twice:

* **Gap** (clocks jump forward; the wall time does not exist, e.g. 02:30 on the spring-forward day
  in Europe/Berlin): the occurrence fires at the first instant after the jump (03:00 CEST). Several
  wall times inside one gap fire once, at that instant. A daily job at 02:30 therefore still runs
  once that day, at 03:00.
* **Repeated hour** (clocks fall back; the wall time happens twice, e.g. 02:30 on the fall-back day
  in Europe/Berlin): the occurrence fires once, at the first of the two instants (02:30 CEST). During
  the second pass through the repeated wall times nothing fires, so an ``*/15`` job has a one-hour
  pause there and a daily job runs exactly once.

Zones with shifts other than one hour (Australia/Lord_Howe moves by 30 minutes) follow the same rule.

Occurrences are wall times of the years 1 to 9999 at instants of those years in UTC. West of UTC
the calendar's first instants are still year 0 on the wall clock: the first occurrence after them
is the zone's first matching wall time of year 1. East of UTC its last instants are already year
10000 there: the latest occurrence at or before them is the last matching wall time of year 9999.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any, Iterator, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import re

from qinglong.contracts.errors import TriggerSpecError, quoted

KIND = "cron"
_ONE_SECOND = timedelta(seconds=1)
# A reference instant for "does this expression ever fire": 2000-01-01 UTC, so 29 Feb works.
_REFERENCE_S = 946684800
#: crontab(5) macros and the five fields each stands for (croniter reads them the same way).
MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
# croniter's hashed (H) and random (R) items, optionally with a range and a step: H, R(0-29), H/15.
_HASHED_OR_RANDOM = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)


#: Names in the zone database that stand for a machine's setting, not a zone (``localtime`` links
#: to /etc/localtime): fire times under them would differ between hosts and change unannounced.
_MACHINE_ZONES = frozenset({"localtime", "posixrules"})


@lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _offset_at(ts: int, tz: ZoneInfo) -> timedelta:
    return datetime.fromtimestamp(ts, tz).utcoffset()  # type: ignore[return-value]


def _first_second_with_offset(lo: int, hi: int, offset: timedelta, tz: ZoneInfo) -> int:
    """Smallest integer second t in (lo, hi] whose UTC offset is ``offset`` (a transition)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset_at(mid, tz) == offset:
            hi = mid
        else:
            lo = mid
    return hi


def _instant(wall: datetime, tz: ZoneInfo) -> int:
    """Epoch second at which the naive wall time ``wall`` fires in ``tz`` (see the module rule)."""
    first = wall.replace(tzinfo=tz, fold=0)
    second = wall.replace(tzinfo=tz, fold=1)
    before, after = first.utcoffset(), second.utcoffset()
    if before is None or after is None or before >= after:
        # An ordinary wall time, or a repeated one: its first instant.
        return int(first.timestamp())
    # A wall time inside a gap: fire at the transition, the first instant after the jump.
    return _first_second_with_offset(int(second.timestamp()), int(first.timestamp()), after, tz)


def _wall(ts: int, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ts, tz).replace(tzinfo=None)


def _second_pass_end(ts: int, tz: ZoneInfo) -> datetime | None:
    """If ``ts`` lies in the second pass of a repeated hour, the first wall time after it."""
    aware = datetime.fromtimestamp(ts, tz)
    wall = aware.replace(tzinfo=None)
    if aware.fold != 1:
        return None
    early = wall.replace(tzinfo=tz, fold=0).utcoffset()
    late = wall.replace(tzinfo=tz, fold=1).utcoffset()
    if early is None or late is None or early <= late:
        return None
    shift = int((early - late).total_seconds())
    transition = _first_second_with_offset(ts - shift - 1, ts, late, tz)
    # The repeated wall times are [transition + late, transition + early) as walls.
    return datetime.fromtimestamp(transition, timezone.utc).replace(tzinfo=None) + early


#: How many answers each direction remembers (:func:`_next_after_s`, :func:`_latest_at_or_before_s`).
#: A burst is many triggers of one expression due at one instant, so a scheduler asks the same
#: question once per trigger; a provider is pure, so the first answer is every later one. Each entry
#: is a key of two shared strings and an int, and an int (about 200 bytes): 256 of them stay
#: well under 100 KiB.
MEMO_SIZE = 256


def _iter(expression: str, start: datetime) -> Any:
    # Imported here: croniter costs a command that reads Runs about 35 ms and 1 MiB at start.
    from croniter import croniter

    six = len(expression.split()) == 6
    return croniter(expression, start, second_at_beginning=six, max_years_between_matches=50)


#: What ``datetime`` raises for a moment outside years 1-9999 (``date value out of range``,
#: ``year 10000 is out of range``). The spec was validated, so nothing else raises these here.
_OUT_OF_CALENDAR = (OverflowError, ValueError)
#: 9999-12-31T23:59:59 UTC: a later occurrence (a wall time of year 9999 west of UTC) could be
#: neither shown nor stored as a date, so there is none.
LAST_SECOND = 253_402_300_799
#: 0001-01-01T00:00:00 UTC, the same bound the other way.
FIRST_SECOND = -62_135_596_800


#: 400 Gregorian years: 146097 days, a whole number of weeks, so a wall time 400 years away has
#: the same second, minute, hour, day, month and weekday. croniter cannot step across either end of
#: the calendar, so near an end it walks 400 years inside and its answers are moved back.
_GREGORIAN_CYCLE = timedelta(days=146_097)
_FIRST_WALL = datetime.min
_LAST_WALL = datetime.max.replace(microsecond=0)


def _walls_after(expression: str, after_s: int, tz: ZoneInfo) -> Iterator[datetime]:
    """The expression's wall times after the wall clock of the epoch second ``after_s``, in order."""
    try:
        start = _second_pass_end(after_s, tz)
        start = start - _ONE_SECOND if start is not None else _wall(after_s, tz)
    except _OUT_OF_CALENDAR:
        if after_s > 0:
            raise  # a wall clock past year 9999: no wall time follows
        # a wall clock before year 1 (west of UTC on its first day): the calendar's first wall
        # time, 0001-01-01T00:00:00, is a fire time too when the expression says so
        itr = _iter(expression, _FIRST_WALL + _GREGORIAN_CYCLE - _ONE_SECOND)
        while True:
            yield itr.get_next(datetime) - _GREGORIAN_CYCLE
    itr = _iter(expression, start)
    while True:
        yield itr.get_next(datetime)


def _walls_at_or_before(expression: str, at_s: int, tz: ZoneInfo) -> Iterator[datetime]:
    """The expression's wall times at or before the wall clock of the epoch second ``at_s``,
    latest first."""
    try:
        start = _second_pass_end(at_s, tz) or _wall(at_s, tz) + _ONE_SECOND
    except _OUT_OF_CALENDAR:
        if at_s < 0:
            raise  # a wall clock before year 1: no wall time precedes it
        # a wall clock at the calendar's last second or past it (east of UTC on its last day):
        # 9999-12-31T23:59:59 is a fire time too when the expression says so
        itr = _iter(expression, _LAST_WALL - _GREGORIAN_CYCLE + _ONE_SECOND)
        while True:
            yield itr.get_prev(datetime) + _GREGORIAN_CYCLE
    itr = _iter(expression, start)
    while True:
        yield itr.get_prev(datetime)


def _next_after_s(expression: str, zone_name: str, after_s: int) -> int | None:
    """First occurrence strictly after the epoch second ``after_s``, in epoch seconds."""
    from croniter import CroniterBadDateError

    tz = _zone(zone_name)
    after_s = max(after_s, FIRST_SECOND - 1)  # none before year 1 in UTC, as latest_at_or_before
    try:
        for wall in _walls_after(expression, after_s, tz):
            candidate = _instant(wall, tz)
            if candidate > after_s:
                return candidate if candidate <= LAST_SECOND else None
    except CroniterBadDateError:
        return None
    except _OUT_OF_CALENDAR:
        return None  # past year 9999 (or before year 1): no representable occurrence
    return None


def _latest_at_or_before_s(expression: str, zone_name: str, at_s: int) -> int | None:
    """Last occurrence at or before the epoch second ``at_s``, in epoch seconds."""
    from croniter import CroniterBadDateError

    tz = _zone(zone_name)
    at_s = min(at_s, LAST_SECOND)  # none past year 9999 in UTC, as next_after
    try:
        for wall in _walls_at_or_before(expression, at_s, tz):
            candidate = _instant(wall, tz)
            if candidate <= at_s:
                return candidate if candidate >= FIRST_SECOND else None
    except CroniterBadDateError:
        return None
    except _OUT_OF_CALENDAR:
        return None
    return None


# Both answers depend on the expression, the zone and the whole second only (a cron occurrence is
# a whole second), so that is the whole key; an error is raised again on every call (never kept).
_next_after_memo = lru_cache(maxsize=MEMO_SIZE)(_next_after_s)
_latest_at_or_before_memo = lru_cache(maxsize=MEMO_SIZE)(_latest_at_or_before_s)


class CronProvider:
    """The built-in ``cron`` trigger provider."""

    kind = KIND

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        """Normalise ``{"expression", "timezone"}`` or raise :class:`TriggerSpecError`."""
        if not isinstance(spec, Mapping):
            raise TriggerSpecError(KIND, "spec", "expected a table with 'expression' and 'timezone'")
        unknown = sorted(set(spec) - {"expression", "timezone"})
        if unknown:
            raise TriggerSpecError(
                KIND, unknown[0], "unknown field; a cron spec has 'expression' and 'timezone'"
            )
        expression = spec.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            raise TriggerSpecError(KIND, "expression", "expected a cron expression such as '*/5 * * * *'")
        fields = expression.split()
        if len(fields) == 1 and fields[0].startswith("@"):
            macro = fields[0].lower()
            if macro not in MACROS:
                raise TriggerSpecError(
                    KIND, "expression",
                    f"{quoted(expression)} is not a schedule macro; expected one of {', '.join(MACROS)}",
                )
            fields = [macro]
        elif len(fields) not in (5, 6):
            raise TriggerSpecError(
                KIND,
                "expression",
                f"{quoted(expression)} has {len(fields)} fields; expected 5 (minute hour day month weekday) "
                "or 6 (second first)",
            )
        zone_name = spec.get("timezone", "UTC")
        if not isinstance(zone_name, str) or not zone_name:
            raise TriggerSpecError(KIND, "timezone", "expected an IANA time zone name such as 'Europe/Berlin'")
        if zone_name in _MACHINE_ZONES:
            raise TriggerSpecError(
                KIND, "timezone", f"{quoted(zone_name)} names this machine's configured zone, which another host or "
                "a later setting reads differently; write the zone itself, such as 'Europe/Berlin'")
        try:
            tz = _zone(zone_name)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise TriggerSpecError(
                KIND, "timezone", f"unknown IANA time zone {quoted(zone_name)} (e.g. 'UTC', 'Europe/Berlin')"
            ) from None
        for item in (part for field in fields for part in field.split(",")):
            if _HASHED_OR_RANDOM.match(item):
                raise TriggerSpecError(
                    KIND, "expression",
                    f"{quoted(expression)} uses croniter's {'random' if item[0] in 'rR' else 'hashed'} field "
                    f"{quoted(item)}, whose fire times are not the same on every reading; write the "
                    "minute, hour, ... explicitly",
                )
        normalised = " ".join(fields)
        from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError

        from .fields import never_fires, not_understood, out_of_range

        wrong = out_of_range(expression, fields) if fields[0][0] != "@" else None
        if wrong is not None:
            raise TriggerSpecError(KIND, "expression", wrong)
        try:
            itr = _iter(normalised, _wall(_REFERENCE_S, tz))
            itr.get_next(datetime)
        except CroniterBadDateError:
            raise TriggerSpecError(KIND, "expression", never_fires(expression, fields)) from None
        except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
            detail = (not_understood(expression, fields) if fields[0][0] != "@" else None) or (
                f"{quoted(expression)} is not a valid cron expression: {str(exc) or type(exc).__name__}")
            raise TriggerSpecError(KIND, "expression", detail) from None
        return {"expression": normalised, "timezone": tz.key}

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        """First occurrence strictly after ``after_ms``, in epoch ms."""
        found = _next_after_memo(spec["expression"], spec["timezone"], after_ms // 1000)
        return None if found is None else found * 1000

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        """Last occurrence at or before ``at_ms``, in epoch ms."""
        found = _latest_at_or_before_memo(spec["expression"], spec["timezone"], at_ms // 1000)
        return None if found is None else found * 1000

    def describe(self, spec: Mapping[str, Any]) -> str:
        """``cron '<expression>' in <zone>``."""
        return f"cron '{spec['expression']}' in {spec['timezone']}"

    def example_spec(self, every_ms: int) -> Mapping[str, Any] | None:
        """A UTC spec firing every ``every_ms``: whole seconds or minutes that divide a minute or an
        hour (``* * * * * *`` for one second); None for any other period."""
        if every_ms == 1000:
            expression = "* * * * * *"
        elif every_ms % 1000 == 0 and 60 % (every_ms // 1000) == 0:
            expression = f"*/{every_ms // 1000} * * * * *"
        elif every_ms % 60_000 == 0 and 60 % (every_ms // 60_000) == 0:
            expression = "* * * * *" if every_ms == 60_000 else f"*/{every_ms // 60_000} * * * *"
        else:
            return None
        return self.validate({"expression": expression, "timezone": "UTC"})
