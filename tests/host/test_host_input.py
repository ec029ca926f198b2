"""Input the CLI must refuse, and how every error leaves it: one paragraph and the table's exit code.

Each test runs the real ``qinglong`` command in a subprocess on a real SQLite file (or against a
real, closed TCP port for the cluster profile) and checks the exit code, the one-paragraph message
on stderr (never a traceback, never a secret), and that nothing was written.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from qinglong.contracts.errors import EXIT_CODES, ExitCode, QinglongError
from qinglong.contracts.execution import ExecutionLimits, parse_execution_spec, spec_to_payload
from qinglong.contracts.records import content_digest
from qinglong.contracts.store import MAX_COMMAND_BYTES, MAX_PAYLOAD_BYTES, MAX_SPEC_BYTES

from host_helpers import REPO


#: The edge profile's execution defaults and caps, as `task put` applies them.
EDGE_LIMITS = ExecutionLimits(default_timeout_ms=3_600_000, max_timeout_ms=86_400_000,
                              default_log_limit_bytes=4 * 1024 * 1024, max_log_limit_bytes=4 * 1024 * 1024)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _publish_task(cli) -> None:
    assert cli("project", "create", "ops").returncode == 0
    assert cli("task", "put", "ops", "backup", "--command", "true").returncode == 0


def _refused(result, code: int, *expected: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if code != ExitCode.USAGE_ERROR:
        assert len(lines) == 1 and lines[0].startswith("qinglong: "), result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


def _task_missing(cli, task: str) -> bool:
    """True when no task ``task`` exists in project ops (a trigger on it is refused as NotFound)."""
    probe = cli("trigger", "add", "ops", "probe", "--task", task, "--cron", "0 0 * * *")
    return probe.returncode == 3 and f"task '{task}' does not exist" in probe.stderr


# --------------------------------------------------------------------------- exit codes


def _readme_exit_codes() -> dict[int, str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"^\| (\d+) \| `([A-Z_]+)` \|", line)
        if match:
            rows[int(match.group(1))] = match.group(2)
    return rows


def test_readme_exit_code_table_is_exactly_the_exit_code_enum():
    """A script that branches on an exit code the README documents wrongly would retry a bug or give up
    on a store that is only unavailable for a moment."""
    assert _readme_exit_codes() == {int(code): code.name for code in ExitCode}


def test_every_error_type_in_the_table_is_a_qinglong_error_with_a_non_bug_code():
    """An error type mapped to 1 would be reported as a bug although the product raised it on purpose."""
    for error_type, code in EXIT_CODES:
        assert issubclass(error_type, QinglongError)
        assert code not in (ExitCode.OK, ExitCode.INTERNAL_ERROR, ExitCode.USAGE_ERROR)


BUGGY_PROVIDER = '''
from qinglong.contracts.hookspecs import hookimpl


class Provider:
    kind = "buggy"

    def validate(self, spec):
        return dict(spec)

    def next_after(self, spec, after_ms):
        return after_ms - after_ms % 1000 + 1000

    def latest_at_or_before(self, spec, at_ms):
        return at_ms - at_ms % 1000

    def describe(self, spec):
        return 1 // 0


@hookimpl
def qinglong_trigger_providers():
    return [Provider()]
'''


def test_a_genuine_bug_exits_1_with_its_traceback(cli, site):
    """If a bug were dressed as a user error, nobody would report it; if a user error exited 1, every
    mistake would look like a bug. Only an exception the product did not raise on purpose exits 1."""
    site.add_distribution("acme-buggy", {"acme_buggy.py": BUGGY_PROVIDER}, {"buggy": "acme_buggy"})
    settings = cli.cwd / "s.toml"
    settings.write_text('[plugins]\nenable = ["buggy"]\n')
    env = site.env(QINGLONG_SETTINGS=str(settings))
    for args in (("project", "create", "ops"), ("task", "put", "ops", "t", "--command", "true"),
                 ("trigger", "add", "ops", "b", "--task", "t", "--kind", "buggy", "--spec", "{}")):
        assert cli(*args, env=env).returncode == 0
    result = cli("trigger", "list", env=env)
    assert result.returncode == ExitCode.INTERNAL_ERROR
    assert "Traceback" in result.stderr and "ZeroDivisionError" in result.stderr


def test_unreachable_cluster_database_is_one_paragraph_exit_5_without_the_password(cli, tmp_path):
    """A traceback (or exit 1) for a database that is down sends operators to the bug tracker, and a
    DSN in it leaks the password."""
    with socket.socket() as sock:  # a port that was just free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = tmp_path / "cluster.toml"
    settings.write_text('profile = "cluster"\n[backend]\n'
                        f'runtime_dsn = "postgresql://rt:hunter2@127.0.0.1:{port}/ql?connect_timeout=3"\n'
                        f'admin_dsn = "postgresql://ad:hunter2@127.0.0.1:{port}/ql?connect_timeout=3"\n'
                        'pool_timeout_ms = 3000\n')
    for args in (("runs",), ("project", "create", "ops")):
        result = cli("--settings", str(settings), *args)
        _refused(result, ExitCode.UNAVAILABLE, "qinglong: unavailable: ")
        assert "hunter2" not in result.stdout + result.stderr


# --------------------------------------------------------------------------- argv and JSON


def test_undecodable_bytes_in_argv_are_refused_naming_the_argument(cli):
    """Bytes that are not UTF-8 end as a lone surrogate: once a UnicodeEncodeError traceback, and a
    command no store can hold. Refused before anything is opened, by position (the value may be secret)."""
    _publish_task(cli)
    result = subprocess.run([sys.executable, "-m", "qinglong", "task", "put", "ops", "odd", "--", b"ls\xff"],
                            cwd=cli.cwd, env=_env(), capture_output=True, text=True, timeout=60)
    _refused(result, ExitCode.USER_ERROR, "argument 6 is not valid UTF-8 text")
    assert _task_missing(cli, "odd")


@pytest.mark.parametrize("payload, expected", [
    ('{"a": "\\udc80"}', "--payload: text at $.a is not valid Unicode (a lone surrogate"),
    ('{"a": NaN}', "--payload is not valid JSON: NaN is not a JSON number"),
    ('{"a": [1, -Infinity]}', "--payload is not valid JSON: -Infinity is not a JSON number"),
    ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "--payload: nested too deeply"),
    ('{"a": ' + "[" * 40 + "]" * 40 + "}", "--payload: nested deeper than 32 levels"),
    ('{"a": "' + "x" * MAX_PAYLOAD_BYTES + '"}', f"over the limit of {MAX_PAYLOAD_BYTES} bytes"),
    ('[1, 2]', "--payload must be a JSON object"),
])
def test_payload_that_is_not_plain_bounded_json_is_refused_and_writes_nothing(cli, payload, expected):
    """A surrogate or 5,000 levels of nesting ended in a traceback; NaN was stored as JSON no other
    reader accepts; an unbounded payload grows every Run's store. Each must be refused, naming where."""
    _publish_task(cli)
    result = cli("task", "put", "ops", "bad", "--payload", payload)
    _refused(result, ExitCode.USER_ERROR, expected)
    assert "xxxxxxxx" not in result.stderr  # the value is never echoed
    assert _task_missing(cli, "bad")


