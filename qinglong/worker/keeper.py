"""The fence keeper: a small process beside each worker that stops the worker's jobs when the
worker itself cannot.

The worker's own watchdog stops its jobs before its session lease can expire, but a worker that is
killed -9 (an OOM kill) or frozen (SIGSTOP, a stuck VM) runs no watchdog, while its jobs, detached
in their own process groups, run on; once its lease expired in the store another worker would run
the same Run beside them. The keeper is the backstop. It runs in its own session (a signal to the
worker or its process group does not reach it), reads one line per order from the worker on its
stdin, and:

* ``deadline GEN TERM_AT KILL_AT``: the self-fence schedule of session generation GEN (monotonic
  seconds; CLOCK_MONOTONIC is the machine's, so the worker's instants are the keeper's), renewed
  after each successful heartbeat;
* ``job GEN PGID PID START_TICKS``: guard a job's process group under GEN's schedule;
* ``done PGID``: the job ended, guard it no longer;
* ``exit``: the worker stops in order (every job is gone): exit without signalling anything;
* end of input (the worker died, whatever killed it): TERM every guarded group now, KILL after
  the grace (or at the schedule's KILL point if that is sooner), then exit.

At a schedule's TERM point every group of that generation gets TERM, at its KILL point KILL,
whatever the worker does meanwhile. A group is signalled only while it is still the job's: its
leader has the start time the worker registered, or is gone while members remain (a group id is
not reused while a member lives).

Standard library only, run as a script (``python -I -S keeper.py GRACE_S``): it costs a few MB.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

#: How often the keeper looks again while a KILLed group is not gone yet, seconds.
TICK_S = 0.05
#: The longest it sleeps with nothing due (a new order wakes it at once).
IDLE_S = 1.0


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rindex(b")") + 2:].split()


def _members(pgid: int) -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and fields[0] != b"Z" and int(fields[2]) == pgid:
                return True
    return False


def ours(pgid: int, pid: int, start_ticks: int) -> bool:
    """Whether group ``pgid`` is still the registered job's (see the module docstring)."""
    fields = _stat(pid)
    if fields is not None:
        return int(fields[19]) == start_ticks and int(fields[2]) == pgid
    return _members(pgid)


class Keeper:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.deadlines: dict[int, tuple[float, float]] = {}
        #: pgid -> [generation, pid, start_ticks, term_sent, kill_sent]
        self.jobs: dict[int, list] = {}
        self.orphaned_at: float | None = None

    def order(self, line: str) -> bool:
        """Apply one line; False at ``exit``."""
        words = line.split()
        if not words:
            return True
        try:
            if words[0] == "deadline":
                self.deadlines[int(words[1])] = (float(words[2]), float(words[3]))
            elif words[0] == "job":
                self.jobs[int(words[2])] = [int(words[1]), int(words[3]), int(words[4]), False, False]
            elif words[0] == "done":
                self.jobs.pop(int(words[1]), None)
            elif words[0] == "exit":
                return False
        except (IndexError, ValueError):
            pass  # a malformed order is ignored; the worker writes only these
        return True

    def enforce(self, now: float) -> None:
        for pgid, job in list(self.jobs.items()):
            generation, pid, start_ticks, term_sent, kill_sent = job
            term_at, kill_at = self.deadlines.get(generation, (now, now + self.grace_s))
            if self.orphaned_at is not None:
                term_at = min(term_at, self.orphaned_at)
                kill_at = min(kill_at, self.orphaned_at + self.grace_s)
            if not term_sent and now >= term_at:
                job[3] = True
                if not self._send(pgid, pid, start_ticks, signal.SIGTERM):
                    continue
            if not kill_sent and now >= kill_at:
                job[4] = True
                if not self._send(pgid, pid, start_ticks, signal.SIGKILL):
                    continue
            if job[4] and not _members(pgid):
                del self.jobs[pgid]

    def next_wake(self, now: float) -> float:
        """Seconds until the next TERM or KILL point of a guarded group (at most :data:`IDLE_S`)."""
        delay = IDLE_S
        for pgid, (generation, _pid, _ticks, term_sent, kill_sent) in self.jobs.items():
            if kill_sent:
                return TICK_S  # waiting for the group to be gone
            term_at, kill_at = self.deadlines.get(generation, (now, now))
            delay = min(delay, (kill_at if term_sent else term_at) - now)
        return max(0.0, delay)

    def _send(self, pgid: int, pid: int, start_ticks: int, signum: int) -> bool:
        """Signal the group if it is still the job's; otherwise forget the job (it ended, and a
        job that ended on the TERM is gone by its KILL point). False when it was forgotten."""
        if not ours(pgid, pid, start_ticks):
            del self.jobs[pgid]
            return False
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        return True


def main(argv: list[str]) -> int:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)
    keeper = Keeper(float(argv[1]) if len(argv) > 1 else 10.0)
    fd = sys.stdin.fileno()
    buffer = b""
    while True:
        if keeper.orphaned_at is None:
            ready, _, _ = select.select([fd], [], [], keeper.next_wake(time.monotonic()))
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    keeper.orphaned_at = time.monotonic()
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not keeper.order(line.decode("ascii", "replace")):
                        return 0
        else:
            if not keeper.jobs:
                return 0
            time.sleep(TICK_S)
        keeper.enforce(time.monotonic())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
