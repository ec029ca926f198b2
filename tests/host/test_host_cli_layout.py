"""The command line's layout: each command group's module registers its own commands, and a command
loads only its own group's module."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from qinglong.host.cli.main import COMMAND_GROUPS, build_parser, command_groups_for


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


@pytest.mark.parametrize("group,commands", COMMAND_GROUPS)
def test_each_command_group_registers_exactly_the_commands_routed_to_it(group, commands):
    """A command routed to a group that does not register it would be refused as an unknown choice."""
    assert _commands(build_parser(groups=[group])) == list(commands)
    for command in commands:
        assert command_groups_for([command]) == [group]
        assert command_groups_for(["--profile", "edge", command, "--json"]) == [group]


def test_help_and_unknown_commands_load_every_group_in_help_order():
    """``qinglong -h runs`` or a mistyped command must still list every command, in the usual order."""
    everything = [command for _, commands in COMMAND_GROUPS for command in commands]
    assert _commands(build_parser()) == everything
    for head in (["-h", "runs"], ["runs", "--help"], ["rusn"], [], ["--settings", "runs"]):
        assert _commands(build_parser(groups=command_groups_for(head))) == everything


def test_a_read_command_imports_no_other_command_module(tmp_path):
    """``qinglong runs`` must not pay for the modules of run, publish or the other commands."""
    code = ("import json, sys\nfrom qinglong.host.cli import main\n"
            "code = main(['runs', '--settings', sys.argv[1]])\n"
            "print(json.dumps([code, sorted(m for m in sys.modules if m.startswith('qinglong.host.cli'))]))")
    settings = tmp_path / "s.toml"
    settings.write_text(f'[backend]\npath = "{tmp_path / "absent.db"}"\n')
    out = subprocess.run([sys.executable, "-c", code, str(settings)], capture_output=True, text=True,
                         cwd=tmp_path, check=True, timeout=120)
    code, modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert code == 3  # the database does not exist: a read command names it and creates nothing
    assert modules == ["qinglong.host.cli", "qinglong.host.cli.boot", "qinglong.host.cli.main",
                       "qinglong.host.cli.output", "qinglong.host.cli.parsing", "qinglong.host.cli.runs"]
    assert not (tmp_path / "absent.db").exists()
