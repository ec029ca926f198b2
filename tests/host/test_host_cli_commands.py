"""Commands a plugin adds to the command line (hook ``qinglong_cli_commands``).

Each test installs a real plugin distribution (a dist-info on PYTHONPATH, found by entry point like
any third party's) and runs the real ``qinglong`` in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qinglong.contracts.errors import UserError
from qinglong.host.cli.main import HOST_COMMANDS
from qinglong.host.cli.run import demo_trigger
from qinglong.plugins.cron.provider import CronProvider

GREETER = '''
import asyncio

from qinglong.contracts.cli import CliArgument, CliCommand
from qinglong.contracts.errors import UserError
from qinglong.contracts.hookspecs import hookimpl


def greet(context):
    name = context.arguments["name"]
    if not name.strip():
        raise UserError("NAME is empty")
    greeting = context.plugin_settings.get("greeting", "hello")
    if context.arguments["json"]:
        context.print_json({"command": list(context.command), "greeting": greeting, "name": name,
                            "times": context.arguments["times"], "at": context.utc(0)})
        return 0
    for _ in range(context.arguments["times"]):
        print(f"{greeting}, {name}")
    return 0


async def wait(context):
    await asyncio.sleep(0)
    context.print_table(["word"], [[w] for w in context.arguments["words"].split(",")])
    return int(context.arguments["code"])


def whole(text):
    value = int(text)
    if value < 1:
        raise ValueError(f"expected at least 1, got {value}")
    return value


@hookimpl
def qinglong_cli_commands():
    return [
        CliCommand(name="acme", help="acme helpers", subcommands=(
            CliCommand(name="greet", help="greet someone", handler=greet, arguments=(
                CliArgument("name", "who to greet", metavar="NAME"),
                CliArgument("--times", "how often (default 1)", type=whole, default=1),
                CliArgument("--json", "print JSON", switch=True),
            )),
        )),
        CliCommand(name="acme-wait", help="an async command", handler=wait, arguments=(
            CliArgument("words", "comma-separated words"),
            CliArgument("--code", "exit code", default="0"),
        )),
    ]
'''

CALLED_MARKER = '''
import os

from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_cli_commands():
    open(os.environ["ACME_MARKER"], "a").write("called\\n")
    raise RuntimeError("commands are broken")
'''

CLASH_HOST = '''
from qinglong.contracts.cli import CliCommand
from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_cli_commands():
    return [CliCommand(name="{name}", help="mine", handler=lambda context: 0)]
'''


def _settings(tmp_path, *enable: str, extra: str = "") -> str:
    path = tmp_path / "s.toml"
    path.write_text(f"[plugins]\nenable = {json.dumps(list(enable))}\n{extra}")
    return str(path)


@pytest.fixture
def greeter(site, tmp_path):
    site.add_distribution("acme-greeter", {"acme_greeter.py": GREETER}, {"greeter": "acme_greeter"})
    return _settings(tmp_path, "greeter", extra='[plugins.settings.greeter]\ngreeting = "hi"\n')


def test_hook_qinglong_cli_commands_adds_a_command_with_arguments_settings_and_exit_codes(cli, site, greeter):
    """A plugin's command must parse its arguments, read its own settings table and print like the
    host; without the hook a plugin could only add commands by patching the host."""
    env = site.env()
    result = cli("--settings", greeter, "acme", "greet", "ada", "--times", "2", env=env)
    assert (result.returncode, result.stdout, result.stderr) == (0, "hi, ada\nhi, ada\n", "")
    shown = json.loads(cli("acme", "greet", "ada", "--json", "--settings", greeter, env=env).stdout)
    assert shown == {"command": ["acme", "greet"], "greeting": "hi", "name": "ada", "times": 1,
                     "at": "1970-01-01T00:00:00.000Z"}
    refused = cli("--settings", greeter, "acme", "greet", " ", env=env)
    assert (refused.returncode, refused.stderr) == (3, "qinglong: error: NAME is empty\n")
    usage = cli("--settings", greeter, "acme", "greet", "ada", "--times", "0", env=env)
    assert usage.returncode == 2 and "argument --times: expected at least 1, got 0" in usage.stderr
    assert cli("--settings", greeter, "acme", env=env).returncode == 2  # a group needs its subcommand
    waited = cli("--settings", greeter, "acme-wait", "a,bb", "--code", "4", env=env)
    assert (waited.returncode, waited.stdout) == (4, "word\na\nbb\n")
    listed = cli("--settings", greeter, "--help", env=env)
    assert listed.returncode == 0 and "acme helpers" in listed.stdout and "an async command" in listed.stdout
    own_help = cli("--settings", greeter, "acme", "greet", "--help", env=env)
    assert own_help.returncode == 0 and "who to greet" in own_help.stdout and "--settings PATH" in own_help.stdout


def test_plugin_commands_are_loaded_only_when_named_or_listed(cli, site, tmp_path):
    """``qinglong run`` and every host command must never pay for (or be broken by) a plugin's
    commands; a broken hook is reported, naming the plugin, only where the commands are needed."""
    marker = tmp_path / "called"
    site.add_distribution("acme-marker", {"acme_marker.py": CALLED_MARKER}, {"marker": "acme_marker"})
    settings = _settings(tmp_path, "marker")
    env = site.env(ACME_MARKER=str(marker))
    assert cli("--settings", settings, "project", "create", "ops", env=env).returncode == 0
    assert cli("--settings", settings, "schedules", env=env).returncode == 0
    assert cli("--settings", settings, "project", "--help", env=env).returncode == 0
    assert not marker.exists()
    for args in (("acme",), ("--help",), ("-h", "runs")):
        result = cli("--settings", settings, *args, env=env)
        assert result.returncode == 3, (args, result.stderr)
        assert ('qinglong: error: plugin "marker" failed in qinglong_cli_commands: RuntimeError: '
                "commands are broken") in result.stderr
    assert marker.read_text() == "called\n" * 3


@pytest.mark.parametrize("name", ["run", "task", "status"])
def test_a_plugin_command_named_like_a_host_command_is_refused_naming_both(cli, site, tmp_path, name):
    """A plugin's ``run`` would silently replace the scheduler an operator thinks they start."""
    assert name in HOST_COMMANDS
    site.add_distribution("acme-clash", {"acme_clash.py": CLASH_HOST.format(name=name)}, {"clash": "acme_clash"})
    result = cli("--settings", _settings(tmp_path, "clash"), "--help", env=site.env())
    assert result.returncode == 3
    assert (f'plugin "clash" (acme-clash 0.1.0) declares command {name!r}, which is a command of qinglong '
            "itself") in result.stderr


