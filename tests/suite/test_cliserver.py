"""The suite's forked ``qinglong`` (tests/support/cliserver.py) answers as a fresh interpreter does.

Most CLI tests run commands through it; if a forked command saw the server's environment, path or
streams instead of its own, those tests would check a command no user can run: a settings key
ignored, a plugin missing, an exit code or a message that differs from the real ``qinglong``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cliserver import _get_server, run_qinglong

REPO = Path(__file__).resolve().parents[2]

PLUGIN = '''
from qinglong.contracts.cli import CliCommand
from qinglong.contracts.hookspecs import hookimpl


def hello(context):
    import os, sys
    print("hello", os.environ.get("GREETING"), sys.stdin.read().strip())
    return 7


@hookimpl
def qinglong_cli_commands():
    return [CliCommand(name="hello", help="say hello", handler=hello)]
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _exec(args: list[str], cwd: Path, env: dict[str, str], input: str | None = None):
    return subprocess.run([sys.executable, "-m", "qinglong", *args], cwd=cwd, env=env, input=input,
                          capture_output=True, text=True, timeout=120,
                          stdin=None if input is not None else subprocess.DEVNULL)


@pytest.mark.parametrize("args", [
    ["--help"], ["nosuch"], ["db", "migrate"], ["runs", "--json"], ["task", "show", "p", "t"],
    ["config", "show"], ["cron", "next", "*/5 * * * *", "--after", "2024-01-01T00:00:00Z", "--count", "2"],
])
def test_a_forked_command_answers_exactly_as_a_fresh_interpreter(tmp_path, args):
    env = _env(QINGLONG_SCHEDULER__PAGE_SIZE="64")
    assert _get_server().can_serve(sys.executable, env)
    forked = run_qinglong(args, cwd=tmp_path, env=env, timeout=120)
    fresh = _exec(args, tmp_path, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_command_has_its_own_environment_path_and_stdin(tmp_path):
    """A plugin found only through the command's PYTHONPATH, a variable only in its environment and
    its own stdin: the server, started without them, must not answer in their place."""
    site = tmp_path / "site"
    (site / "hello_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "hello_plugin.py").write_text(PLUGIN)
    (site / "hello_plugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hello-plugin\nVersion: 1.0\n")
    (site / "hello_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[qinglong.plugins]\nhello = hello_plugin\n")
    (tmp_path / "s.toml").write_text('[plugins]\nenable = ["hello"]\n')
    env = _env(PYTHONPATH=f"{site}{os.pathsep}{REPO}", GREETING="from-the-command")
    assert _get_server().can_serve(sys.executable, env)
    args = ["--settings", "s.toml", "hello"]
    forked = run_qinglong(args, cwd=tmp_path, env=env, timeout=120, input="from-stdin\n")
    fresh = _exec(args, tmp_path, env, input="from-stdin\n")
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 7 and forked.stdout == "hello from-the-command from-stdin\n"
    # and the next command, without them, sees neither
    bare = run_qinglong(args, cwd=tmp_path, env=_env(), timeout=120)
    assert bare.returncode != 0 and "hello" in bare.stderr and "from-the-command" not in bare.stdout


def test_a_command_past_its_timeout_is_killed_and_its_lock_freed(tmp_path):
    """``run`` never ends by itself: the caller's bound must kill it, or every later test of the
    same file would wait on its lock."""
    env = _env()
    assert run_qinglong(["db", "migrate"], cwd=tmp_path, env=env, timeout=120).returncode == 0
    with pytest.raises(subprocess.TimeoutExpired):
        run_qinglong(["run"], cwd=tmp_path, env=env, timeout=3)
    done = run_qinglong(["run", "--for-seconds", "0.1"], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_interpreter_setting_the_server_lacks_runs_a_fresh_interpreter(tmp_path):
    env = _env(PYTHONWARNINGS="error")
    assert not _get_server().can_serve(sys.executable, env)
    assert not _get_server().can_serve("/usr/bin/python3", _env())
    done = run_qinglong(["--version"], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0 and done.args[0] == sys.executable
