"""Shared pieces of the command parsers: adding a command, ``--json``, bounded counts, command words."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from qinglong.contracts.cli import number_and_unit as _number_and_unit
from qinglong.contracts.cli import parse_duration_ms
from qinglong.contracts.errors import quoted


def _max_listing() -> int:
    """Upper bound of ``--limit`` and ``--count``: the readers' own bound, so a listing the CLI
    accepts is never cut short behind the user's back. Imported when a count is parsed: a
    command that parses none (``qinglong worker``) does not load the store's contracts."""
    from qinglong.contracts.store import MAX_LISTING_ROWS

    return MAX_LISTING_ROWS


def positive_count(text: str) -> int:
    """An argparse type: a whole number from 1 to :func:`_max_listing` (a usage error otherwise)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {quoted(text)}") from None
    bound = _max_listing()
    if not 1 <= value <= bound:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to {bound}, got {value}")
    return value


def seconds_up_to(maximum: int) -> Any:
    """An argparse type: a finite number of seconds from 0 to ``maximum`` (a usage error
    otherwise: ``nan``, ``inf`` and ``-1`` are not a time to run for; 0 starts, checks and stops)."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, got {quoted(text)}") from None
        if not 0 <= value <= maximum:  # false for nan too
            raise argparse.ArgumentTypeError(
                f"expected from 0 to {maximum:,} seconds, got {quoted(text)}")
        return value

    return seconds


def command_words(head: Sequence[str]) -> list[str]:
    """The words of the command line that are not options or values of the global options."""
    return [a for i, a in enumerate(head)
            if not a.startswith("-") and not (i and head[i - 1] in ("--settings", "--profile", "--payload", "--api",
                                                         "--token-file"))]


def add_command(sub: Any, common: argparse.ArgumentParser, name: str, help_text: str, func: Any,
                **kw: Any) -> argparse.ArgumentParser:
    """Add command ``name`` (with the common options) to ``sub``; it runs ``func(args)``."""
    p = sub.add_parser(name, parents=[common], help=help_text, description=help_text, **kw)
    p.set_defaults(func=func)
    return p


def add_json_flag(p: argparse.ArgumentParser) -> None:
    """The ``--json`` option of a command that can print JSON."""
    p.add_argument("--json", action="store_true", help="print JSON")


def split_command_argv(arguments: list[str]) -> tuple[list[str], list[str] | None]:
    """For ``task put``: the words after the first ``--`` are the command, whatever they look like.

    argparse alone cannot do this once options stand between the positionals and ``--`` (its
    ``nargs='*'`` positional is matched empty too early), so the command is split off first.
    """
    if "--" not in arguments:
        return arguments, None
    cut = arguments.index("--")
    head = arguments[:cut]
    if command_words(head)[:2] != ["task", "put"]:
        return arguments, None
    return head, arguments[cut + 1:]


_SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3,
               "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3}




def parse_size_bytes(flag: str, text: str) -> int:
    """``512``, ``64KiB``, ``4MiB`` (also ``kB``, ``MB``, ``GiB``) as bytes; a UserError naming ``flag`` otherwise."""
    from qinglong.contracts.errors import UserError

    parsed = _number_and_unit(text.strip())
    if parsed is None or parsed[1].lower() not in _SIZE_UNITS:
        raise UserError(f"{flag}: expected a size such as 512, 64KiB or 4MiB, got {quoted(text)}")
    return parsed[0] * _SIZE_UNITS[parsed[1].lower()]