def test_spec_with_nan_or_over_the_limit_is_refused_and_writes_nothing(cli):
    """A spec that is not plain JSON would be stored and then fail every round that reads it."""
    _publish_task(cli)
    for spec, expected in (('{"expression": "* * * * *", "x": NaN}', "NaN is not a JSON number"),
                           ('{"expression": "' + " " * MAX_SPEC_BYTES + '* * * * *"}',
                            f"over the limit of {MAX_SPEC_BYTES} bytes")):
        result = cli("trigger", "add", "ops", "t1", "--task", "backup", "--kind", "cron", "--spec", spec)
        _refused(result, ExitCode.USER_ERROR, expected)
    assert json.loads(cli("trigger", "list", "--json").stdout) == []


def test_command_over_the_limit_is_refused(cli):
    """A command that no execve could take (or that bloats every Run) is refused at publish time."""
    _publish_task(cli)
    result = cli("task", "put", "ops", "huge", "--", "echo", "x" * MAX_COMMAND_BYTES)
    _refused(result, ExitCode.USER_ERROR, f"over the limit of {MAX_COMMAND_BYTES} bytes")
    assert _task_missing(cli, "huge")


@pytest.mark.parametrize("identifier", ["-x", ".", ".."])
def test_identifiers_that_read_as_options_or_paths_are_refused(cli, identifier):
    """``-x`` reads as an option and ``.``/``..`` as paths in every tool an operator pipes ids into."""
    assert cli("project", "create", "ops").returncode == 0
    result = cli("project", "create", "--", identifier)
    _refused(result, ExitCode.USER_ERROR, f"invalid project_id {identifier!r}")
    assert [p["project_id"] for p in json.loads(cli("project", "list", "--json").stdout)] == ["ops"]


