"""Commands plugins add to the command line (hook ``qinglong_cli_commands``).

Imported only when the command line names a command the host does not know itself, or asks for
the top-level ``--help``: then the settings are read, the profile's and the enabled plugins are loaded (as every
command loads them, without creating a backend), and each declared command becomes a parser like
the host's own. A command named like a host command, or like another plugin's, is refused naming
both.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

from qinglong.contracts.frozen import record
from qinglong.contracts.cli import CliArgument, CliCommand, CliContext
from qinglong.contracts.errors import PluginLoadError, quoted
from qinglong.contracts.hookspecs import plugin_settings

from .output import iso, now_ms, print_json, print_table


@record(slots=False)
class PluginCommands:
    """The commands the loaded plugins declared, by name, with the plugin each came from."""

    commands: Mapping[str, tuple[str, CliCommand]]
    settings: Any

    def register(self, sub: Any, common: argparse.ArgumentParser) -> None:
        """Add every plugin command to the ``qinglong`` subcommands, in name order."""
        for name in sorted(self.commands):
            plugin_name, command = self.commands[name]
            _add(sub, common, command, (command.name,), plugin_name, self.settings)


def _global_options(head: Sequence[str]) -> argparse.Namespace:
    """``--settings`` and ``--profile`` wherever they stand on the command line."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--settings", default=None)
    pre.add_argument("--profile", default=None)
    known, _ = pre.parse_known_args(list(head))
    return known


def load_plugin_commands(head: Sequence[str], host_commands: Iterable[str]) -> PluginCommands:
    """Read the settings the command line names, load their plugins and collect their commands."""
    from ..plugins import PluginHost
    from ..settings import load_settings

    options = _global_options(head)
    loaded = load_settings(options.settings, profile=options.profile)
    host = PluginHost()
    host.load(loaded.profile.plugins, required_by=f"the {loaded.profile.name} profile")
    host.load(loaded.settings.plugins.enable, required_by=loaded.origin(("plugins", "enable")))
    return PluginCommands(host.cli_commands(reserved=host_commands), loaded.settings)


def _usage_type(argument: CliArgument) -> Any:
    """The argument's ``type``, with a ``ValueError`` shown as the usage error it is (exit 2)."""
    convert = argument.type

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"invalid value {quoted(text)}") from None

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def _add(sub: Any, common: argparse.ArgumentParser, command: CliCommand, words: tuple[str, ...],
         plugin_name: str, settings: Any) -> None:
    parser = sub.add_parser(command.name, parents=[common], help=command.help,
                            description=command.description or command.help)
    for argument in command.arguments:
        options: dict[str, Any] = {"help": argument.help}
        if argument.switch:
            options["action"] = "store_true"
        else:
            if argument.metavar:
                options["metavar"] = argument.metavar
            if argument.type is not None:
                options["type"] = _usage_type(argument)
            if argument.is_option:
                options["default"] = argument.default
        if argument.is_option:
            parser.add_argument(argument.name, dest=argument.dest, **options)
        else:
            parser.add_argument(argument.dest, **options)
    if command.subcommands:
        inner = parser.add_subparsers(dest="_".join(("", *words, "command")), metavar="SUBCOMMAND",
                                      required=True)
        for subcommand in command.subcommands:
            _add(inner, common, subcommand, (*words, subcommand.name), plugin_name, settings)
        parser.set_defaults(func=None)
    else:
        parser.set_defaults(func=functools.partial(_run, command, words, plugin_name, settings))


def _run(command: CliCommand, words: tuple[str, ...], plugin_name: str, settings: Any,
         args: argparse.Namespace) -> int:
    """Call the handler with its context; an ``async def`` handler runs on a fresh event loop."""
    context = CliContext(
        command=words,
        arguments=MappingProxyType({argument.dest: getattr(args, argument.dest) for argument in command.arguments}),
        plugin_settings=plugin_settings(settings, plugin_name),
        print_table=print_table,
        print_json=print_json,
        utc=iso,
        now_ms=now_ms,
    )
    result = command.handler(context)
    if inspect.isawaitable(result):
        async def completed() -> Any:
            return await result

        result = asyncio.run(completed())
    if result is None:
        return 0
    if isinstance(result, bool) or not isinstance(result, int):
        raise PluginLoadError(f'plugin "{plugin_name}": command {" ".join(words)!r} returned {result!r}, '
                              "not an exit code (an int, or None for 0)")
    return result
