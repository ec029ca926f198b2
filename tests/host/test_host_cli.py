"""The CLI end to end: publish, run, stop with a signal, read the Runs; errors without tracebacks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from host_helpers import REPO, StderrLines, assert_exactly_once_grid, wait_until

SLOW_STOP = '''
import asyncio
from qinglong.contracts.hookspecs import ComponentPhase, hookimpl


class SlowToStop:
    name = "slow"
    phase = ComponentPhase.STACK

    async def start(self):
        pass

    async def stop(self):
        await asyncio.sleep(30)


@hookimpl
def qinglong_lifecycle_components(context):
    return [SlowToStop()]
'''


def _publish_every_second(cli) -> None:
    for args in (("project", "create", "ops"),
                 ("task", "put", "ops", "backup", "--command", "echo", "hi"),
                 ("trigger", "add", "ops", "tick", "--task", "backup", "--cron", "* * * * * *")):
        result = cli(*args)
        assert result.returncode == 0, result.stderr


def _start_run(cli, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "qinglong", *extra, "run"], cwd=cli.cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _runs(cli) -> list[dict]:
    result = cli("runs", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_run_admits_every_second_and_stops_cleanly_on_sigterm(cli):
    """The main job: a six-field cron becomes one Run per second, each exactly once. A lost
    occurrence leaves a gap in the grid, a duplicated one repeats a key, an early one has lag < 0."""
    _publish_every_second(cli)
    proc = _start_run(cli)
    stderr = StderrLines(proc.stderr)
    try:
        stderr.wait_for("lifecycle.admission_open")
        wait_until(lambda: len(_runs(cli)) >= 2, "two Runs admitted", alive=proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill() if proc.poll() is None else None
    rest = stderr.finish()
    assert proc.returncode == 0, rest
    assert "lifecycle.database_closed" in rest

    runs = _runs(cli)
    assert len(runs) >= 2
    assert_exactly_once_grid(runs, "ql3:cron:v1:tick:1:")
    schedules = json.loads(cli("schedules", "--json").stdout)
    assert schedules[0]["trigger_id"] == "tick"
    assert schedules[0]["next_fire_at_ms"] > max(r["scheduled_for_ms"] for r in runs)


def test_second_signal_forces_the_exit(cli, site):
    """An operator who presses Ctrl-C twice gets the process back even if a stop step hangs
    (here for 30 s): without the forced exit the process would hang until the step returns."""
    site.add_distribution("acme-slow", {"acme_slow.py": SLOW_STOP}, {"slow": "acme_slow"})
    settings = cli.cwd / "s.toml"
    settings.write_text('[plugins]\nenable = ["slow"]\n[lifecycle]\nstop_timeout_ms = 60000\n')
    proc = _start_run(cli, "--settings", str(settings), env=site.env())
    stderr = StderrLines(proc.stderr)
    try:
        stderr.wait_for("lifecycle.admission_open")
        proc.send_signal(signal.SIGINT)
        stderr.wait_for("lifecycle.scheduler_drained")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        elapsed = time.monotonic() - started
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 130, stderr.finish()
    assert elapsed < 25  # the hung stop step sleeps 30 s; only a forced exit comes back sooner


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--cron", "61 * * * *"), "invalid cron trigger: expression: '61 * * * *': the minute field '61' holds 61; "
                                  "a minute is 0 to 59"),
        (("--cron", "* * *"), "has 3 fields; expected 5"),
        (("--cron", "* * * * *", "--timezone", "Mars/Olympus"), "unknown IANA time zone 'Mars/Olympus'"),
        (("--cron", "* * * * *", "--grace-ms", "-5"), "misfire_grace_ms: must be between 0 and 31622400000 (366 days), got -5"),
        (("--cron", "* * * * *", "--task", "nope"), "task 'nope' does not exist in project 'ops'"),
        (("--kind", "lunar", "--spec", "{}"), "unknown trigger kind 'lunar'; kinds provided by the loaded plugins: after, at_start, cron, hook"),
    ],
)
def test_bad_trigger_input_is_a_clear_error_and_writes_nothing(cli, args, expected):
    """A half-written trigger could fire with a spec nobody validated."""
    assert cli("project", "create", "ops").returncode == 0
    assert cli("task", "put", "ops", "backup", "--command", "true").returncode == 0
    argv = ["trigger", "add", "ops", "t1", *args]
    if "--task" not in args:
        argv += ["--task", "backup"]
    result = cli(*argv)
    assert result.returncode == 3, result.stdout + result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads(cli("trigger", "list", "--json").stdout) == []


def test_every_command_has_help(cli):
    commands = [[], ["run"], ["demo"], ["plugins"], ["profiles"], ["config"], ["config", "show"], ["check"],
                ["check", "closure"], ["db"], ["db", "migrate"], ["db", "status"], ["project"],
                ["project", "create"], ["project", "list"], ["task"], ["task", "put"], ["task", "show"],
                ["task", "run"], ["runs", "show"], ["runs", "cancel"], ["logs"], ["trigger"],
                ["trigger", "add"], ["trigger", "update"], ["trigger", "enable"], ["trigger", "disable"],
                ["trigger", "delete"], ["trigger", "list"], ["runs"], ["schedules"], ["skips"],
                ["cron"], ["cron", "next"]]
    for command in commands:
        result = cli(*command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        assert "usage: qinglong" in result.stdout


def test_usage_errors_exit_2(cli):
    assert cli("frobnicate").returncode == 2
    assert cli("runs", "--limit", "many").returncode == 2


def test_demo_shows_runs_that_ran_and_what_they_printed(cli):
    """The README's one-command main job: a demo that only showed admitted Runs would not show the
    one thing a newcomer asks first (did my job run, and what did it print)."""
    result = cli("demo", "--seconds", "1.5")
    assert result.returncode == 0, result.stderr
    assert "demo-every-second" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if "demo/hello" in line]
    assert rows, result.stdout
    ended = [row for row in rows if row[3] == "succeeded"]
    assert ended and all(row[4] == "0" for row in ended), result.stdout  # state, then exit code
    run_id = result.stdout.split("output of run ", 1)[1].split()[0]
    assert f"hello from qinglong: run {run_id}, attempt 1" in result.stdout


def test_profiles_lists_the_three_profiles_with_their_install_line(cli):
    data = json.loads(cli("profiles", "--json").stdout)
    assert [p["name"] for p in data] == ["cluster", "edge", "standalone"]
    assert {p["name"]: p["extra"] for p in data} == {"cluster": "cluster", "edge": "edge", "standalone": "standalone"}