@pytest.mark.parametrize("command", [["runs"], ["skips"], ["schedules"], ["trigger", "list"], ["audit"]])
@pytest.mark.parametrize("limit", ["-1", "0", "1000001", "99999999999999999999"])
def test_listing_limit_outside_its_range_is_a_usage_error(cli, command, limit):
    """``runs --limit -1`` ended in a ValueError traceback from the store; ``audit --limit`` took
    -1 and 0 as they came (an empty listing hid every entry) and ended a number over 2**63 in an
    OverflowError traceback."""
    _publish_task(cli)
    result = cli(*command, "--limit", limit)
    _refused(result, ExitCode.USAGE_ERROR, "argument --limit: expected a number from 1 to 100000")


@pytest.mark.parametrize("command", [["audit", "--since"], ["token", "create", "t1", "--scope", "read", "--expires"]])
def test_a_duration_past_a_century_is_refused_naming_the_option(cli, command):
    """``audit --since 999999999999999d`` (15 digits, as a duration may have) reached the store as a
    time before the year 1 and ended in an OverflowError traceback: every duration a command line
    accepts must stay a storable number of milliseconds."""
    _publish_task(cli)
    before = cli("token", "list", "--json").stdout
    result = cli(*command, "999999999999999d")
    _refused(result, ExitCode.USER_ERROR, f"{command[-1]}: expected a duration")
    assert cli("token", "list", "--json").stdout == before


@pytest.mark.parametrize("option", ["--hook-window-s", "--hook-per-minute"])
@pytest.mark.parametrize("value", ["\u00b2", "\u0663\u0660\u0660", "-1", "1" * 5000])
def test_a_hook_option_takes_ascii_digits_only_and_writes_nothing(cli, option, value):
    """``str.isdigit`` is true for ``²``, which ``int`` refuses: the option ended as "a bug in its
    plugin"; ``٣٠٠`` (Arabic-Indic digits) was stored as 300 without a word. Either way the trigger
    must not be written."""
    _publish_task(cli)
    env = dict(_env(), HOOK_SECRET="s" * 32)
    result = cli("trigger", "add", "ops", "in", "--task", "backup", "--kind", "hook",
                 "--hook-secret-env", "HOOK_SECRET", option, value, env=env)
    _refused(result, ExitCode.USER_ERROR, f"{option}: expected a whole number")
    assert "a bug" not in result.stderr
    assert json.loads(cli("trigger", "list", "--json").stdout) == []


@pytest.mark.parametrize("expression, words", [
    ("\u00b2 * * * *", "the minute field '\u00b2' is not understood"),
    ("*/\u00b2 * * * *", "the minute field '*/\u00b2' steps by '\u00b2'"),
    ("0 1-\u00b2 * * *", "the hour field '1-\u00b2' is not understood"),
    ("99999999999999999999 * * * *", "the minute field '99999999999999999999' holds "),
])
def test_a_cron_number_that_is_no_ascii_number_is_refused_naming_its_field(cli, expression, words):
    """``str.isdigit`` is true for ``²``, which ``int`` refuses: ``trigger add --cron '² * * * *'``
    ended in a ValueError traceback (exit 1) instead of naming the field, in publishing and in
    ``cron next`` alike; nothing may be written."""
    _publish_task(cli)
    result = cli("trigger", "add", "ops", "t1", "--task", "backup", "--cron", expression)
    _refused(result, ExitCode.USER_ERROR, words)
    assert json.loads(cli("trigger", "list", "--json").stdout) == []
    _refused(cli("cron", "next", expression), ExitCode.USER_ERROR, words)


@pytest.mark.parametrize("zone", ["localtime", "posixrules"])
def test_a_timezone_that_names_this_machines_setting_is_refused(cli, zone):
    """``localtime`` (a link to /etc/localtime) and ``posixrules`` were taken as zones: the trigger's
    fire times then follow whatever the machine is set to, change when it is reconfigured, and
    differ between the hosts of a cluster, without a word in the stored spec."""
    _publish_task(cli)
    result = cli("trigger", "add", "ops", "t1", "--task", "backup", "--cron", "0 2 * * *", "--timezone", zone)
    _refused(result, ExitCode.USER_ERROR, f"timezone: {zone!r} names this machine's")
    assert json.loads(cli("trigger", "list", "--json").stdout) == []


