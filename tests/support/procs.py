"""What tests read from /proc about job processes, and how they wait for a condition, written once
for every test package (kept apart from the executor's own procfs reading, so a test does not share
the code it checks)."""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def _stat_fields(pid: int | str) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is not None and fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def wait_until(condition: Callable[[], T], what: str, *, timeout: float, interval: float = 0.05,
               gone: Callable[[], str | None] | None = None) -> T:
    """Poll ``condition`` until it returns something truthy, and return that. The bound only
    catches a hang: a slow machine makes a test slower, never failing. ``gone``, when given, says
    why the condition can no longer come (the child it waits on exited, with what it printed), or
    None while it still can: then the wait fails at once with that text instead of at the bound."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        reason = gone() if gone is not None else None
        if reason is not None:
            raise AssertionError(f"{reason} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(interval)
