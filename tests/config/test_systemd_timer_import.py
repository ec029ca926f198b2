"""``qinglong import systemd-timer``: Debian's own timer units, calendar expressions checked
against ``systemd-analyze calendar``, and the refusals that name the line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.host.config.systemd_timer import (
    CalendarNotMapped,
    calendar_to_cron,
    parse_timer,
    parse_timespan_ms,
)
from qinglong.plugins.cron.provider import CronProvider

from tests.config.config_helpers import store_rows

CRON = CronProvider()
UNITS = Path("/lib/systemd/system")
#: Calendar timers Debian ships with packages every Debian system has (apt, dpkg, util-linux,
#: e2fsprogs) or the suite installs (systemd); man-db's when it is there.
CALENDAR_TIMERS = ("apt-daily", "apt-daily-upgrade", "dpkg-db-backup", "fstrim", "e2scrub_all", "man-db")
BASE = "2026-03-28 12:34:56 UTC"  # before Europe's spring-forward, so zones are crossed too
BASE_MS = int(datetime(2026, 3, 28, 12, 34, 56, tzinfo=timezone.utc).timestamp() * 1000)
_ELAPSE = re.compile(r"(?:Next elapse|Iter\. #\d+): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$")


def systemd_elapses(expression: str, count: int) -> list[int]:
    """The next ``count`` elapses after BASE as systemd computes them (in UTC, epoch ms)."""
    out = subprocess.run([shutil.which("systemd-analyze"), "calendar", f"--iterations={count}",
                          f"--base-time={BASE}", expression], capture_output=True, text=True,
                         env={**os.environ, "TZ": "UTC", "SYSTEMD_COLORS": "0"}, check=True).stdout
    times = [m.group(1) for m in map(_ELAPSE.search, (line.strip() for line in out.splitlines())) if m]
    return [int(datetime.fromisoformat(t).replace(tzinfo=timezone.utc).timestamp() * 1000) for t in times]


def cron_elapses(expression: str, zone: str, count: int) -> list[int]:
    spec = CRON.validate({"expression": expression, "timezone": zone})
    found, cursor = [], BASE_MS
    for _ in range(count):
        cursor = CRON.next_after(spec, cursor)
        found.append(cursor)
    return found


def _same_as_systemd(value: str, count: int = 12) -> tuple[str, str]:
    expression, zone = calendar_to_cron(value, "UTC")
    assert cron_elapses(expression, zone, count) == systemd_elapses(value, count), (value, expression)
    return expression, zone


def _timer(unit: str) -> dict:
    path = UNITS / f"{unit}.timer"
    result = parse_timer(path.read_text(), str(path), unit, project_id="systemd",
                         providers={"cron": CRON}, timezone="UTC")
    return result.data["projects"]["systemd"]


def test_debians_calendar_timers_import_with_their_delay_and_persistence():
    """Each shipped timer becomes a task starting its service and a trigger firing when systemd
    would (systemd-analyze says when), with RandomizedDelaySec as the jitter and Persistent as
    the misfire policy: a wrong mapping moves or drops the host's own maintenance jobs."""
    present = [u for u in CALENDAR_TIMERS if (UNITS / f"{u}.timer").exists()]
    assert {"apt-daily", "apt-daily-upgrade", "dpkg-db-backup"} <= set(present), present
    for unit in present:
        text = (UNITS / f"{unit}.timer").read_text()
        calendar = re.search(r"^OnCalendar=(.*)$", text, re.M).group(1)
        delay = re.search(r"^RandomizedDelaySec=(.*)$", text, re.M)
        persistent = re.search(r"^Persistent=true$", text, re.M) is not None
        project = _timer(unit)
        assert project["tasks"][unit]["command"] == ["systemctl", "start", "--wait", f"{unit}.service"]
        [trigger] = project["triggers"].values()
        expression, _ = _same_as_systemd(calendar)
        assert trigger["spec"] == {"expression": expression, "timezone": "UTC"}
        assert trigger["misfire_policy"] == ("fire_once" if persistent else "skip")
        assert trigger.get("jitter_ms", 0) == (parse_timespan_ms(delay.group(1)) if delay else 0)
    assert _timer("apt-daily")["triggers"]["systemd.apt-daily"]["jitter_ms"] == 12 * 3_600_000