@pytest.mark.parametrize("flag", ["--project", "--task", "--trigger"])
@pytest.mark.parametrize("value", ["\u00b2", "x" * 65, "a/b"])
def test_a_runs_filter_that_is_no_identifier_is_refused_naming_the_flag(cli, flag, value):
    """``runs --project ²`` listed nothing and exited 0: a filter no Run can ever match reads as
    "no Runs", hiding a typo (the API refuses the same filter)."""
    _publish_task(cli)
    result = cli("runs", flag, value)
    _refused(result, ExitCode.USER_ERROR, f"{flag}: invalid")


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://[::1", "http://127.0.0.1:\u00b2/",
                                 "http://127.0.0.1:-1", "http://127.0.0.1:" + "1" * 5000])
def test_an_api_url_with_no_usable_port_is_refused_naming_the_option(cli, url):
    """``--api http://127.0.0.1:99999`` (or a bracket left open) ended every command in a ValueError
    traceback from urllib instead of naming the option."""
    result = cli("--api", url, "runs", env=dict(_env(), QINGLONG_API_TOKEN="t" * 32))
    _refused(result, ExitCode.USER_ERROR, "--api: expected http://HOST:PORT or https://HOST:PORT")


def test_empty_timezone_is_refused_naming_the_option(cli):
    """``--timezone ""`` silently became UTC: a Berlin job would run an hour or two off."""
    _publish_task(cli)
    result = cli("trigger", "add", "ops", "t1", "--task", "backup", "--cron", "0 2 * * *", "--timezone", "")
    _refused(result, ExitCode.USER_ERROR, "--timezone is empty")
    assert json.loads(cli("trigger", "list", "--json").stdout) == []


@pytest.mark.parametrize("expression, what", [("R 0 * * *", "random"), ("0 H * * *", "hashed")])
def test_nondeterministic_cron_fields_are_refused_at_publish(cli, expression, what):
    """``R`` drew a new minute on every reading: each round and replica saw another next fire time."""
    _publish_task(cli)
    result = cli("trigger", "add", "ops", "t1", "--task", "backup", "--cron", expression)
    _refused(result, ExitCode.USER_ERROR, f"uses croniter's {what} field")
    assert json.loads(cli("trigger", "list", "--json").stdout) == []


# --------------------------------------------------------------------------- the command argv


@pytest.mark.parametrize("argv", [
    ["--", "/bin/sh", "-c", "date"],
    ["--", "ls", "-la", "--color=never"],
    ["--payload", '{"env": {"A": "1"}}', "--", "-weird-program", "--"],
    ["--command", "ls", "-la"],
])
def test_task_command_after_double_dash_is_stored_as_the_argv_list(cli, argv):
    """``--command /bin/sh -c 'date'`` failed with exit 2: a command with a dashed argument could not
    be published at all. Everything after ``--`` is the command, stored as a list."""
    assert cli("project", "create", "ops").returncode == 0
    result = cli("task", "put", "ops", "job", *argv)
    assert result.returncode == 0, result.stderr
    if "--payload" in argv:
        given = {"env": {"A": "1"}, "command": ["-weird-program", "--"]}
    else:
        given = {"command": argv[1:]}
    # Every execution value is stated in the stored payload (the edge profile's defaults here).
    payload = spec_to_payload(parse_execution_spec("job", given, EDGE_LIMITS))
    assert payload["command"] == given["command"]
    assert content_digest(payload)[:19] in result.stdout


def test_command_given_twice_or_not_at_all_is_refused(cli):
    """Two commands, or a payload and a command both naming ``command``, would silently drop one."""
    assert cli("project", "create", "ops").returncode == 0
    _refused(cli("task", "put", "ops", "j", "--command", "ls", "--", "-x"), 3, "not both")
    _refused(cli("task", "put", "ops", "j", "--payload", '{"command": ["a"]}', "--", "b"), 3, "give it once")
    _refused(cli("task", "put", "ops", "j"), 3, "a task needs a command")


# --------------------------------------------------------------------------- a closed stdout


@pytest.mark.parametrize("args", [["cron", "next", "* * * * * *", "--count", "5000"], ["runs"], ["profiles"]])
def test_stdout_closed_by_its_reader_exits_141_without_a_traceback(cli, args):
    """``qinglong runs | head -1`` printed a BrokenPipeError traceback. The reader is gone before the
    first write here (the read end is closed at once), so every write meets a closed pipe."""
    if args == ["runs"]:
        _publish_task(cli)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "qinglong", *args], cwd=cli.cwd, env=_env(),
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert result.returncode == ExitCode.BROKEN_PIPE, result.stderr
    assert result.stderr == ""