def test_two_plugins_declaring_one_command_are_refused_naming_both(cli, site, tmp_path):
    """Two ``acme`` commands: whichever won, operators would run the other plugin's code unknowingly."""
    site.add_distribution("acme-one", {"acme_one.py": CLASH_HOST.format(name="acme")}, {"one": "acme_one"})
    site.add_distribution("acme-two", {"acme_two.py": CLASH_HOST.format(name="acme")}, {"two": "acme_two"})
    result = cli("--settings", _settings(tmp_path, "one", "two"), "acme", env=site.env())
    assert result.returncode == 3
    assert ('two plugins declare command \'acme\': "one" (acme-one 0.1.0) and "two" (acme-two 0.1.0)'
            in result.stderr)


def test_a_command_declaration_the_parser_cannot_take_is_refused_naming_the_plugin(cli, site, tmp_path):
    """A flag like ``-x`` or a command without a handler would fail deep in argparse, or run nothing."""
    bad = CLASH_HOST.replace('handler=lambda context: 0', 'handler=None').format(name="acme")
    site.add_distribution("acme-bad", {"acme_bad.py": bad}, {"bad": "acme_bad"})
    result = cli("--settings", _settings(tmp_path, "bad"), "acme", env=site.env())
    assert result.returncode == 3
    assert ('plugin "bad" (acme-bad 0.1.0) declares a command the command line cannot take: command '
            "'acme' needs either a handler or subcommands") in result.stderr