HAND_WRITTEN = [
    "minutely", "hourly", "daily", "weekly", "monthly", "yearly", "quarterly", "semiannually",
    "*:0/15", "*-*-* 6,18:00", "Mon..Fri 09:30", "Sat,Sun 10:00:00", "Sun *-*-* 03:10:00",
    "*-*-1/5 04:00", "*-02-29 12:00", "*-*-* *:*:30", "*-*-* *:*:0/20", "*-01,07-01 00:00",
    "Mon,Wed..Fri *-*-* 22:15 Europe/Berlin", "*-*-* 04:30 Europe/Berlin", "*-03..10-* 1..3:05",
    "Tue *-12-* 23:59:59", "*-*-31 00:00", "*-*-* 00/3:00",
]


@pytest.mark.parametrize("value", HAND_WRITTEN)
def test_each_mapped_calendar_fires_exactly_when_systemd_would(value):
    """Twelve elapses of each form (lists, ranges, repetitions, seconds, shorthands, a zone
    with a DST change ahead) equal systemd's own: a translation that drifts would start jobs at
    other times than the timer it replaces."""
    _same_as_systemd(value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_calendars_fire_when_systemd_would(data):
    """Generated weekday, month, day, hour, minute and second fields, each a star, a value, a
    list, a range or a repetition, compared with systemd-analyze."""
    def field(low: int, high: int) -> str:
        form = data.draw(st.sampled_from(["*", "n", "list", "range", "rep"]))
        a = data.draw(st.integers(low, high))
        b = data.draw(st.integers(a, high))
        if form == "n":
            return str(a)
        if form == "list":
            return ",".join(str(v) for v in sorted({a, b}))
        if form == "range":
            return f"{a}..{b}"
        if form == "rep" and a < high:
            # systemd refuses a repetition whose first step passes the field's end
            return f"{a}/{data.draw(st.integers(1, high - a))}"
        if form == "rep":
            return str(a)
        return "*"
    weekday = data.draw(st.sampled_from(["", "Mon ", "Mon..Fri ", "Sat,Sun ", "Tue,Thu..Sat "]))
    day = "*" if weekday else field(1, 28)
    value = (f"{weekday}*-{field(1, 12)}-{day} {field(0, 23)}:{field(0, 59)}:"
             f"{data.draw(st.sampled_from(['00', '30', '0/15', '*']))}")
    _same_as_systemd(value, count=8)


@pytest.mark.parametrize("value, words", [
    ("2026-*-* 00:00", "has no years"),
    ("*-*~01 00:00", "days counted from the month's end"),
    ("Mon *-*-01 00:00", "a weekday and a day of month together"),
    ("*:*:0.5", "fractions of a second"),
    ("Fri..Mon 10:00", "runs backwards"),
    ("*-*-* 10:00 Mars/Base", "not an IANA time zone name"),
    ("*-*-* 25:00", "hour 25 is outside 0..23"),
])
def test_what_cron_cannot_say_is_refused_with_the_reason(value, words):
    """A calendar mapped approximately would fire on other days than systemd's; each such form
    is refused, saying why."""
    with pytest.raises(CalendarNotMapped) as raised:
        calendar_to_cron(value, "UTC")
    assert words in str(raised.value)


def _write(cli, name: str, text: str) -> Path:
    path = cli.cwd / name
    path.write_text(text)
    return path


GOOD = """\
[Unit]
Description=Nightly report

[Timer]
OnCalendar=Mon..Fri 02:30 Europe/Berlin
OnCalendar=Sat 04:00
RandomizedDelaySec=15min
Persistent=true
AccuracySec=1min

[Install]
WantedBy=timers.target
"""


@pytest.mark.parametrize("edit, line, words", [
    (lambda t: t.replace("Persistent=true", "OnUnitActiveSec=1h"), 8, "a monotonic timer"),
    (lambda t: t.replace("OnCalendar=Sat 04:00", "OnCalendar=2027-*-* 04:00"), 6, "has no years"),
    (lambda t: t.replace("RandomizedDelaySec=15min", "RandomizedDelaySec=2d"), 7, "at most 1 day"),
    (lambda t: t.replace("RandomizedDelaySec=15min", "RandomizedDelaySec=soon"), 7, "not a time span"),
    (lambda t: t.replace("Persistent=true", "Persistent=maybe"), 8, "expected a boolean"),
    (lambda t: t.replace("AccuracySec=1min", "OnSomething=1"), 9, "not a key this import can map"),
    # str.isdigit is true for '²', which int() refuses: a ValueError traceback, not the line
    (lambda t: t.replace("OnCalendar=Sat 04:00", "OnCalendar=*-*-\u00b2 04:00"), 6, "is not a whole number"),
    (lambda t: t.replace("OnCalendar=Sat 04:00", "OnCalendar=Sat \u00b2:00"), 6, "is not a whole number"),
    (lambda t: t.replace("OnCalendar=Sat 04:00", "OnCalendar=Sat 04:" + "1" * 5000), 6, "is not a whole number"),
])
def test_a_timer_that_cannot_be_mapped_is_refused_naming_the_line_and_writes_nothing(cli, edit, line, words):
    """An approximate import would run jobs at other times than the timer; the refusal points at
    the line, exits 3 and leaves the store as it was."""
    _write(cli, "report.timer", GOOD)
    assert cli("import", "systemd-timer", "report.timer").returncode == 0
    before = store_rows(cli.cwd / "qinglong.db")
    _write(cli, "bad.timer", edit(GOOD))
    result = cli("import", "systemd-timer", "bad.timer")
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"bad.timer:{line}: " in result.stderr and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert store_rows(cli.cwd / "qinglong.db") == before


def test_debians_monotonic_and_template_timers_are_refused_by_name(cli):
    """systemd-tmpfiles-clean counts from boot and pg_dump@ is a template: neither has a
    calendar to carry, and a guess would be a different schedule."""
    result = cli("import", "systemd-timer", str(UNITS / "systemd-tmpfiles-clean.timer"))
    assert result.returncode == 3 and "systemd-tmpfiles-clean.timer:" in result.stderr
    assert "OnBootSec=15min: a monotonic timer" in result.stderr
    template = next(UNITS.glob("*@.timer"), None)
    if template is not None:
        result = cli("import", "systemd-timer", str(template))
        assert result.returncode == 3 and "a template timer" in result.stderr
    assert not (cli.cwd / "qinglong.db").exists()


def test_a_timer_imports_once_with_its_triggers_and_again_changes_nothing(cli):
    """Two calendars become two triggers of one task with the jitter and policy; importing the
    same unit again must not make new revisions (each would reset its schedule)."""
    _write(cli, "report.timer", GOOD)
    first = cli("import", "systemd-timer", "report.timer")
    assert first.returncode == 0, first.stderr
    assert "AccuracySec=1min is read by systemd only" in first.stdout
    heads = {t["trigger_id"]: t for t in json.loads(cli("trigger", "list", "--json").stdout)}
    assert set(heads) == {"systemd.report", "systemd.report-2"}
    weekdays, saturday = heads["systemd.report"], heads["systemd.report-2"]
    assert weekdays["spec"]["timezone"] == "Europe/Berlin"
    assert (weekdays["jitter_ms"], weekdays["misfire_policy"]) == (900_000, "fire_once")
    assert saturday["spec"]["expression"] == "0 4 * * 6"
    shown = json.loads(cli("task", "show", "systemd", "report", "--json").stdout)
    assert shown["execution"]["command"] == ["systemctl", "start", "--wait", "report.service"]
    before = store_rows(cli.cwd / "qinglong.db")
    again = cli("import", "systemd-timer", "report.timer")
    assert again.returncode == 0 and "nothing to change" in again.stdout
    assert store_rows(cli.cwd / "qinglong.db") == before


def test_the_one_difference_in_a_daylight_saving_gap_is_reported():
    """On the day Europe/Berlin skips 02:00-03:00 systemd skips a 02:30 timer, while the trigger
    starts at 03:00 (the cron provider's rule); every other day they agree. An import that kept
    quiet about it would surprise the operator once a year."""
    expression, zone = calendar_to_cron("*-*-* 02:30 Europe/Berlin", "UTC")
    ours, theirs = cron_elapses(expression, zone, 6), systemd_elapses("*-*-* 02:30 Europe/Berlin", 5)
    gap_day = 1_774_746_000_000  # 2026-03-29 03:00 CEST, the end of the gap
    assert ours[0] == gap_day and ours[1:] == theirs
    text = GOOD.replace("OnCalendar=Sat 04:00\n", "")
    result = parse_timer(text, "report.timer", "report", project_id="systemd",
                         providers={"cron": CRON}, timezone="UTC")
    assert any("Europe/Berlin changes to daylight-saving time" in n for n in result.notes)