def test_head_of_a_long_listing_exits_quietly(cli):
    """The same with a reader that takes one line and leaves, as ``| head -1`` does."""
    # 5,000 rows (about 300 KB) outgrow the pipe's 64 KiB buffer: the writer meets the closed pipe
    proc = subprocess.Popen([sys.executable, "-m", "qinglong", "cron", "next", "* * * * * *", "--count", "5000"],
                            cwd=cli.cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert first.startswith(b"cron '* * * * * *' in UTC")
    assert proc.returncode == ExitCode.BROKEN_PIPE
    assert err == b""


# --------------------------------------------------------------------------- settings a command cannot honour

@pytest.mark.parametrize("profile, where", [("edge", "file"), ("standalone", "file"), ("edge", "environment")])
def test_demo_with_execution_disabled_is_refused_at_once_and_writes_nothing(cli, profile, where):
    """``[execution] enabled = false`` keeps ``qinglong run`` from starting any process, so the
    demo published its trigger, then held the terminal about a minute waiting for a Run that
    could not end, and left a database behind. It is refused before anything is written, naming
    the file (or variable) and the key."""
    settings = cli.cwd / "settings.toml"
    env = _env()
    if where == "file":
        settings.write_text(f'profile = "{profile}"\n[execution]\nenabled = false\n')
        named = f"{settings}: key 'execution.enabled'"
    else:
        settings.write_text(f'profile = "{profile}"\n')
        env["QINGLONG_EXECUTION__ENABLED"] = "false"
        named = "environment variable QINGLONG_EXECUTION__ENABLED: key 'execution.enabled'"
    result = cli("--settings", str(settings), "demo", "--seconds", "1", env=env)
    _refused(result, ExitCode.USER_ERROR, named, "no Run of the demo can start")
    assert sorted(p.name for p in cli.cwd.iterdir()) == ["settings.toml"]


# --------------------------------------------------------------------------- long input in errors

#: A value no one means: 5,000 characters, each error quoting it must cut it.
LONG = "a" * 5000
#: A cron expression of 5,000 characters (its step too long for any field).
LONG_CRON = "*/" + "1" * 4995 + " * * * *"
#: Each command with a 5,000-character value where the user gives one, its exit code and words
#: saying what was expected.
LONG_INPUTS = [
    (("project", "create", LONG), 3, "expected 1-64 ASCII letters"),
    (("project", "delete", LONG), 3, "expected 1-64 ASCII letters"),
    (("task", "put", "ops", LONG, "--", "true"), 3, "expected 1-64 ASCII letters"),
    (("task", "put", LONG, "x", "--", "true"), 3, "expected 1-64 ASCII letters"),
    (("task", "put", "ops", "x", "--timeout", LONG, "--", "true"), 3, "expected a duration"),
    (("task", "put", "ops", "x", "--log-limit", LONG, "--", "true"), 3, "expected a size"),
    (("task", "put", "ops", "x", "--workdir", LONG, "--", "true"), 3, "expected an absolute path"),
    (("task", "put", "ops", "x", "--label", LONG, "--", "true"), 3, "expected a list of at most 32 labels"),
    (("task", "put", "ops", "x", "--payload", '{"command": "' + LONG + '"}'), 3, "expected a list of arguments"),
    (("task", "show", "ops", LONG), 3, "does not exist in project 'ops'"),
    (("task", "delete", "ops", LONG), 3, "does not exist in project 'ops'"),
    (("task", "run", "ops", LONG), 3, "does not exist in project 'ops'"),
    (("task", "list", LONG), 3, "does not exist"),
    (("trigger", "add", "ops", LONG, "--task", "backup", "--cron", "0 0 * * *"), 3, "expected 1-64 ASCII letters"),
    (("trigger", "add", "ops", "t2", "--task", LONG, "--cron", "0 0 * * *"), 3, "expected 1-64 ASCII letters"),
    (("trigger", "add", "ops", "t2", "--task", "backup", "--kind", LONG, "--spec", "{}"), 3,
     "kinds provided by the loaded plugins: "),
    (("trigger", "add", "ops", "t2", "--task", "backup", "--cron", "0 0 * * *", "--jitter", LONG), 3,
     "expected a duration"),
    (("trigger", "update", "ops", LONG, "--cron", "0 0 * * *"), 3, "does not exist in project 'ops'"),
    (("trigger", "enable", "ops", LONG), 3, "does not exist in project 'ops'"),
    (("trigger", "delete", "ops", LONG), 3, "does not exist in project 'ops'"),
    (("cron", "next", LONG_CRON), 3, "is not a valid cron expression"),
    (("cron", "next", "1 " * 2500), 3, "expected 5 (minute hour day month weekday) or 6"),
    (("cron", "next", "@" + LONG), 3, "expected one of @hourly"),
    (("cron", "next", "0 0 * * *", "--timezone", LONG), 3, "unknown IANA time zone"),
    (("cron", "next", "0 0 * * *", "--after", LONG), 3, "is not an ISO 8601 time such as"),
    (("cron", "next", "0 0 * * *", "--jitter", LONG), 3, "expected a duration"),
    (("cron", "next", "0 0 * * *", "--jitter", "5m", "--trigger", LONG), 3, "expected PROJECT/TRIGGER"),
    (("cron", "next", "0 0 * * *", "--count", LONG), 2, "expected a whole number"),
    (("runs", "show", LONG), 3, "does not exist"),
    (("runs", "cancel", LONG), 3, "does not exist"),
    (("logs", LONG), 3, "does not exist"),
    (("logs", "x", "--attempt", LONG), 2, "expected a whole number"),
    (("runs", "--project", LONG), 3, "expected 1-64 ASCII letters"),
    (("runs", "--limit", LONG), 2, "expected a whole number"),
    (("runs", "--state", LONG), 2, "invalid choice: "),
    (("schedules", "--after", LONG), 2, "is not a schedule cursor"),
    (("export", "--project", LONG), 3, "the store has no such project"),
    (("apply", LONG), 3, "cannot read the file"),
    (("import", "crontab", LONG), 3, "cannot read the crontab"),
    (("token", "create", LONG, "--scope", "read"), 3, "expected 1-64 letters"),
    (("token", "revoke", LONG), 3, "expected 1-64 letters"),
    (("audit", "--since", LONG), 3, "expected a duration"),
    (("--settings", LONG, "runs"), 3, "cannot be read (named by --settings)"),
    (("--settings", "a/" * 1000 + "x.toml", "runs"), 3, "does not exist (named by --settings)"),
    (("--profile", LONG, "runs"), 3, "the profiles shipped are: "),
    ((LONG,), 2, "invalid choice: "),
    (("status", "--interval", LONG), 2, "expected a number of seconds"),
]


@pytest.fixture(scope="module")
def published_store(tmp_path_factory):
    """A store with a project, a task, a trigger and a Run, shared by the long-input tests (each
    proves it changed nothing)."""
    from host_helpers import run_cli

    workdir = tmp_path_factory.mktemp("long-input")
    for args in (("project", "create", "ops"), ("task", "put", "ops", "backup", "--", "true"),
                 ("trigger", "add", "ops", "nightly", "--task", "backup", "--cron", "0 0 * * *"),
                 ("task", "run", "ops", "backup")):
        assert run_cli(list(args), cwd=workdir).returncode == 0, args
    return workdir


def _dump(db) -> str:
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("args, code, expected", LONG_INPUTS,
                         ids=[" ".join(a if len(a) <= 20 else a[:12] + "..." for a in args)
                              for args, _, _ in LONG_INPUTS])
def test_an_error_quotes_a_long_value_cut_to_its_first_80_characters(published_store, args, code, expected):
    """A 5,000-character cron expression, Run id, identifier or option value was echoed whole by
    its error: a page of one word on the terminal, which buries what was expected (and fills a
    log line). Every error quotes it through one helper, cut to 80 characters with its length (a
    file's path keeps its last 100 too, the name that was wrong), exits with the table's code and
    writes nothing."""
    from host_helpers import run_cli

    db = published_store / "qinglong.db"
    before = _dump(db)
    result = run_cli(list(args), cwd=published_store)
    assert result.returncode == code, (result.returncode, result.stderr[-600:])
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    if code == ExitCode.USER_ERROR:
        assert len(result.stderr.strip().splitlines()) == 1 and message.startswith("qinglong: "), result.stderr
    assert len(message) < 500, message
    cut = re.search(r"'\.\.\.(?:'.*')? \((\d+) characters\)", message)
    assert cut is not None and int(cut.group(1)) >= 2000, message  # the length of the whole value
    assert expected in message, message
    assert _dump(db) == before
