"""Commands a plugin adds to the ``qinglong`` command line (hook ``qinglong_cli_commands``).

A plugin declares a command as data, and the host builds its parser, so every command parses,
prints its help and reports errors the same way::

    from qinglong.contracts.cli import CliArgument, CliCommand

    def show(context):
        context.print_table(["kind", "example"], [["tick", "every 2s"]])
        return 0

    CliCommand(name="tick", help="tick trigger helpers", subcommands=(
        CliCommand(name="show", help="show an example", handler=show,
                   arguments=(CliArgument("--count", "how many", type=int, default=1),)),
    ))

The host loads plugin commands only when the command line names a command it does not know
itself, or asks for the top-level ``qinglong --help``; ``qinglong run`` never pays for them. A command whose name is a
command of the host, or of another loaded plugin, is refused naming both.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

from .frozen import record

#: A command's name: lower-case words joined by single dashes (``cron``, ``show-config``).
COMMAND_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
#: An option's flag: ``--`` and such a name.
OPTION_FLAG = re.compile(r"^--[a-z][a-z0-9]*(-[a-z0-9]+)*$")
#: A positional argument's name: a Python identifier in lower case.
POSITIONAL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@record(slots=False)
class CliArgument:
    """One argument of a plugin command.

    ``name`` is either an option flag (``--count``) or a positional name (``expression``); the
    handler finds the value under :attr:`dest` (``--grace-period`` -> ``grace_period``). A
    ``switch`` is an option without a value (``--json``), False unless given. ``type`` turns the
    text into a value; raising ``ValueError`` there is a usage error (exit 2) whose message the
    operator sees. An option not given is ``default``; a positional is required.
    """

    name: str
    help: str
    metavar: str | None = None
    default: Any = None
    type: Callable[[str], Any] | None = None
    switch: bool = False

    @property
    def is_option(self) -> bool:
        """True for ``--flag`` arguments, False for positionals."""
        return self.name.startswith("-")

    @property
    def dest(self) -> str:
        """The key of this argument's value in :attr:`CliContext.arguments`."""
        return self.name.lstrip("-").replace("-", "_")


@record(slots=False)
class CliCommand:
    """A command (``cron``) or, with ``subcommands``, a group of commands (``cron next``).

    ``help`` is the one line ``qinglong --help`` lists; ``description`` (default: ``help``) heads
    the command's own ``--help``. A command with a ``handler`` runs it; a group has
    ``subcommands`` and no handler (one of them must be named). The handler receives a
    :class:`CliContext` and returns an exit code (None is 0); an ``async def`` handler is run on a
    fresh event loop. Raise the errors of :mod:`qinglong.contracts.errors` (``UserError`` and its
    kin): the CLI prints them as one paragraph with their documented exit code, like its own.
    """

    name: str
    help: str
    handler: Callable[["CliContext"], Any] | None = None
    arguments: tuple[CliArgument, ...] = ()
    subcommands: tuple["CliCommand", ...] = ()
    description: str = ""

    def problems(self) -> list[str]:
        """What is wrong with this declaration (empty when it can be added to the parser)."""
        found: list[str] = []
        if not isinstance(self.name, str) or not COMMAND_NAME.match(self.name):
            found.append(f"command name {self.name!r} is not lower-case words joined by dashes")
        if (self.handler is None) == (not self.subcommands):
            found.append(f"command {self.name!r} needs either a handler or subcommands, not both or neither")
        if self.handler is not None and not callable(self.handler):
            found.append(f"the handler of command {self.name!r} is not callable")
        dests: set[str] = set()
        for argument in self.arguments:
            if not isinstance(argument, CliArgument):
                found.append(f"command {self.name!r} has argument {argument!r}, which is not a CliArgument")
                continue
            pattern = OPTION_FLAG if argument.is_option else POSITIONAL_NAME
            if not pattern.match(argument.name):
                found.append(f"command {self.name!r} has argument {argument.name!r}; options are long "
                             "flags such as '--count', positionals lower-case names such as 'expression'")
            elif argument.name in ("--help", "--settings", "--profile"):
                found.append(f"command {self.name!r} declares {argument.name}, an option of every command")
            elif argument.dest in dests:
                found.append(f"command {self.name!r} declares {argument.dest!r} twice")
            if argument.switch and not argument.is_option:
                found.append(f"command {self.name!r}: positional {argument.name!r} cannot be a switch")
            dests.add(argument.dest)
        names: set[str] = set()
        for sub in self.subcommands:
            if not isinstance(sub, CliCommand):
                found.append(f"command {self.name!r} has subcommand {sub!r}, which is not a CliCommand")
                continue
            if sub.name in names:
                found.append(f"command {self.name!r} has two subcommands named {sub.name!r}")
            names.add(sub.name)
            found.extend(sub.problems())
        return found


