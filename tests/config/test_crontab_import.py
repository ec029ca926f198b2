"""``qinglong import crontab``: real-world crontabs read as Debian cron (Vixie cron 3.0) reads them.

Fixtures: ``debian-etc-crontab`` is the ``/etc/crontab`` Debian's ``cron-daemon-common`` package
ships (3.0pl1-162); the ``openwrt-*-root`` files are the ``package/base-files/files/etc/crontabs/root``
that OpenWrt-based firmwares ship (teleofis, Seeed's LoRa gateway, lede-project/source and an
ImmortalWrt tree: the upstream tree ships none); ``every-rule.crontab`` is hand-written with
every rule of crontab(5) the importer follows.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.config.config_helpers import FIXTURES

from qinglong.contracts.errors import UserError
from qinglong.host.config.crontab import parse_crontab, split_percent
from qinglong.plugins.cron.provider import CronProvider

PROVIDERS = {"cron": CronProvider()}


def _jobs(result):
    project = result.data["projects"][result.project_id]
    return [(project["tasks"][t["task"]], t) for t in project["triggers"].values()]


def _parse(name: str, **kw):
    return parse_crontab((FIXTURES / name).read_text(), name, project_id="crontab",
                         providers=PROVIDERS, timezone="Europe/Berlin", **kw)


def test_debians_etc_crontab_imports_its_four_jobs_with_user_and_environment():
    """Debian's system crontab: four run-parts jobs, each with the SHELL and PATH set above it;
    the user field is not part of the command (else every job would run `root` as a program)."""
    result = _parse("debian-etc-crontab", system=True)
    jobs = _jobs(result)
    assert [t["spec"]["expression"] for _, t in jobs] == ["17 * * * *", "25 6 * * *", "47 6 * * 7", "52 6 1 * *"]
    task, _ = jobs[0]
    assert task["command"] == ["/bin/sh", "-c", "cd / && run-parts --report /etc/cron.hourly"]
    assert task["env"] == {"SHELL": {"value": "/bin/sh"},
                           "PATH": {"value": "/usr/local/sbin:/usr/local/bin:/sbin:/bin:/usr/sbin:/usr/bin"}}
    assert all(t["spec"]["timezone"] == "Europe/Berlin" for _, t in jobs)
    assert any("user(s) root" in note for note in result.notes)
    assert any("line 17: a job commented out" in note for note in result.notes)


@pytest.mark.parametrize("name, expression, command", [
    ("openwrt-teleofis-root", "*/10 * * * *", "/sbin/ntptohc.sh"),
    ("openwrt-seeed-lora-root", "*/10 * * * *", "/etc/init.d/sysntpd restart"),
    ("openwrt-lede-root", "*/600 * * * *", "echo 1 > /proc/sys/vm/drop_caches"),
    ("openwrt-immortalwrt-root", "00 5 * * *", "sleep 5 && touch /etc/banner && reboot"),
])
def test_openwrt_shipped_crontabs_import_as_busybox_crond_runs_them(name, expression, command):
    """Router crontabs (no user field): each job keeps its schedule and command; a commented job
    is reported, not imported; a comment above a job becomes its description."""
    result = _parse(name)
    [(task, trigger)] = _jobs(result)
    assert trigger["spec"]["expression"] == " ".join(expression.split())
    assert task["command"] == ["/bin/sh", "-c", command]
    if name == "openwrt-teleofis-root":
        assert any("commented out" in n and "reboot" in n for n in result.notes)
    if name == "openwrt-lede-root":
        assert task["description"] == "每60分钟清空缓存"


def test_the_hand_written_crontab_follows_every_rule(tmp_path):
    """Environment below its line, quotes keeping blanks, MAILTO reported, CRON_TZ for the lines
    below, comments as descriptions, names and ranges in fields, and '%' as standard input run
    through a real shell: what the job reads must be byte for byte what cron would feed it."""
    result = _parse("every-rule.crontab")
    jobs = _jobs(result)
    assert len(jobs) == 5
    report, _ = jobs[0]
    assert report["description"] == "nightly report, mailed before"
    assert report["env"]["GREETING"] == {"value": "  two spaces kept  "}
    assert report["env"]["PATH"] == {"value": "/usr/local/bin:/usr/bin:/bin"}
    assert "MAILTO" not in report["env"] and any("MAILTO" in n for n in result.notes)
    zones = [t["spec"]["timezone"] for _, t in jobs]
    assert zones == ["Europe/Berlin", "Europe/Berlin", "Asia/Shanghai", "Asia/Shanghai", "Asia/Shanghai"]
    assert jobs[1][1]["spec"]["expression"] == "@hourly"
    assert jobs[4][1]["spec"]["expression"] == "*/15 9-17 1,15 jan,jul *"
    assert any("commented-out-job" in n for n in result.notes)
    env = {"PATH": os.environ["PATH"]}
    for (task, _), expected in ((jobs[2], "Dear Joe,\n\n100% done\n"), (jobs[3], None)):
        out = tmp_path / "out.txt"
        subprocess.run(task["command"], env={**env, "OUT": str(out)}, check=True, timeout=30,
                       stdin=subprocess.DEVNULL)
        if expected is not None:
            assert out.read_text() == expected
        else:  # `date +\%Y-\%m-\%d`: the escapes are literal percents in the command
            assert len(out.read_text().strip()) == 10 and out.read_text().count("-") == 2


@pytest.mark.parametrize("raw, command, stdin", [
    ("echo a", "echo a", None),
    ("echo 100\\%", "echo 100%", None),
    ("echo a\\\\b", "echo a\\b", None),
    ("cat%line1%line2", "cat", "line1\nline2\n"),
    ("cat%", "cat", ""),
    ("cat%x\\%y\\z%", "cat", "x%y\\z\n"),
    ("cat%a\\", "cat", "a\\\n"),
])
def test_percent_splits_command_and_input_as_debian_cron_does(raw, command, stdin):
    """The state machine of Debian cron's do_command.c: a wrong reading runs a truncated command
    or feeds the job other input than cron did."""
    assert split_percent(raw) == (command, stdin)


def test_reboot_is_refused_naming_the_line_while_no_plugin_offers_at_start():
    """``@reboot`` has no cron expression: importing it as anything else would run the job at
    the wrong times (or never); until a plugin offers ``at_start`` it is refused by line."""
    text = "# start the tunnel\n@reboot /usr/bin/autossh -f tunnel\n"
    with pytest.raises(UserError) as refused:
        parse_crontab(text, "root.crontab", project_id="c", providers=PROVIDERS, timezone="UTC")
    assert str(refused.value).startswith("root.crontab:2: @reboot: the trigger kind 'at_start' is not available")


@pytest.mark.parametrize("text, where", [
    ("61 * * * * /bin/true\n", "tab:1: '61 * * * *'"),
    ("* * * * /bin/true\n", "tab:1: expected five time fields"),
    ("@every /bin/true\n", "tab:1: @every: not a schedule"),
    ("CRON_TZ=Mars/Olympus\n* * * * * /bin/true\n", "tab:1: CRON_TZ"),
    ("1BAD=x\n", "tab:1: 1BAD"),
])
def test_a_line_cron_would_not_run_is_refused_naming_it(text, where):
    """A crontab mistake must name its line; importing a job with another schedule than cron
    would have given it silently changes when it runs."""
    with pytest.raises(UserError, match=where.replace("*", r"\*")):
        parse_crontab(text, "tab", project_id="c", providers=PROVIDERS, timezone="UTC")


def test_importing_the_same_crontab_twice_changes_nothing(cli):
    """Task ids come from the line's meaning, so a second import is all unchanged (a new id per
    import would duplicate every job)."""
    path = FIXTURES / "every-rule.crontab"
    first = cli("import", "crontab", str(path), "--timezone", "UTC")
    assert first.returncode == 0, first.stderr
    assert "note: line 3: MAILTO is read by cron only" in first.stdout
    assert first.stdout.splitlines()[-1].startswith("applied: 11 created")
    second = cli("import", "crontab", str(path), "--timezone", "UTC")
    assert second.returncode == 0 and second.stdout.splitlines()[-1] == "nothing to change: the store already matches"
    emitted = cli("import", "crontab", str(path), "--timezone", "UTC", "--emit")
    assert 'GREETING = "env:GREETING"' in emitted.stdout and "two spaces" not in emitted.stdout
    (cli.cwd / "emitted.toml").write_text(emitted.stdout)
    applied = cli("apply", "emitted.toml", "--allow-inline-env", extra_env={"GREETING": "  two spaces kept  "})
    assert applied.returncode == 0 and "nothing to change" in applied.stdout, applied.stdout + applied.stderr


def test_reboot_maps_to_the_built_in_at_start_kind(cli, tmp_path):
    """``@reboot`` jobs of a router's crontab must move in as a trigger that runs at each start
    of the scheduler (the built-in ``at_start`` kind), not be refused or run on a clock."""
    import json

    (tmp_path / "root.crontab").write_text("# the tunnel\n@reboot /usr/bin/autossh -f tunnel\n")
    settings = tmp_path / "settings.toml"
    settings.write_text(f'[backend]\npath = "{tmp_path / "q.db"}"\n')
    result = cli("--settings", str(settings), "import", "crontab", str(tmp_path / "root.crontab"),
                 "--timezone", "UTC", "--json")
    assert result.returncode == 0, result.stderr
    listed = cli("--settings", str(settings), "trigger", "list", "--json")
    [trigger] = json.loads(listed.stdout)
    assert trigger["kind"] == "at_start" and trigger["spec"] == {}
