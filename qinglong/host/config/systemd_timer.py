"""``qinglong import systemd-timer UNIT.timer``: a systemd timer as a task and its triggers.

A timer unit (systemd.timer(5)) starts a service unit on a calendar. Each ``OnCalendar=`` line
becomes a cron trigger of one task, whose command starts the timer's unit the way the timer did
(``systemctl start --wait UNIT``: the service keeps its ``User=``, environment and ``Exec*=``
lines exactly, and the Run ends with the service and its result). ``RandomizedDelaySec=`` becomes
the trigger's jitter and ``Persistent=`` its misfire policy (``true``: a start missed while
nothing ran is made up once, ``fire_once``; otherwise ``skip``). The ``[Unit]`` ``Description=``
becomes the task's description.

A calendar expression (systemd.time(7)) is mapped only where a cron expression says exactly the
same: weekdays, months, days, hours, minutes and whole seconds with lists, ranges (``..``) and
repetitions (``/``), the shorthands (``daily``, ``weekly``, ...) and a time zone at its end.
Refused, naming the line: a year other than ``*`` (cron has no years), ``~`` (last days of a
month), a weekday together with a day of month (systemd needs both to match, cron either),
fractions of a second, monotonic timers (``OnBootSec=``, ``OnUnitActiveSec=``, ...: they count
from events, not the calendar), a template unit, and any key this reading does not know. What
only systemd reads (``AccuracySec=``, ``WakeSystem=``, ...) is reported, not carried.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from qinglong.contracts.cli import whole_number
from qinglong.contracts.errors import TriggerSpecError, UserError, quoted_path
from qinglong.contracts.jitter import MAX_JITTER_MS

from .crontab import ImportResult, local_zone
from .locate import KeyLines

#: The calendar shorthands of systemd.time(7), as the full form they stand for.
SHORTHANDS = {
    "minutely": "*-*-* *:*:00", "hourly": "*-*-* *:00:00", "daily": "*-*-* 00:00:00",
    "monthly": "*-*-01 00:00:00", "weekly": "Mon *-*-* 00:00:00", "yearly": "*-01-01 00:00:00",
    "annually": "*-01-01 00:00:00", "quarterly": "*-01,04,07,10-01 00:00:00",
    "semiannually": "*-01,07-01 00:00:00",
}
_WEEKDAYS = {name: n for n, names in enumerate(
    (("sun", "sunday"), ("mon", "monday"), ("tue", "tuesday"), ("wed", "wednesday"),
     ("thu", "thursday"), ("fri", "friday"), ("sat", "saturday"))) for name in names}
#: systemd's weekday order, Monday first (a range ``Fri..Mon`` does not wrap).
_WEEK_ORDER = (1, 2, 3, 4, 5, 6, 0)

#: [Timer] keys only systemd reads: reported, not carried.
TIMER_REPORTED = ("AccuracySec", "WakeSystem", "RemainAfterElapse", "OnClockChange",
                  "OnTimezoneChange", "FixedRandomDelay")
#: [Timer] keys that count from an event rather than the calendar.
MONOTONIC = ("OnActiveSec", "OnBootSec", "OnStartupSec", "OnUnitActiveSec", "OnUnitInactiveSec")

_SPAN_UNITS = {
    "us": 0.001, "usec": 0.001, "ms": 1, "msec": 1, "s": 1_000, "sec": 1_000, "second": 1_000,
    "seconds": 1_000, "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hr": 3_600_000, "hour": 3_600_000, "hours": 3_600_000, "d": 86_400_000,
    "day": 86_400_000, "days": 86_400_000, "w": 604_800_000, "week": 604_800_000,
    "weeks": 604_800_000,
}
_SPAN_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


class CalendarNotMapped(ValueError):
    """A calendar expression no cron expression says exactly; the message says what and why."""


def parse_timespan_ms(text: str) -> int:
    """A systemd time span (``60m``, ``12h``, ``6000``: seconds without a unit, ``1h 30min``)
    in ms; ValueError when it is not one."""
    text = text.strip().lower()
    if not text:
        raise ValueError("an empty time span")
    position, total = 0, 0.0
    for match in _SPAN_PART.finditer(text):
        if text[position:match.start()].strip():
            raise ValueError(f"{text!r} is not a time span such as 60m, 12h or 6000")
        number, unit = float(match.group(1)), match.group(2) or "s"
        if unit not in _SPAN_UNITS:
            raise ValueError(f"{unit!r} is not a time unit (us, ms, s, min, h, d, w)")
        total += number * _SPAN_UNITS[unit]
        position = match.end()
    if text[position:].strip() or position == 0:
        raise ValueError(f"{text!r} is not a time span such as 60m, 12h or 6000")
    return int(total)


def _number(text: str, low: int, high: int, what: str) -> int:
    value = whole_number(text)
    if value is None:
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise CalendarNotMapped(f"{what} {shown!r} is not a whole number"
                                + (" (fractions of a second cannot be mapped)" if "." in text else ""))
    if not low <= value <= high:
        raise CalendarNotMapped(f"{what} {value} is outside {low}..{high}")
    return value


def _component(text: str, low: int, high: int, what: str) -> str:
    """One field of a date or time (``*``, ``6,18``, ``1..5``, ``0/15``, ``*/2``) as a cron
    field over ``low..high``."""
    if "~" in text:
        raise CalendarNotMapped(f"{what} {text!r}: '~' (days counted from the month's end) cannot be mapped")
    items = []
    for item in text.split(","):
        base, _, step = item.partition("/")
        if step:
            step_n = _number(step, 1, high, f"{what} repetition")
        if base == "*":
            items.append(f"*/{step_n}" if step else "*")
            continue
        first, dots, last = base.partition("..")
        start = _number(first, low, high, what)
        end = _number(last, low, high, what) if dots else (high if step else start)
        if end < start:
            raise CalendarNotMapped(f"{what} range {base!r} runs backwards")
        if step:
            items.append(f"{start}-{end}/{step_n}")
        elif dots and end > start:
            items.append(f"{start}-{end}")
        else:
            items.append(str(start))
    return ",".join(items)


def _weekdays(text: str) -> str:
    days: list[int] = []
    for item in text.split(","):
        first, dots, last = item.partition("..")
        try:
            start = _WEEK_ORDER.index(_WEEKDAYS[first.lower()])
            end = _WEEK_ORDER.index(_WEEKDAYS[last.lower()]) if dots else start
        except KeyError:
            raise CalendarNotMapped(f"{item!r} is not a weekday (Mon..Sun)") from None
        if end < start:
            raise CalendarNotMapped(f"weekday range {item!r} runs backwards (Monday is first)")
        days += [d for d in _WEEK_ORDER[start:end + 1] if d not in days]
    return ",".join(str(d) for d in sorted(days))


def calendar_to_cron(text: str, default_zone: str) -> tuple[str, str]:
    """An ``OnCalendar=`` value as ``(cron expression, IANA zone)``: five fields, or six with
    seconds first when a second is not 0. :class:`CalendarNotMapped` says what cannot be said."""
    words = text.split()
    if not words:
        raise CalendarNotMapped("the expression is empty")
    zone = default_zone
    last = words[-1]
    if len(words) > 1 and ":" not in last and "*" not in last and not last[:1].isdigit():
        try:
            ZoneInfo(last)
        except (ZoneInfoNotFoundError, ValueError):
            if "/" in last:
                raise CalendarNotMapped(f"{last!r} is not an IANA time zone name") from None
        else:
            zone, words = last, words[:-1]
    if len(words) == 1 and words[0].lower() in SHORTHANDS:
        words = SHORTHANDS[words[0].lower()].split()
    elif any(w.startswith("@") for w in words):
        raise CalendarNotMapped("a single instant (@SECONDS) is not a schedule")
    weekday = None
    if words and words[0][:1].isalpha():
        weekday, words = _weekdays(words[0]), words[1:]
    date, time = "*-*-*", "00:00:00"
    for word in words:
        if ":" in word:
            time = word
        elif "-" in word:
            date = word
        else:
            raise CalendarNotMapped(f"{word!r} is neither a date (Y-M-D) nor a time (H:M:S)")
    if len(words) > 2:
        raise CalendarNotMapped("expected at most a weekday, a date, a time and a time zone")
    parts = date.split("-")
    if len(parts) == 2:
        parts = ["*", *parts]
    if len(parts) != 3:
        raise CalendarNotMapped(f"date {date!r} is not YEAR-MONTH-DAY")
    if parts[0] != "*":
        raise CalendarNotMapped(f"year {parts[0]!r}: a cron expression has no years")
    month = _component(parts[1], 1, 12, "month")
    day = _component(parts[2], 1, 31, "day")
    clock = time.split(":")
    if len(clock) == 2:
        clock.append("00")
    if len(clock) != 3:
        raise CalendarNotMapped(f"time {time!r} is not HOUR:MINUTE[:SECOND]")
    hour = _component(clock[0], 0, 23, "hour")
    minute = _component(clock[1], 0, 59, "minute")
    second = _component(clock[2], 0, 59, "second")
    if weekday is not None and day != "*":
        raise CalendarNotMapped("a weekday and a day of month together: systemd starts when both "
                                "match, a cron expression when either does")
    fields = [minute, hour, day, month, weekday or "*"]
    if second != "0":
        fields.insert(0, second)
    return " ".join(fields), zone


def read_unit(text: str, source: str) -> list[tuple[int, str, str, str]]:
    """A unit file's assignments as ``(line, section, key, value)``, in order: comments (``#``,
    ``;``) and blank lines skipped, a trailing backslash joining the next line."""
    found: list[tuple[int, str, str, str]] = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].strip()
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise UserError(f"{source}:{number}: {line!r} is not a section header")
            section = line[1:-1]
            continue
        key, equals, value = line.partition("=")
        if not equals:
            raise UserError(f"{source}:{number}: expected KEY=VALUE, got {line!r}")
        found.append((number, section, key.strip(), value.strip()))
    return found


def _boolean(value: str, where: str, key: str) -> bool:
    low = value.lower()
    if low in ("1", "yes", "y", "true", "t", "on"):
        return True
    if low in ("0", "no", "n", "false", "f", "off"):
        return False
    raise UserError(f"{where}: {key}={value}: expected a boolean (true or false)")


def _observes_dst(zone: str) -> bool:
    from datetime import datetime

    tz = ZoneInfo(zone)
    return datetime(2026, 1, 1, tzinfo=tz).utcoffset() != datetime(2026, 7, 1, tzinfo=tz).utcoffset()


def _task_id(unit: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", unit).strip("-.")[:64]
    return slug if slug and slug[0].isalnum() else "timer"


def import_systemd_timer(path: str, *, project_id: str, providers: Mapping[str, Any],
                         timezone: str | None = None) -> ImportResult:
    """Read a timer unit into an :class:`~.crontab.ImportResult`; refusals name the file and
    the line."""
    file = Path(path)
    if file.suffix != ".timer":
        raise UserError(f"{path}: not a timer unit (a file named NAME.timer)")
    if file.stem.endswith("@"):
        raise UserError(f"{path}: a template timer: its instances (NAME@INSTANCE.timer) differ by "
                        "what %i stands for; write the instance's unit and import that")
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{quoted_path(path)}: cannot read the timer: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{quoted_path(path)}: not UTF-8 text") from None
    return parse_timer(text, path, file.stem, project_id=project_id, providers=providers,
                       timezone=timezone)


def parse_timer(text: str, source: str, name: str, *, project_id: str,
                providers: Mapping[str, Any], timezone: str | None = None) -> ImportResult:
    """The timer unit ``text`` (the unit ``name``, without ``.timer``) as one task and a cron
    trigger per ``OnCalendar=`` (see the module docstring)."""
    zone = timezone or local_zone()
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"--timezone {zone!r}: not an IANA time zone name") from None
    cron = providers.get("cron")
    if cron is None:
        raise UserError(f"{source}: the cron trigger kind is not loaded")
    lines: dict[tuple[str, ...], int] = {}
    result = ImportResult(source, project_id, {}, KeyLines(lines))
    result.summary.append(f"Calendar times are in {zone} unless an OnCalendar= names a zone"
                          f"{' (this machine' + chr(39) + 's zone; --timezone changes it)' if timezone is None else ''}.")
    calendars: list[tuple[int, str]] = []
    unit, description, persistent, jitter_ms = f"{name}.service", None, False, 0
    first_line = 1
    for number, section, key, value in read_unit(text, source):
        where = f"{source}:{number}"
        if section == "Unit":
            if key == "Description":
                description = value or None
            elif key not in ("Documentation",):
                result.notes.append(f"line {number}: [Unit] {key}= is read by systemd only, not carried")
        elif section == "Install":
            result.notes.append(f"line {number}: [Install] {key}= is read by systemd only, not carried")
        elif section == "Timer":
            if key == "OnCalendar":
                if not value:
                    calendars = []  # an empty assignment resets the list, as systemd reads it
                else:
                    calendars.append((number, value))
            elif key in MONOTONIC:
                raise UserError(f"{where}: {key}={value}: a monotonic timer counts from an event "
                                "(boot, activation), not the calendar; only OnCalendar= timers "
                                "can be imported")
            elif key == "RandomizedDelaySec":
                try:
                    jitter_ms = parse_timespan_ms(value)
                except ValueError as exc:
                    raise UserError(f"{where}: RandomizedDelaySec={value}: {exc}") from None
                if jitter_ms > MAX_JITTER_MS:
                    raise UserError(f"{where}: RandomizedDelaySec={value}: a trigger's jitter is at "
                                    "most 1 day")
            elif key == "Persistent":
                persistent = _boolean(value, where, key)
            elif key == "Unit":
                unit = value
            elif key in TIMER_REPORTED:
                result.notes.append(f"line {number}: {key}={value} is read by systemd only, not "
                                    "carried" + (" (the jitter is always the same for an occurrence)"
                                                 if key == "FixedRandomDelay" else ""))
            else:
                raise UserError(f"{where}: [Timer] {key}=: not a key this import can map")
        else:
            raise UserError(f"{where}: {key}= outside [Unit], [Timer] or [Install]")
    if not calendars:
        raise UserError(f"{source}:{first_line}: the timer has no OnCalendar= line; only calendar "
                        "timers can be imported")
    if "%" in unit or not re.fullmatch(r"[A-Za-z0-9:_.\\@-]+", unit):
        raise UserError(f"{source}: Unit={unit}: not a unit name this import can start")
    task_id = _task_id(name)
    payload: dict[str, Any] = {"command": ["systemctl", "start", "--wait", unit]}
    if description:
        payload["description"] = description
    triggers: dict[str, dict[str, Any]] = {}
    for n, (number, value) in enumerate(calendars, start=1):
        where = f"{source}:{number}"
        try:
            expression, trigger_zone = calendar_to_cron(value, zone)
            spec = dict(cron.validate({"expression": expression, "timezone": trigger_zone}))
        except CalendarNotMapped as exc:
            raise UserError(f"{where}: OnCalendar={value}: {exc}") from None
        except TriggerSpecError as exc:
            raise UserError(f"{where}: OnCalendar={value}: {exc.problem}") from None
        trigger_id = (f"{project_id}.{task_id}" + (f"-{n}" if n > 1 else ""))[:64]
        trigger: dict[str, Any] = {"task": task_id, "kind": "cron", "spec": spec,
                                   "misfire_policy": "fire_once" if persistent else "skip"}
        if jitter_ms:
            trigger["jitter_ms"] = jitter_ms
        triggers[trigger_id] = trigger
        lines[("projects", project_id, "triggers", trigger_id)] = number
        result.comments[("triggers", trigger_id)] = [f"OnCalendar={value}"]
        if _observes_dst(trigger_zone):
            result.notes.append(
                f"line {number}: {trigger_zone} changes to daylight-saving time: on a day the change "
                "skips the start time, systemd skips that day and the trigger starts at the end of "
                "the gap; on a day the hour repeats, both start once")
    lines[("projects", project_id, "tasks", task_id)] = calendars[0][0]
    result.summary.append(f"The task starts {unit} through systemd, as the timer did; disable the "
                          f"timer (systemctl disable --now {name}.timer) once the triggers run.")
    result.data = {"version": 1, "projects": {project_id: {"tasks": {task_id: payload},
                                                            "triggers": triggers}}}
    return result