_DURATION_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: The longest duration any option or file may state (a hundred years): past it, a time before or
#: after "now" leaves the calendar and a store's 64-bit integers. Each use bounds it further.
MAX_DURATION_MS = 36_500 * 86_400_000


def whole_number(text: str, max_digits: int = 18) -> int | None:
    """``text`` as a whole number when it is 1 to ``max_digits`` ASCII digits, else None. The one
    reading of a number from outside (a command line, a query string, an address's port):
    ``str.isdigit`` is also true for ``²`` and ``٣``, and ``int`` refuses the first and 5,000 digits."""
    if not text or len(text) > max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def number_and_unit(text: str) -> tuple[int, str] | None:
    """``"30s"`` as ``(30, "s")``: leading digits (at most 15) and the rest, stripped; None
    without digits."""
    digits = len(text) - len(text.lstrip("0123456789"))
    if not digits or digits > 15:
        return None
    return int(text[:digits]), text[digits:].strip()


def parse_duration_ms(flag: str, text: str) -> int:
    """``500ms``, ``30s``, ``5m``, ``2h``, ``1d`` as milliseconds; a UserError naming ``flag``
    otherwise. The one reading of a duration on every command line and in apply files."""
    from .errors import UserError, quoted

    parsed = number_and_unit(text.strip())
    if parsed is None or parsed[1] not in _DURATION_UNITS:
        raise UserError(f"{flag}: expected a duration such as 500ms, 30s, 5m, 2h or 1d, got {quoted(text)}")
    value = parsed[0] * _DURATION_UNITS[parsed[1]]
    if value > MAX_DURATION_MS:
        raise UserError(f"{flag}: expected a duration of at most 36500d, got {quoted(text)}")
    return value


@record(slots=False)
class CliContext:
    """What a plugin command's handler receives: its arguments and the host's ways of printing.

    ``command`` is the command's words (``("cron", "next")``); ``arguments`` its parsed values by
    :attr:`CliArgument.dest`; ``plugin_settings`` the plugin's own ``[plugins.settings.<name>]``
    table. ``print_table`` and ``print_json`` print exactly as the host's listings do, ``utc``
    formats epoch ms as the host's ISO 8601 UTC (``-`` for None), and ``now_ms`` is the wall clock.
    The context holds no store: a plugin command works from its arguments, its settings table and
    its own code.
    """

    command: tuple[str, ...]
    arguments: Mapping[str, Any]
    plugin_settings: Mapping[str, Any]
    print_table: Callable[[Sequence[str], Sequence[Sequence[Any]]], None]
    print_json: Callable[[Any], None]
    utc: Callable[[int | None], str]
    now_ms: Callable[[], int]


__all__ = ["COMMAND_NAME", "CliArgument", "CliCommand", "CliContext", "MAX_DURATION_MS", "OPTION_FLAG",
           "POSITIONAL_NAME", "number_and_unit", "parse_duration_ms", "whole_number"]
