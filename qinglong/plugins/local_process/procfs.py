"""What ``/proc`` says about a process: enough to tell our process from a later one reusing its pid.

A pid is reused after its process is gone; the pair (boot id, start time in clock ticks since
boot) is not. A pid also names its process group while any member lives, so the group of a dead
leader cannot be taken over by a new process before the last member is gone.
"""

from __future__ import annotations

from qinglong.contracts.frozen import record


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This boot's id (changes at every boot)."""
    with open(BOOT_ID_PATH, encoding="ascii") as f:
        return f.read().strip()


@record
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` we use."""

    pid: int
    state: str  # R, S, D, Z (zombie), ...
    pgrp: int
    session: int
    start_ticks: int  # field 22: start time after boot, clock ticks


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat`` parsed, or None if no such process. The command name (field 2, in
    parentheses) may itself hold spaces and parentheses: fields are read after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = raw[raw.rindex(b")") + 2:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3]
    return ProcStat(pid, rest[0].decode("ascii"), int(rest[2]), int(rest[3]), int(rest[19]))


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group ``pgid``."""
    import os

    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = read_stat(int(name))
        except (OSError, ValueError, IndexError):
            continue
        if stat is not None and stat.pgrp == pgid and stat.state != "Z":
            members.append(stat.pid)
    return members


@record
class Holder:
    """A process with a file open for writing."""

    pid: int
    name: str  # /proc/<pid>/comm
    pgrp: int
    session: int


def writers_of(path: str) -> list[Holder]:
    """The live processes holding ``path`` open for writing (through /proc/<pid>/fd; only those
    whose descriptors we may read: our own user's, or all as root)."""
    import os

    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") != path:
                    continue
                with open(f"/proc/{name}/fdinfo/{fd}", "rb") as f:
                    flags = next((int(line.split()[1], 8) for line in f if line.startswith(b"flags:")), 0)
            except (OSError, ValueError, IndexError):
                continue
            if flags & 0o3 == 0:  # O_RDONLY: a reader, not a writer
                continue
            try:
                stat = read_stat(int(name))
                with open(f"/proc/{name}/comm", "rb") as f:
                    comm = f.read().decode("utf-8", "replace").strip()
            except (OSError, ValueError, IndexError):
                break
            if stat is not None and stat.state != "Z":
                found.append(Holder(stat.pid, comm, stat.pgrp, stat.session))
            break
    return found
