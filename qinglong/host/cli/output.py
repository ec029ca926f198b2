"""What commands print: times, tables, JSON; and a standard output whose reader went away."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from qinglong.contracts.errors import ExitCode


def now_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def iso(ms: int | None) -> str:
    """Epoch milliseconds as ISO 8601 UTC; ``-`` for none, ``never`` for the far-future sentinel."""
    if ms is None:
        return "-"
    if ms >= 2**62:
        return "never"
    # integer arithmetic: ms / 1000 as a float is off by a microsecond near year 9999 (.999 read .998)
    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print ``rows`` under ``headers`` in left-aligned columns."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def yes_no(flag: bool) -> str:
    """A flag as ``yes`` or ``no``."""
    return "yes" if flag else "no"


def stdout_reader_gone() -> bool:
    """True when standard output is a pipe or socket whose reader has closed it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True  # no poll() here, or stdout already closed: the pipe error was stdout's


def drop_stdout() -> ExitCode:
    """After a broken pipe on standard output: discard the rest of the output; the exit code to return."""
    # As the CPython documentation recommends (signal module, "Note on SIGPIPE"): point stdout at
    # devnull so the interpreter's final flush does not fail again, and exit like a shell
    # reports a process ended by SIGPIPE.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return ExitCode.BROKEN_PIPE


_DURATION_UNITS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000}


def format_duration_ms(ms: int | None) -> str:
    """Milliseconds in the largest unit that divides them (``30m``, ``1500ms``); ``-`` for none."""
    if ms is None:
        return "-"
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _DURATION_UNITS[unit] == 0:
            return f"{ms // _DURATION_UNITS[unit]}{unit}"
    return f"{ms}ms"


def format_size(n: int | None) -> str:
    """Bytes in the largest binary unit that divides them (``4MiB``, ``1000``); ``-`` for none."""
    if n is None:
        return "-"
    for unit, factor in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)
