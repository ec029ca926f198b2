"""The job supervisor: one library for watching the process of an Attempt, whoever runs it.

Two programs run jobs: the local dispatcher of the edge and standalone profiles
(:mod:`qinglong.host.execution`) and the cluster's worker (:mod:`qinglong.worker`). They differ in
where a job comes from and where its outcome goes (a local store, a remote session), and share
what happens in between, which lives here once (:mod:`.jobs`):

* :class:`Job`: a process known by its verified handle
  (:class:`~qinglong.contracts.execution.ProcessHandle`: boot id, pid, start time), never a bare pid;
* :class:`Supervisor`: the table of watched jobs, each with its task; TERM, then KILL after the
  grace, each sent once and only through the executor's verified signal; the wait for the end;
  the outcome classified from the evidence through the contract
  (:func:`~qinglong.contracts.execution.classify_outcome`);
* :class:`SupervisorStats`: the counters every owner keeps (its own extend them);
* :func:`wall_clock_ms`: the one wall clock that crosses into a store.

This package imports :mod:`qinglong.contracts` only (import-linter holds it), so the host and the
worker can both use it and neither has to import the other.
"""

from __future__ import annotations

from .jobs import (
    NO_COMMAND,
    Job,
    Supervisor,
    SupervisorStats,
    ended_outcome,
    missing_executor,
    start_failure,
    wall_clock_ms,
)

__all__ = ["NO_COMMAND", "Job", "Supervisor", "SupervisorStats", "ended_outcome", "missing_executor",
           "start_failure", "wall_clock_ms"]
