"""The self-fence: a worker's jobs are gone before its session lease can expire.

Three lines of defence, each able to act when the one before it cannot:

* the **watchdog** (:class:`SelfFence`, every :data:`WATCHDOG_S`): local timeouts (the
  deadline the store returned from ``started``, moved onto the monotonic clock), cancel signals
  with their grace, and the self-fence itself: at ``term_at`` with no successful heartbeat since,
  the session is abandoned, every job gets TERM and is forgotten, KILL follows at ``kill_at``,
  and by ``fenced_at`` none may remain (:func:`~qinglong.contracts.worker.fence_deadlines`). The
  next session is a new generation, which fences the old one's Attempts for good;
* the **fence keeper** (:mod:`.keeper`, a process of its own, driven through :class:`KeeperLink`):
  given each session's schedule after every successful heartbeat and each job's process group,
  it applies the schedule itself when the worker cannot (killed -9: at once; frozen: at the TERM
  and KILL points it was last given);
* the **executor's own fence** (:class:`~qinglong.contracts.execution.FencedExecutor`: the
  ``local_process`` wrapper kills its own group): given the KILL point at the spawn and after
  every heartbeat (:meth:`SelfFence.renewed`), the last line when worker and keeper are both killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Callable

from qinglong.contracts.execution import CancelReason, FencedExecutor, ProcessHandle
from qinglong.contracts.worker import FenceDeadlines, SessionFence

if TYPE_CHECKING:
    from .core import WorkerCore

#: The watchdog's period, seconds (signals and the self-fence land within it).
WATCHDOG_S = 0.1


class KeeperLink:
    """The worker's end of its fence keeper (:mod:`.keeper`): started at once, restarted (with
    every order resent) if it ever dies. Orders are a line each on a pipe; a write that cannot be
    made at once (a keeper that stopped reading) counts as a dead keeper."""

    def __init__(self, grace_s: float, report: Callable[[str], None]) -> None:
        self._grace_s = grace_s
        self._report = report
        self._proc: subprocess.Popen | None = None
        self._deadlines: dict[int, str] = {}
        self._jobs: dict[int, str] = {}

    def start(self) -> None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keeper.py")
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", path, f"{self._grace_s:.3f}"],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except OSError as exc:
            self._proc = None
            self._report(f"the fence keeper could not be started: {exc}")
            return
        assert self._proc.stdin is not None
        os.set_blocking(self._proc.stdin.fileno(), False)
        for line in [*self._deadlines.values(), *self._jobs.values()]:
            if not self._write(line):
                return

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _write(self, line: str) -> bool:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        try:
            os.write(proc.stdin.fileno(), (line + "\n").encode("ascii"))
            return True
        except OSError:
            return False

    def _send(self, line: str) -> None:
        if self._write(line):
            return
        self._report("the fence keeper stopped taking orders; starting it again")
        self._stop_process()
        self.start()

    def deadline(self, generation: int, d: FenceDeadlines) -> None:
        line = f"deadline {generation} {d.term_at:.6f} {d.kill_at:.6f}"
        self._deadlines[generation] = line
        for old in [g for g in self._deadlines if g < generation - 1]:
            del self._deadlines[old]
        self._send(line)

    def job(self, generation: int, handle: ProcessHandle) -> None:
        line = f"job {generation} {handle.pgid} {handle.pid} {handle.start_ticks}"
        self._jobs[handle.pgid] = line
        self._send(line)

    def done(self, handle: ProcessHandle) -> None:
        if self._jobs.pop(handle.pgid, None) is not None:
            self._send(f"done {handle.pgid}")

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        if proc.poll() is None and not self._jobs:
            proc.kill()
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """The worker stops in order: the keeper exits without signalling anything."""
        if self._proc is not None and self._write("exit"):
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._stop_process()


class SelfFence:
    """The watchdog loop and what it does at the self-fence's points (see the module docstring)."""

    def __init__(self, core: "WorkerCore") -> None:
        self._core = core

    def renewed(self, fence: SessionFence, d: FenceDeadlines) -> None:
        """A heartbeat (or a new session) renewed the lease: the keeper gets the new schedule,
        and every running job of the session's executor fence moves to the new KILL point (the
        job's group dies there even if this worker and its keeper are both gone)."""
        core = self._core
        core.keeper.deadline(fence.generation, d)
        for job in core.jobs.values():
            if (job.handle is None or job.forgotten or job.finishing or job.fence != fence
                    or not isinstance(job.executor, FencedExecutor)):
                continue
            try:
                job.executor.renew_fence(job.attempt_dir, d.kill_at)
            except Exception as exc:
                core.emit("error", "worker.fence_renew_failed",
                          f"run {job.run_id}: its executor's fence could not be renewed (the job is killed "
                          f"at the last one): {exc.__class__.__name__}: {exc}", run_id=job.run_id,
                          attempt_id=job.attempt_id)

    async def watchdog_loop(self) -> None:
        """Every :data:`WATCHDOG_S`: the self-fence at its TERM point, timeouts, cancel and
        fence signals, and a check that nothing outlived the fence."""
        core = self._core
        fenced_at: float | None = None
        while not core.closing:
            now = core.mono()
            d = core.deadlines
            if core.session is not None and d is not None and now >= d.term_at:
                self.self_fence(d)
                fenced_at = d.fenced_at
            for job in list(core.jobs.values()):
                if job.handle is None:
                    continue
                if job.forgotten:
                    core.supervisor.signal(job, signal.SIGTERM)
                    if job.kill_at is not None and now >= job.kill_at:
                        core.supervisor.signal(job, signal.SIGKILL)
                    continue
                if (job.cancel is None and job.deadline_mono is not None and now >= job.deadline_mono
                        and job.request_stop(CancelReason.TIMEOUT)):
                    core.emit("warning", "worker.timeout", f"run {job.run_id}: the timeout expired; " + (
                              "the job had exited, what it left is handled by [worker] orphans"
                              if core.supervisor.draining(job) else "stopping its process group"),
                              run_id=job.run_id, attempt_id=job.attempt_id)
                if job.cancel is CancelReason.TIMEOUT and core.supervisor.draining(job):
                    # the job itself has exited: its wrapper ends within the drain and applies
                    # [worker] orphans; a TERM now would stop what "leave" keeps
                    continue
                if job.cancel is not None:
                    core.supervisor.escalate(job)
            if fenced_at is not None and now >= fenced_at:
                fenced_at = None
                alive = [j for j in core.jobs.values() if j.forgotten and core.supervisor.alive(j)]
                if alive:
                    core.emit("error", "worker.fence_breached",
                              f"{len(alive)} job(s) still alive at the self-fence deadline despite KILL",
                              jobs=len(alive))
            await asyncio.sleep(WATCHDOG_S)

    def due(self) -> bool:
        """The self-fence's TERM point has passed and the session is still held (a worker that
        was frozen, before its watchdog ran): fence now, before anything acts on the session."""
        core = self._core
        d = core.deadlines
        if core.session is None or d is None or core.mono() < d.term_at:
            return False
        self.self_fence(d)
        return True

    def self_fence(self, d: FenceDeadlines) -> None:
        """No heartbeat succeeded in time: abandon the session, TERM every job, KILL at kill_at."""
        core = self._core
        session = core.session
        assert session is not None
        core.session = None
        core.abandoned = session.fence
        core.deadlines = None
        core.stats.self_fenced += 1
        jobs = [j for j in core.jobs.values() if j.fence == session.fence]
        core.emit("warning", "worker.self_fenced",
                  f"no heartbeat succeeded within the session lease's safe part; stopping {len(jobs)} job(s) "
                  "before the lease can expire, then opening a new session",
                  generation=session.fence.generation, jobs=len(jobs),
                  last_heartbeat_started_mono=core.last_heartbeat_mono,
                  term_at_mono=d.term_at, kill_at_mono=d.kill_at, fenced_at_mono=d.fenced_at)
        for job in jobs:
            core.forget(job, kill_at=d.kill_at, since_mono=d.term_at)
