"""``NiceExecutor``: another executor's processes, with the command run under ``nice``.

Only :meth:`NiceExecutor.start` differs from the executor it wraps: the command becomes
``nice -n NICENESS -- COMMAND...`` (POSIX ``nice``; the kernel lets any user lower a process's
priority, never raise it). Everything after the start (probe, adopt after a restart, wait,
receipt, signals, a cluster worker's fence) is the wrapped executor's, working from the Attempt
directory and the handle alone, as the contract demands.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from qinglong.contracts.execution import Executor, ProcessHandle, ProcessState, Receipt, StartRequest

#: The name tasks give with ``--executor``.
EXECUTOR_NAME = "nice"
#: The executor whose processes this one starts.
BASE_EXECUTOR = "local_process"
#: How much lower the job's CPU priority is (``nice -n``; 19 is the lowest).
NICENESS = 10


def niced(command: tuple[str, ...], niceness: int = NICENESS) -> tuple[str, ...]:
    """``command`` run under ``nice``; ``--`` so a program name is never read as an option."""
    return ("nice", "-n", str(niceness), "--", *command)


class NiceExecutor:
    """An :class:`~qinglong.contracts.execution.Executor` that lowers the priority of its jobs."""

    name = EXECUTOR_NAME

    def __init__(self, inner: Executor, niceness: int = NICENESS) -> None:
        self.inner = inner
        self.niceness = niceness

    async def start(self, request: StartRequest) -> ProcessHandle:
        """Start ``nice -n NICENESS -- COMMAND`` with the wrapped executor.

        A program that does not exist is then reported by ``nice`` (exit code 127) rather than
        refused at start."""
        spec = dataclasses.replace(request.spec, command=niced(request.spec.command, self.niceness))
        return await self.inner.start(dataclasses.replace(request, spec=spec))

    def probe(self, attempt_dir: str, handle: ProcessHandle | None) -> ProcessState:
        return self.inner.probe(attempt_dir, handle)

    def find_handle(self, attempt_dir: str) -> ProcessHandle | None:
        return self.inner.find_handle(attempt_dir)

    async def wait(self, attempt_dir: str, handle: ProcessHandle) -> None:
        await self.inner.wait(attempt_dir, handle)

    def read_receipt(self, attempt_dir: str) -> Receipt | None:
        return self.inner.read_receipt(attempt_dir)

    def signal(self, handle: ProcessHandle, signum: int) -> bool:
        return self.inner.signal(handle, signum)

    def __getattr__(self, name: str) -> Any:
        # Optional capabilities of the wrapped executor (a worker's renew_fence) stay available,
        # so this executor is a FencedExecutor exactly when the wrapped one is.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
