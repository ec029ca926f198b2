"""Reading commands: fire-time previews, schedules from publish on, lag only while a scheduler runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from qinglong.plugins.cron.provider import CronProvider

from host_helpers import REPO, StderrLines, wait_until

CRON = CronProvider()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _ok(result) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


def _publish(cli, *triggers: tuple[str, str], disabled: tuple[str, ...] = ()) -> None:
    _ok(cli("project", "create", "ops"))
    _ok(cli("task", "put", "ops", "job", "--command", "true"))
    for trigger_id, expression in triggers:
        extra = ("--disabled",) if trigger_id in disabled else ()
        _ok(cli("trigger", "add", "ops", trigger_id, "--task", "job", "--cron", expression, *extra))


def test_cron_next_previews_fire_times_exactly_as_the_provider_computes_them(cli):
    """An operator checks a schedule before publishing it; a preview that differed from the scheduler
    (here across Berlin's spring-forward gap) would promise a Run at a time it never happens."""
    result = cli("cron", "next", "30 2 * * *", "--timezone", "Europe/Berlin", "--after", "2024-03-30T12:00:00",
                 "--count", "3", "--json")
    shown = json.loads(_ok(result))
    start = int(datetime(2024, 3, 30, 12, tzinfo=ZoneInfo("Europe/Berlin")).timestamp() * 1000)
    spec = CRON.validate({"expression": "30 2 * * *", "timezone": "Europe/Berlin"})
    expected, cursor = [], start
    for _ in range(3):
        cursor = CRON.next_after(spec, cursor)
        expected.append(cursor)
    assert shown["after_ms"] == start
    assert [f["at_ms"] for f in shown["fire_times"]] == expected
    assert [f["local"] for f in shown["fire_times"]] == [
        "2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00", "2024-04-02T02:30:00+02:00"]
    text = _ok(cli("cron", "next", "@daily", "--after", "2024-01-01T00:00:00Z", "--count", "2"))
    assert "cron '@daily' in UTC" in text
    assert "2024-01-02T00:00:00+00:00" in text and "2024-01-03T00:00:00+00:00" in text


def test_cron_next_refuses_what_a_trigger_would_refuse(cli):
    """The preview goes through the same validation as publishing: no preview of an unusable schedule."""
    for args, expected in ((("R 0 * * *",), "uses croniter's random field"),
                           (("* * * * *", "--timezone", ""), "--timezone is empty"),
                           (("0 0 30 2 *",), "day 30 of February never occurs")):
        result = cli("cron", "next", *args)
        assert result.returncode == 3, result.stderr
        assert expected in result.stderr and "Traceback" not in result.stderr
    assert cli("cron", "next", "* * * * *", "--count", "0").returncode == 2


def test_text_listings_say_yes_or_no_for_enabled(cli):
    """``True``/``False`` in a table is Python leaking through, not an answer an operator reads."""
    _publish(cli, ("on", "0 * * * *"), ("off", "0 * * * *"), disabled=("off",))
    for command in (("schedules",), ("trigger", "list")):
        lines = _ok(cli(*command)).splitlines()
        rows = {line.split()[1]: line.split() for line in lines if line.startswith("ops ")}
        assert rows["on"][3 if command == ("schedules",) else 4] == "yes"
        assert rows["off"][3 if command == ("schedules",) else 4] == "no"
        assert "True" not in " ".join(lines) and "False" not in " ".join(lines)


def test_schedules_and_trigger_list_take_a_limit(cli):
    """Without ``--limit`` a listing of a large store prints every row it has."""
    _publish(cli, ("a", "0 * * * *"), ("b", "0 * * * *"), ("c", "0 * * * *"))
    assert len(json.loads(_ok(cli("schedules", "--json", "--limit", "2")))) == 2
    assert len(json.loads(_ok(cli("trigger", "list", "--json", "--limit", "2")))) == 2
    assert len(json.loads(_ok(cli("trigger", "list", "--json")))) == 3


def test_schedules_show_the_first_fire_time_from_publish_on(cli):
    """Before any scheduler round the next fire time was empty: an operator could not tell when a new
    trigger would first run. It is the first occurrence strictly after the publish time (what
    initialization will take), marked pending."""
    _publish(cli, ("yearly", "0 0 1 1 *"))
    [shown] = json.loads(_ok(cli("schedules", "--json")))
    assert shown["next_fire_at_ms"] is None  # no round has initialized the cursor
    assert shown["published_at_ms"] is not None
    spec = CRON.validate({"expression": "0 0 1 1 *"})
    assert shown["pending_first_fire_at_ms"] == CRON.next_after(spec, shown["published_at_ms"])
    text = _ok(cli("schedules"))
    first = datetime.fromtimestamp(shown["pending_first_fire_at_ms"] / 1000, timezone.utc)
    assert first.strftime("%Y-%m-%dT%H:%M:%S.000Z (pending)") in text


def test_lag_does_not_grow_for_a_stopped_scheduler(cli):
    """``lag_ms`` kept growing after the scheduler stopped, so a monitor alerting on lag fired for a
    scheduler that was simply not running, and never said it was stopped. While one runs, schedules
    say so; once stopped, lag is frozen at the last round and the status says stopped."""
    _publish(cli, ("tick", "* * * * * *"))
    proc = subprocess.Popen([sys.executable, "-m", "qinglong", "run"], cwd=cli.cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = StderrLines(proc.stderr)
    try:
        stderr.wait_for("lifecycle.admission_open")

        def initialized():  # a round has initialized the cursor
            [shown] = json.loads(_ok(cli("schedules", "--json")))
            return shown if shown["next_fire_at_ms"] is not None else None

        running = wait_until(initialized, "a round initializing the cursor", alive=proc)
        assert running["scheduler_running"] is True
        assert "scheduler: running" in _ok(cli("schedules"))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, stderr.finish()

    [stopped] = json.loads(_ok(cli("schedules", "--json")))
    assert stopped["scheduler_running"] is False
    # Wait (on the clock, not a fixed sleep) until "now" is well past the last round, then read again:
    # the lag must not have moved, and it is reported as of the last round, not as of now.
    as_of = stopped["lag_as_of_ms"]
    while time.time_ns() // 1_000_000 < (as_of or 0) + 2_500:
        time.sleep(0.05)
    [later] = json.loads(_ok(cli("schedules", "--json")))
    assert later["lag_ms"] == stopped["lag_ms"]
    assert later["lag_as_of_ms"] == as_of
    # measured at the last round, not at the read 2.5 s later (however long the round took to come)
    if as_of is None:  # the store cannot tell when the last round was: lag is unknown, not growing
        assert later["lag_ms"] is None
    else:
        assert later["lag_ms"] == max(0, as_of - later["next_fire_at_ms"])
        assert later["lag_ms"] < time.time_ns() // 1_000_000 - later["next_fire_at_ms"]
    assert "scheduler: stopped" in _ok(cli("schedules"))
