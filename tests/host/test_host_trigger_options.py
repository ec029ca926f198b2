"""Trigger kinds declare their own command-line options; the host knows no kind.

The interval example is a real distribution here: its source tree is on ``PYTHONPATH`` and a
``.dist-info`` registers its entry point, so the host finds it exactly as a pip-installed plugin.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from host_helpers import REPO

INTERVAL_SOURCE = REPO / "examples" / "interval-trigger"
HOST = REPO / "qinglong" / "host"


@pytest.fixture
def interval(site, tmp_path):
    """``(env, settings)``: the interval example installed next to Qinglong and enabled."""
    site.add_distribution("qinglong-interval-trigger", {}, {"interval": "qinglong_interval"})
    settings = tmp_path / "interval.toml"
    settings.write_text('[plugins]\nenable = ["interval"]\n')
    env = site.env()
    env["PYTHONPATH"] = f"{INTERVAL_SOURCE}:{env['PYTHONPATH']}"
    return env, str(settings)


def _ok(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _publish_task(cli, env, settings) -> None:
    _ok(cli("--settings", settings, "project", "create", "ops", env=env))
    _ok(cli("--settings", settings, "task", "put", "ops", "ping", "--command", "true", env=env))


def _spec(cli, env, settings, trigger_id: str) -> tuple[str, dict]:
    listed = json.loads(_ok(cli("--settings", settings, "trigger", "list", "--json", env=env)))
    head = next(t for t in listed if t["trigger_id"] == trigger_id)
    return head["kind"], head["spec"]


def test_hook_qinglong_trigger_cli_options_gives_the_interval_plugin_its_own_options(cli, interval):
    """Without the hook only ``--spec '{"every_ms": 30000}'`` could publish an interval: the host
    parsed cron options itself, and any other kind had to be written as JSON."""
    env, settings = interval
    _publish_task(cli, env, settings)
    _ok(cli("--settings", settings, "trigger", "add", "ops", "half-minute", "--task", "ping",
            "--kind", "interval", "--every", "30s", env=env))
    assert _spec(cli, env, settings, "half-minute") == ("interval", {"every_ms": 30000, "anchor_ms": 0})
    # The kind's own options imply the kind; an update changes only what it names.
    _ok(cli("--settings", settings, "trigger", "add", "ops", "five-minutes", "--task", "ping",
            "--every", "5m", "--anchor-ms", "1000", env=env))
    _ok(cli("--settings", settings, "trigger", "update", "ops", "five-minutes", "--every", "2h", env=env))
    assert _spec(cli, env, settings, "five-minutes") == ("interval", {"every_ms": 7_200_000, "anchor_ms": 1000})
    help_text = _ok(cli("--settings", settings, "trigger", "add", "--help", env=env))
    assert "options of trigger kind interval" in help_text and "--every DURATION" in help_text


def test_a_kind_option_given_to_another_kind_is_refused_naming_both(cli, interval):
    """``--kind interval --cron ...`` must not publish half of one kind and half of another."""
    env, settings = interval
    _publish_task(cli, env, settings)
    for args, expected in (
        (("--kind", "interval", "--cron", "* * * * *"),
         "--cron is not an option of trigger kind 'interval', which takes --every, --anchor-ms"),
        (("--every", "30s", "--cron", "* * * * *"),
         "--cron, --every belong to different trigger kinds (--cron (cron), --every (interval))"),
        (("--every", "soon"), "--every 'soon' is not a duration"),
        (("--every", "30s", "--spec", '{"every_ms": 30000}'), "give either --spec or --every, not both"),
        ((), "a new trigger needs a schedule: --after TASK [--on success|failure|any] (after); "
             "--cron EXPRESSION [--timezone ZONE] (cron); --hook-secret-env NAME (hook); "
             "--every DURATION [--anchor-ms MS] (interval); --kind KIND --spec JSON"),
    ):
        result = cli("--settings", settings, "trigger", "add", "ops", "x", "--task", "ping", *args, env=env)
        assert result.returncode == 3, (args, result.stderr)
        assert expected in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert json.loads(_ok(cli("--settings", settings, "trigger", "list", "--json", env=env))) == []


def test_spec_json_still_publishes_any_kind(cli, interval):
    """``--kind K --spec JSON`` is the form for kinds that declare no options; it must keep working."""
    env, settings = interval
    _publish_task(cli, env, settings)
    _ok(cli("--settings", settings, "trigger", "add", "ops", "json", "--task", "ping", "--kind", "interval",
            "--spec", '{"every_ms": 2000}', env=env))
    assert _spec(cli, env, settings, "json") == ("interval", {"every_ms": 2000, "anchor_ms": 0})


def test_cron_update_with_only_a_timezone_keeps_the_expression(cli):
    """The cron plugin's options behave as the host's did: ``--timezone`` alone moves the same
    expression to another zone, ``--cron`` alone keeps the stored zone."""
    _ok(cli("project", "create", "ops"))
    _ok(cli("task", "put", "ops", "ping", "--command", "true"))
    _ok(cli("trigger", "add", "ops", "nightly", "--task", "ping", "--cron", "0 2 * * *"))
    _ok(cli("trigger", "update", "ops", "nightly", "--timezone", "Europe/Berlin"))
    _ok(cli("trigger", "update", "ops", "nightly", "--cron", "0 3 * * *"))
    listed = json.loads(_ok(cli("trigger", "list", "--json")))
    assert listed[0]["kind"] == "cron"
    assert listed[0]["spec"] == {"expression": "0 3 * * *", "timezone": "Europe/Berlin"}


CLASHING = '''
from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.providers import TriggerCliOption, TriggerCliOptions


@hookimpl
def qinglong_trigger_cli_options():
    return [TriggerCliOptions(kind="tick", options=(TriggerCliOption("--task", "mine"),),
                              to_spec=lambda given, current: {})]
'''


def test_a_kind_option_that_shadows_a_command_option_is_refused_naming_the_plugin(cli, site, tmp_path):
    """A plugin declaring ``--task`` would silently take the task id of every new trigger."""
    site.add_distribution("acme-clash", {"acme_clash.py": CLASHING}, {"clash": "acme_clash"})
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["clash"]\n')
    result = cli("--settings", str(settings), "trigger", "add", "ops", "t", "--task", "x", env=site.env())
    assert result.returncode == 3
    assert ('plugin "clash" (acme-clash 0.1.0) declares option --task for trigger kind \'tick\', '
            "which is an option of the command itself") in result.stderr


#: Where the host may still name cron, and why (docs/plugins.md, "The host knows no kind"): only the
#: importers of other programs' schedules, which are cron by definition. ``cron next`` is the cron
#: plugin's command and the demo asks the providers for its spec.
CRON_ALLOWED: dict[tuple[str, str], str] = {
    ("cli/apply.py", "register"): "the help of 'qinglong import crontab' names crontab files",
    ("config/crontab.py", "import_crontab"): "a crontab from /etc/cron.d is a system crontab",
    ("config/crontab.py", "parse_crontab"): "each crontab line becomes a cron trigger",
    ("config/qinglong_v2.py", "import_qinglong_v2"): "the panel's schedules become cron triggers",
    ("config/systemd_timer.py", "calendar_to_cron"): "a timer's calendar becomes a cron expression",
    ("config/systemd_timer.py", "parse_timer"): "each OnCalendar= line becomes a cron trigger",
}
_CRON_WORD = re.compile(r"\bcron\b|^expression$|^timezone$", re.IGNORECASE)


def _literals_outside_allowed(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found: list[str] = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            docstring = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) else None
            name = function if isinstance(node, ast.Module) else (function or node.name)
            for child in ast.iter_child_nodes(node):
                if child is not docstring:
                    visit(child, name)
            return
        if function is None and isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            function = getattr(target, "id", None)  # a module-level constant is its own scope
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CRON_WORD.search(node.value):
            if (path.relative_to(HOST).as_posix(), function) not in CRON_ALLOWED:
                found.append(f"{path.relative_to(HOST)}:{node.lineno} in {function or 'module'}: {node.value!r}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def test_the_host_source_names_no_cron_specifics_outside_its_documented_exceptions():
    """The host parsed ``--cron`` into ``{"expression": ...}`` and defaulted kinds to cron: a second
    kind could only be second class, and a change to cron's spec meant a change to the host."""
    offending = [hit for path in sorted(HOST.rglob("*.py")) for hit in _literals_outside_allowed(path)]
    assert offending == []
    docs = (REPO / "docs" / "plugins.md").read_text()
    for (_, function), _reason in CRON_ALLOWED.items():
        assert f"`{function}`" in docs, f"docs/plugins.md does not document the exception {function}"


BUGGY_OPTIONS = '''
from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.providers import TriggerCliOption, TriggerCliOptions


def to_spec(given, current):
    return {"every_ms": given["missing"]}


@hookimpl
def qinglong_trigger_cli_options():
    return [TriggerCliOptions(kind="tick", options=(TriggerCliOption("--tick-every", "how often"),),
                              to_spec=to_spec)]
'''


def test_a_kind_whose_options_fail_to_make_a_spec_is_named_not_a_traceback(cli, site, tmp_path):
    """A plugin's bug while turning options into a spec must name the kind and write nothing."""
    site.add_distribution("acme-buggy", {"acme_buggy.py": BUGGY_OPTIONS}, {"buggy": "acme_buggy"})
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["buggy"]\n')
    env = site.env()
    _publish_task(cli, env, str(settings))
    result = cli("--settings", str(settings), "trigger", "add", "ops", "t", "--task", "ping",
                 "--tick-every", "3", env=env)
    assert result.returncode == 3, result.stderr
    assert ("the command-line options of trigger kind 'tick' could not make a spec (a bug in its plugin): "
            "KeyError: 'missing'") in result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads(_ok(cli("--settings", str(settings), "trigger", "list", "--json", env=env))) == []