def test_cron_next_is_the_cron_plugins_command_and_the_host_registers_none_of_its_own():
    """The host used to own ``cron next`` and read the cron spec's keys; a change to cron's spec
    then meant a change to the host."""
    assert "cron" not in HOST_COMMANDS
    code = ("import sys\nfrom qinglong.host.cli import main\n"
            "code = main(['cron', 'next', '@daily', '--after', '2024-01-01T00:00:00Z', '--count', '1'])\n"
            "print(sorted(m for m in sys.modules if m.startswith(('qinglong.host.cli', 'qinglong.plugins'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert "cron '@daily' in UTC, after 2024-01-01T00:00:00.000Z:" in out.stdout
    modules = out.stdout.strip().splitlines()[-1]
    assert "'qinglong.plugins.cron.command_line'" in modules and "'qinglong.host.cli.cron'" not in modules


def test_reading_runs_does_not_import_the_cron_library(cli):
    """croniter costs every command about 35 ms and 1 MiB at start; a command that only reads Runs
    never computes a fire time, so the library must wait for the first one."""
    assert cli("db", "migrate").returncode == 0
    code = ("import sys\nfrom qinglong.host.cli import main\n"
            "assert main(['runs', '--json']) == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'croniter'))")
    out = cli.python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_demo_publishes_the_first_example_a_provider_offers():
    """The demo wrote a cron spec by hand; it must ask the providers, so it still works on a
    profile where cron is absent and the host knows no kind's spec."""

    class NoExample:
        kind = "aaa"

        def describe(self, spec):
            return "never"

    class Every:
        kind = "every"

        def example_spec(self, every_ms):
            return {"every_ms": every_ms}

        def describe(self, spec):
            return f"every {spec['every_ms']} ms"

    cron = CronProvider()
    assert demo_trigger({"cron": cron, "aaa": NoExample()}) == (
        "cron", {"expression": "* * * * * *", "timezone": "UTC"}, "cron '* * * * * *' in UTC")
    assert demo_trigger({"aaa": NoExample(), "every": Every()}) == ("every", {"every_ms": 1000}, "every 1000 ms")
    with pytest.raises(UserError, match=r"no loaded trigger kind offers an example firing every 1000 ms "
                                        r"for the demo \(loaded kinds: aaa\)"):
        demo_trigger({"aaa": NoExample()})


@pytest.mark.parametrize("after, code, words", [
    ("9999-12-31T23:59:30+00:00", 0, "(no further fire times)"),
    ("9999-12-31T23:58:30+00:00", 0, "9999-12-31T23:59:00.000Z"),
    ("9999-12-31T23:59:30-05:00", 3, "--after '9999-12-31T23:59:30-05:00' lies outside the years 1 to 9999"),
    ("0001-01-01T00:00:00+05:00", 3, "lies outside the years 1 to 9999 once in UTC"),
    # the last microsecond rounded up into year 10000; the last millisecond printed as .998
    ("9999-12-31T23:59:59.999999+00:00", 0, "after 9999-12-31T23:59:59.999Z:"),
    ("9999-12-31T23:59:59.999+00:00", 0, "after 9999-12-31T23:59:59.999Z:"),
])
def test_cron_next_at_the_end_of_the_calendar_answers_without_a_traceback(cli, after, code, words):
    """``cron next --after 9999-12-31T23:59:30Z`` ended in an OverflowError traceback (exit 1, a
    bug): the last representable minute must say there is no further fire time, and a time that
    has no UTC date must be refused by name."""
    result = cli("cron", "next", "* * * * *", "--after", after, "--count", "2")
    assert "Traceback" not in result.stderr
    assert result.returncode == code, result.stderr
    assert words in result.stdout + result.stderr


@pytest.mark.parametrize("jitter", [["--jitter", "1d"], ["--jitter", "1d", "--trigger", "ops/spread"]])
def test_a_jittered_start_never_passes_the_last_instant_of_the_calendar(cli, jitter):
    """The last occurrences of year 9999 had a whole day of window with no next occurrence to cut
    it: a start (or a window's end) drawn into year 10000 ended ``cron next`` in an OverflowError
    traceback, and the API's preview of such a trigger in a 500."""
    result = cli("cron", "next", "* * * * *", "--after", "9999-12-31T23:57:00Z", "--count", "3", "--json", *jitter)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = json.loads(result.stdout)["fire_times"]
    assert len(rows) >= 2
    for row in rows:
        assert row["at_ms"] <= 253_402_300_799_999 and row.get("latest_start_ms", 0) <= 253_402_300_799_999
        assert row["utc"].startswith("9999-12-31T23:5")


def test_cron_fire_times_west_of_utc_never_pass_the_last_utc_second(cli):
    """A wall time of 9999-12-31 in New York is in year 10000 in UTC: it can be neither shown nor
    stored, so it is not a fire time (it failed in the UTC column before)."""
    result = cli("cron", "next", "0 * * * *", "--timezone", "America/New_York",
                 "--after", "9999-12-31T17:30:00", "--count", "5")
    assert result.returncode == 0, result.stderr
    assert "9999-12-31T18:00:00-05:00" in result.stdout and "(no further fire times)" in result.stdout
    assert "T19:00:00-05:00" not in result.stdout


@pytest.mark.parametrize("zone, first, second", [
    ("America/Los_Angeles", "0001-01-01T00:00:00-07:52:58  0001-01-01T07:52:58.000Z",
     "0001-01-01T00:01:00-07:52:58  0001-01-01T07:53:58.000Z"),
    ("Pacific/Kiritimati", "0001-01-01T00:00:00-10:29:20  0001-01-01T10:29:20.000Z",
     "0001-01-01T00:01:00-10:29:20  0001-01-01T10:30:20.000Z"),
    ("Etc/GMT+12", "0001-01-01T00:00:00-12:00  0001-01-01T12:00:00.000Z",
     "0001-01-01T00:01:00-12:00  0001-01-01T12:01:00.000Z"),
    ("Asia/Tokyo", "0001-01-01T09:19:00+09:18:59  0001-01-01T00:00:01.000Z",
     "0001-01-01T09:20:00+09:18:59  0001-01-01T00:01:01.000Z"),
])
def test_cron_next_from_the_first_instant_of_the_calendar_shows_the_first_local_fire_times(
        cli, zone, first, second):
    """At 0001-01-01T00:00:00Z the wall clock west of UTC still reads year 0, where croniter
    cannot start: ``cron next`` said there was no further fire time and hid every fire time of
    the calendar's first day there. They are the first wall times of 0001-01-01 in the zone."""
    result = cli("cron", "next", "* * * * *", "--timezone", zone, "--after", "0001-01-01T00:00:00Z",
                 "--count", "2")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert f"1  {first}" in result.stdout and f"2  {second}" in result.stdout, result.stdout
    assert "(no further fire times)" not in result.stdout


def test_cron_next_east_of_utc_ends_at_the_last_local_minute_of_the_calendar(cli):
    """Kiritimati (+14) reaches year 10000 ten hours before UTC does: its last fire time is
    9999-12-31T23:59:00 there, and nothing follows it."""
    result = cli("cron", "next", "* * * * *", "--timezone", "Pacific/Kiritimati",
                 "--after", "9999-12-31T23:57:30", "--count", "5")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "2  9999-12-31T23:59:00+14:00  9999-12-31T09:59:00.000Z" in result.stdout, result.stdout
    assert "(no further fire times)" in result.stdout


@pytest.mark.parametrize("args", [
    ("run", "--for-seconds", "nan"), ("run", "--for-seconds", "-1"),
    ("run", "--for-seconds", "inf"), ("run", "--for-seconds", "1e300"),
    ("demo", "--seconds", "nan"), ("demo", "--seconds", "-5"), ("demo", "--seconds", "86400"),
])
def test_a_time_to_run_that_is_not_finite_and_positive_is_a_usage_error(cli, args):
    """``run --for-seconds nan`` was accepted ("running for nan s") and ran on, ``-1`` too: the
    operator's bound on the run would be silently lost. Refused before anything is opened."""
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    assert f"argument {args[1]}: expected from 0 to" in result.stderr
    assert not (cli.cwd / "qinglong.db").exists()


@pytest.mark.parametrize("jitter", [["--jitter", "1d"], ["--jitter", "1d", "--trigger", "ops/spread"]])
def test_a_jittered_start_in_year_10000_on_the_wall_clock_is_shown_without_a_traceback(cli, jitter):
    """East of UTC a start drawn late on the calendar's last day (a valid instant of year 9999 in
    UTC) is already year 10000 on Kiritimati's wall clock: its local column ended ``cron next`` in
    an OverflowError traceback (exit 1)."""
    for output in ([], ["--json"]):
        result = cli("cron", "next", "59 23 * * *", "--timezone", "Pacific/Kiritimati",
                     "--after", "9999-12-30T12:00:00Z", "--count", "5", *jitter, *output)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        # the trigger's draw for the last occurrence is the same in every process: 12:39:25 there
        last = "10000-01-01T12:39:25+14:00" if "--trigger" in jitter else "9999-12-31T23:59:00+14:00"
        assert last in result.stdout, result.stdout
