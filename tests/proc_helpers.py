"""What tests read from /proc about job processes, written once for every test package (kept apart
from the executor's own procfs reading, so a test does not share the code it checks)."""

from __future__ import annotations

import os


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
