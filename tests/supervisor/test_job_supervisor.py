"""The job supervisor both executors of a job use (the local dispatcher and the cluster worker),
driven with the real ``local_process`` executor and real process groups."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.execution import (
    AttemptState,
    CancelReason,
    ExecutorContext,
    StartRequest,
    minimal_environment,
    parse_execution_spec,
)
from qinglong.plugins.local_process import create_executor
from qinglong.supervisor import Job, Supervisor, SupervisorStats

from tests.support.procs import process_alive, wait_until

PATIENCE_S = 60.0


class Collected:
    """A diagnostic sink that keeps what it was given."""

    def __init__(self) -> None:
        self.events: list[DiagnosticEvent] = []

    def emit(self, event: DiagnosticEvent) -> None:
        self.events.append(event)

    def codes(self) -> list[str]:
        return [event.code for event in self.events]


def _executor(tmp_path: Path):
    return create_executor(ExecutorContext(str(tmp_path / "logs"), minimal_environment(str(tmp_path)), 60_000))


async def _started(supervisor: Supervisor, executor, tmp_path: Path, script: str) -> Job:
    attempt_id = str(uuid.uuid4())
    attempt_dir = str(tmp_path / "logs" / attempt_id)
    spec = parse_execution_spec("t", {"command": ["sh", "-c", script]})
    job = Job("run-1", attempt_id, attempt_dir=attempt_dir)
    await supervisor.spawn(job, executor, StartRequest("run-1", attempt_id, 1, 0, spec, attempt_dir))
    return job


def test_escalation_sends_term_once_then_kill_once_after_the_grace_and_classifies_the_end(tmp_path):
    """A job that ignores TERM must still be gone after the grace, and each signal must go once:
    a second TERM would hit a job that is shutting down cleanly, a KILL before the grace would
    cut its cleanup short, and a job that is never KILLed would run on past its timeout (beside
    its retry, on a worker that lost its lease). The end is classified from the receipt and the
    cancel request, so a KILLed job reads ``timed_out``, never ``succeeded``."""
    marks = tmp_path / "terms"
    ready = tmp_path / "ready"
    script = f"trap 'echo term >> {marks}' TERM; : > {ready}; while :; do sleep 0.05; done"

    async def body() -> None:
        stats = SupervisorStats()
        supervisor: Supervisor[Job] = Supervisor(Collected(), "test", 3600.0, stats)
        job = await _started(supervisor, _executor(tmp_path), tmp_path, script)
        assert stats.started == 1 and job.handle is not None
        await asyncio.to_thread(wait_until, ready.exists, "the job's TERM trap installed", timeout=PATIENCE_S)

        supervisor.escalate(job)                      # TERM
        await asyncio.to_thread(wait_until, marks.exists, "the job saw TERM", timeout=PATIENCE_S)
        supervisor.escalate(job)                      # within the grace: nothing
        assert supervisor.signal(job, signal.SIGTERM) is False   # TERM goes once
        assert not job.kill_sent and supervisor.alive(job)
        assert 0 < supervisor.kill_due_in(job) <= 3600.0

        supervisor.escalate(job, grace_s=0)           # the grace passed: KILL
        assert job.kill_sent and supervisor.kill_due_in(job) is None
        await asyncio.wait_for(supervisor.wait_for_exit(job), PATIENCE_S)
        assert not supervisor.alive(job)
        # the KILL took the group's waiter too, so no receipt: the cancel request explains the
        # end, and without one the end is lost, never succeeded
        assert supervisor.outcome(job, CancelReason.TIMEOUT).state is AttemptState.TIMED_OUT
        assert supervisor.outcome(job, None).state is AttemptState.LOST
        assert supervisor.signal(job, signal.SIGKILL) is False   # KILL goes once
        assert marks.read_text() == "term\n"

    asyncio.run(body())


def test_a_handle_that_no_longer_names_its_process_is_never_signalled(tmp_path):
    """Signals go only through the executor's verified handle: a handle whose pid now names
    another process (same pid, another start time) must be refused, or a pid reused by an
    unrelated process after the job ended would be killed. The refusal is reported, not raised."""
    async def body() -> None:
        sink = Collected()
        supervisor: Supervisor[Job] = Supervisor(sink, "test", 0.0, SupervisorStats(), report_unsent=True)
        job = await _started(supervisor, _executor(tmp_path), tmp_path, "exit 0")
        await asyncio.wait_for(supervisor.wait_for_exit(job), PATIENCE_S)
        assert supervisor.outcome(job, None).state is AttemptState.SUCCEEDED

        # a live process of our own, in its own group, under the job's handle with its pid
        other = subprocess.Popen(["sleep", "600"], start_new_session=True)
        try:
            assert job.handle is not None
            job.handle = replace(job.handle, pid=other.pid, pgid=other.pid)
            assert supervisor.signal(job, signal.SIGKILL) is False
            assert process_alive(other.pid)
            assert sink.codes() == ["test.signal_not_sent"]
        finally:
            other.kill()
            other.wait()

    asyncio.run(body())


def test_a_tracked_job_leaves_the_table_when_its_watch_ends_even_by_an_error(tmp_path):
    """The table is what an owner counts its slots and drains by: a job whose watch ended (or
    failed) must leave it, or a worker would claim nothing more and a drain would never end."""
    async def body() -> None:
        supervisor: Supervisor[Job] = Supervisor(Collected(), "test", 1.0, SupervisorStats())
        ended: list[str] = []

        async def fails(job: Job) -> None:
            raise RuntimeError("the store went away")

        job = Job("run-1", "attempt-1")
        supervisor.track(job, fails, lambda j: ended.append(j.attempt_id))
        assert supervisor.jobs == {"attempt-1": job} and supervisor.tasks() == [job.task]
        assert job.task is not None
        await asyncio.gather(job.task, return_exceptions=True)
        assert supervisor.jobs == {} and ended == ["attempt-1"]

    asyncio.run(body())
