"""A trigger's random delay on the command line: ``trigger add --jitter``, ``schedules``,
``cron next --jitter``, and the delay a Run drew in ``runs show``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from qinglong.contracts.jitter import JitteredSchedule
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


def _schedules(cli) -> dict:
    return {s["trigger_id"]: s for s in json.loads(_ok(cli("schedules", "--json")))}


def test_trigger_jitter_is_published_kept_on_update_and_shown_by_schedules(cli):
    """Without the option stored, listed and kept on update, a trigger would start on the
    minute on every machine at once (what the jitter is for); ``schedules`` must show the start
    the scheduler will use, not the nominal one."""
    _ok(cli("project", "create", "ops"))
    _ok(cli("task", "put", "ops", "job", "--", "true"))
    _ok(cli("trigger", "add", "ops", "nightly", "--task", "job", "--cron", "30 2 * * *",
            "--jitter", "5m"))
    [head] = json.loads(_ok(cli("trigger", "list", "--json")))
    assert head["jitter_ms"] == 300_000
    shown = _schedules(cli)["nightly"]
    spec = CRON.validate({"expression": "30 2 * * *"})
    schedule = JitteredSchedule(CRON, "ops", "nightly", 300_000)
    first = schedule.first_after_nominal(spec, shown["published_at_ms"])
    assert shown["pending_first_fire_at_ms"] == first
    assert (shown["jitter_ms"], shown["next_jitter_ms"]) == (300_000, first - schedule.nominal_of(spec, first))
    assert "of 5m" in _ok(cli("schedules"))
    # an update that does not name the jitter keeps it (no new revision for nothing)
    _ok(cli("trigger", "update", "ops", "nightly", "--misfire", "fire_once"))
    [head] = json.loads(_ok(cli("trigger", "list", "--json")))
    assert (head["trigger_revision"], head["jitter_ms"]) == (1, 300_000)
    _ok(cli("trigger", "update", "ops", "nightly", "--jitter", "0s"))
    [head] = json.loads(_ok(cli("trigger", "list", "--json")))
    assert (head["trigger_revision"], head["jitter_ms"]) == (2, 0)
    for bad, words in (("2d", "jitter_ms: must be between 0 and 86400000"),
                       ("soon", "--jitter: expected a duration")):
        result = cli("trigger", "update", "ops", "nightly", "--jitter", bad)
        assert result.returncode == 3 and words in result.stderr, result.stderr
    assert json.loads(_ok(cli("trigger", "list", "--json"))) == [head]


def test_cron_next_with_a_jitter_shows_a_triggers_exact_starts_or_the_window(cli):
    """A preview that drew other delays than the scheduler (or none) would promise starts that
    never happen; without a trigger it can only show each start's window."""
    spec = CRON.validate({"expression": "*/5 * * * *", "timezone": "Europe/Berlin"})
    shown = json.loads(_ok(cli("cron", "next", "*/5 * * * *", "--timezone", "Europe/Berlin",
                               "--after", "2026-01-01T00:00:00Z", "--count", "4", "--jitter", "10m",
                               "--trigger", "ops/poll", "--json")))
    schedule = JitteredSchedule(CRON, "ops", "poll", 600_000)
    expected, cursor = [], shown["after_ms"]
    for _ in range(4):
        cursor = schedule.next_after(spec, cursor)
        expected.append(cursor)
    assert [f["at_ms"] for f in shown["fire_times"]] == expected
    for row in shown["fire_times"]:
        assert row["at_ms"] - row["occurrence_ms"] == row["jitter_ms"]
        assert 0 <= row["jitter_ms"] < 300_000  # the window stops at the next occurrence
    window = json.loads(_ok(cli("cron", "next", "30 2 * * *", "--after", "2026-01-01T00:00:00Z",
                                "--count", "2", "--jitter", "5m", "--json")))
    assert [f["latest_start_ms"] - f["at_ms"] for f in window["fire_times"]] == [299_999, 299_999]
    result = cli("cron", "next", "* * * * *", "--trigger", "ops/poll")
    assert result.returncode == 3 and "give --jitter DURATION too" in result.stderr


def test_runs_show_names_the_delay_a_run_drew(cli):
    """The Run says how late its trigger's jitter started it; without it an operator reads a
    jittered start as scheduler lag."""
    _ok(cli("project", "create", "ops"))
    _ok(cli("task", "put", "ops", "job", "--", "true"))
    _ok(cli("trigger", "add", "ops", "fast", "--task", "job", "--cron", "*/2 * * * * *",
            "--jitter", "1500ms"))
    proc = subprocess.Popen([sys.executable, "-m", "qinglong", "run"], cwd=cli.cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = StderrLines(proc.stderr)
    try:
        stderr.wait_for("lifecycle.admission_open")
        runs = wait_until(lambda: json.loads(_ok(cli("runs", "--json"))), "a jittered Run",
                          alive=proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill() if proc.poll() is None else None
    spec = CRON.validate({"expression": "*/2 * * * * *"})
    schedule = JitteredSchedule(CRON, "ops", "fast", 1_500)
    shown = json.loads(_ok(cli("runs", "show", runs[0]["run_id"], "--json")))
    nominal = schedule.nominal_of(spec, shown["scheduled_for_ms"])
    assert shown["scheduled_for_ms"] == schedule.jittered(spec, nominal)
    assert shown["jitter_ms"] == shown["scheduled_for_ms"] - nominal
    text = _ok(cli("runs", "show", runs[0]["run_id"]))
    assert f"plus a jitter of {shown['jitter_ms']} ms" in text or shown["jitter_ms"] == 0
