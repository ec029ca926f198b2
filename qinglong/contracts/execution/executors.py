"""Executors: what a plugin offers through the hook ``qinglong_executors`` to start and watch the
process of an Attempt, and the environment a job starts with."""

from __future__ import annotations

import enum
from typing import Any, Mapping, Protocol, runtime_checkable

from ..frozen import record
from .outcomes import Receipt
from .spec import ExecutionSpec


@record
class ProcessHandle:
    """A durable name of a started process that cannot be confused with a later one reusing its
    pid: the boot it ran in, its pid (the leader of its own session and process group) and its
    start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""

    boot_id: str
    pid: int
    pgid: int
    start_ticks: int

    def to_json(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "pid": self.pid, "pgid": self.pgid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "ProcessHandle":
        return cls(str(value["boot_id"]), int(value["pid"]), int(value["pgid"]), int(value["start_ticks"]))


@record
class StartRequest:
    """What the dispatcher asks an executor to start."""

    run_id: str
    attempt_id: str
    attempt_no: int
    scheduled_for_ms: int
    spec: ExecutionSpec
    #: A directory of this Attempt's own (created 0700 by the executor): log, receipt, pid, lock.
    attempt_dir: str
    #: A fence (a cluster worker's): the job's whole process group is killed once this instant
    #: of the monotonic clock passes unless :meth:`FencedExecutor.renew_fence` moved it later,
    #: whatever happens to the process that started it (killed, frozen, cut off). None: no fence
    #: (a local profile's jobs outlive their control plane on purpose).
    fence_deadline_mono: float | None = None
    #: What an event admitted the Run with (canonical JSON: an incoming webhook's body, an event
    #: source's payload), or None. An executor that supports it hands it to the job as a file
    #: named by :data:`EVENT_FILE_ENV`.
    event_payload: str | None = None


#: The variable naming the file that holds :attr:`StartRequest.event_payload`.
EVENT_FILE_ENV = "QINGLONG_EVENT_FILE"


class StartError(Exception):
    """The process could not be started (no such program, bad working directory). The message
    says what, for the operator; it ends the Attempt ``failed`` without a retry."""


class ProcessState(str, enum.Enum):
    ALIVE = "alive"            # the handle's process (or its waiter) still holds the Attempt
    ENDED = "ended"            # over: read the receipt (there may be none)
    NEVER_STARTED = "never_started"  # no trace the command was ever started: safe to start it


@runtime_checkable
class Executor(Protocol):
    """Starts and watches the processes of Attempts. One instance per ``qinglong run`` process.

    Nothing an executor does is transactional; the dispatcher records each step durably around
    it. Everything after ``start`` works from the Attempt directory and the handle alone, so a
    restarted control plane can pick up what an earlier one started.
    """

    name: str

    async def start(self, request: StartRequest) -> ProcessHandle:
        """Start the process detached (its own session and group; it survives our exit) and return
        its handle once it exists. Raise :class:`StartError` when it cannot start."""
        ...

    def probe(self, attempt_dir: str, handle: ProcessHandle | None) -> ProcessState:
        """Whether the Attempt's process is alive, ended, or was never started."""
        ...

    def find_handle(self, attempt_dir: str) -> ProcessHandle | None:
        """The handle of a process started for ``attempt_dir`` whose start was not recorded (a
        crash between spawn and the running commit), if one exists and is verified."""
        ...

    async def wait(self, attempt_dir: str, handle: ProcessHandle) -> None:
        """Return when the Attempt's process (and its waiter) ended."""
        ...

    def read_receipt(self, attempt_dir: str) -> Receipt | None:
        """The completion receipt, or None if the waiter never wrote one."""
        ...

    def signal(self, handle: ProcessHandle, signum: int) -> bool:
        """Send ``signum`` to the handle's process group only after verifying the handle (boot id
        and start time); False (and nothing sent) when it no longer names our process."""
        ...


@runtime_checkable
class FencedExecutor(Executor, Protocol):
    """An executor that can arm :attr:`StartRequest.fence_deadline_mono`: what a cluster worker
    needs, since a job must not outlive its lease even when the worker itself is killed or frozen
    and cannot stop it."""

    def renew_fence(self, attempt_dir: str, deadline_mono: float) -> None:
        """Move the Attempt's fence to ``deadline_mono`` (monotonic clock); the process group is
        killed when it passes. Atomic: the fence is always either the old or the new instant."""
        ...


@record
class ExecutorSpec:
    """What a plugin offers through ``qinglong_executors``: a name and a factory taking the
    :class:`ExecutorContext`."""

    name: str
    create: Any  # Callable[[ExecutorContext], Executor]
    description: str = ""


@record
class ExecutorContext:
    """What an executor's factory receives."""

    #: Directory under which Attempt directories live (created 0700).
    log_dir: str
    #: Environment every job starts from (before the task's env and the QINGLONG_* variables).
    base_env: Mapping[str, str]
    #: Grace between TERM and KILL, ms.
    kill_grace_ms: int
    #: Once a job's own process ended, how long its output is still read while something it
    #: left behind holds it open, ms; then ``orphans`` applies.
    orphan_drain_ms: int = 2_000
    #: ``kill``: TERM, then KILL, what is left in the job's process group; ``leave``: leave it.
    orphans: str = "kill"
    #: ``(uid, gid)`` the job's own process runs as (a worker's ``[worker] run_as``), or None: the
    #: executor's own user. The executor keeps its own user to watch, signal and log the job.
    run_as: tuple[int, int] | None = None


#: The variables every job gets before its task's env (a minimal environment: the control
#: plane's own environment, which may hold its secrets, is never passed on).
def minimal_environment(home: str | None) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if home:
        env["HOME"] = home
    return env


def job_environment(base: Mapping[str, str], request: StartRequest) -> dict[str, str]:
    """The environment a job sees: ``base``, then the task's env, then what identifies the Attempt."""
    env = dict(base)
    env.update(request.spec.env)
    env.update({
        "QINGLONG_RUN_ID": request.run_id,
        "QINGLONG_ATTEMPT_ID": request.attempt_id,
        "QINGLONG_ATTEMPT": str(request.attempt_no),
        "QINGLONG_SCHEDULED_FOR_MS": str(request.scheduled_for_ms),
    })
    return env


__all__ = ["EVENT_FILE_ENV", "ProcessHandle", "StartRequest", "StartError", "ProcessState", "Executor", "FencedExecutor",
           "ExecutorSpec", "ExecutorContext", "minimal_environment", "job_environment"]
