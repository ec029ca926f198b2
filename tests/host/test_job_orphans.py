"""A job that exits while something it started still holds its output: the job's own exit is its
outcome, the output is drained for a bounded time, then ``[execution] orphans`` applies, and a
process that left the job's process group (``setsid``) is named in the Attempt's record."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import sys

import pytest

from dispatcher_helpers import group_members, process_alive, running, state_of, until, write_settings


@pytest.fixture
def daemon(tmp_path):
    """A copy of ``sleep`` named ``mydaemon`` (so /proc names it), and the pids it ran as: each is
    KILLed at teardown, so no test leaks one."""
    program = tmp_path / "mydaemon"
    shutil.copy(shutil.which("sleep"), program)
    pids = tmp_path / "daemon.pids"
    yield program, pids
    if pids.exists():
        for line in pids.read_text().split():
            _kill_and_wait(int(line))


def _kill_and_wait(pid: int) -> None:
    """KILL ``pid`` and wait until it is gone: the suite's leak guard looks right after."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    asyncio.run(until(lambda: not process_alive(pid), f"process {pid} to be gone after KILL"))


def _job(program, pids, tmp_path) -> list[str]:
    """Starts an escaped daemon (setsid) and a helper left in the group, then exits 0 at once."""
    helper = tmp_path / "helper.pid"
    return ["sh", "-c", f"echo job output; setsid sh -c 'echo $$ >> {shlex.quote(str(pids))}; "
                        f"exec {shlex.quote(str(program))} 300' & "
                        f"sleep 300 & echo $! > {shlex.quote(str(helper))}; exit 0"]


def test_a_job_exiting_0_beside_a_setsid_daemon_ends_succeeded_not_timed_out(tmp_path, daemon):
    """Without the bounded drain the Run would stay `running` until its timeout (an hour by
    default), blocking `forbid`/`queue` for all that time, end `timed_out` with no exit code, and
    the helper it left in its group would be held alive; the escaped daemon would go unnamed."""
    program, pids = daemon
    settings = write_settings(tmp_path, orphan_drain_ms=300)

    async def body() -> None:
        async with running(settings) as h:
            # a timeout far beyond the test's own bound: only the drain can end this Run in time
            await h.put_task("leaves", _job(program, pids, tmp_path), timeout_ms=3_600_000)
            run_id = await h.admit("leaves")
            detail = await h.until_ended(run_id)
            assert state_of(detail.run.state) == "succeeded" and detail.run.exit_code == 0
            (attempt,) = detail.attempts
            assert "'mydaemon'" in attempt.reason and "setsid" in attempt.reason, attempt.reason
            assert 'orphans = "kill"' in attempt.reason
            assert b"job output" in open(f"{attempt.attempt_dir}/log", "rb").read()
            pgid = int(open(f"{attempt.attempt_dir}/pid").read().split()[0])
            await until(lambda: not group_members(pgid), "the job's process group to be gone")
            helper = int((tmp_path / "helper.pid").read_text())
            assert not process_alive(helper), "the helper left in the job's group still runs"
            (escaped,) = [int(p) for p in pids.read_text().split()]
            assert f"pid {escaped}" in attempt.reason

    asyncio.run(body())


def test_a_daemon_that_left_only_its_process_group_is_named_for_what_it_did(tmp_path, daemon):
    """A daemon moved to a process group of its own (setpgid, as a shell's job control does)
    escapes the group's TERM and KILL as one started with setsid does; named as a setsid escape,
    the operator would look for a setsid the job never ran."""
    program, pids = daemon
    settings = write_settings(tmp_path, orphan_drain_ms=1_000)
    escape = (f"import os; os.setpgid(0, 0); open({str(pids)!r}, 'a').write(str(os.getpid()) + ' '); "
              f"os.execv({str(program)!r}, ['mydaemon', '300'])")

    async def body() -> None:
        async with running(settings) as h:
            # the job exits once the daemon wrote its pid (right before its exec)
            await h.put_task("leaves", ["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(escape)} & "
                                                    f"until [ -s {shlex.quote(str(pids))} ]; do sleep 0.01; done; "
                                                    "exit 0"], timeout_ms=3_600_000)
            run_id = await h.admit("leaves")
            detail = await h.until_ended(run_id)
            assert state_of(detail.run.state) == "succeeded" and detail.run.exit_code == 0
            (attempt,) = detail.attempts
            (escaped,) = [int(p) for p in pids.read_text().split()]
            assert f"'mydaemon' (pid {escaped}, escaped its process group with setpgid)" in attempt.reason, \
                attempt.reason

    asyncio.run(body())


def test_with_orphans_leave_the_helpers_keep_running_and_the_outcome_is_recorded(tmp_path, daemon):
    """`leave` must not block the outcome either, and must not kill what the job left: a job that
    starts a service on purpose would otherwise lose it."""
    program, pids = daemon
    settings = write_settings(tmp_path, orphan_drain_ms=200, orphans="leave")

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("leaves", _job(program, pids, tmp_path), timeout_ms=3_600_000)
            run_id = await h.admit("leaves")
            detail = await h.until_ended(run_id)
            assert state_of(detail.run.state) == "succeeded" and detail.run.exit_code == 0
            (attempt,) = detail.attempts
            assert 'orphans = "leave"' in attempt.reason and "'mydaemon'" in attempt.reason
            helper = int((tmp_path / "helper.pid").read_text())
            try:
                assert process_alive(helper), "leave killed the helper the job left"
            finally:
                os.kill(helper, signal.SIGKILL)
                await until(lambda: not process_alive(helper), "the helper to be gone after KILL")

    asyncio.run(body())


def test_the_worker_takes_its_orphans_policy_from_its_own_section():
    """A worker that ignored `[worker] orphans` would kill the services a `leave` deployment
    keeps, or hold a job open until its timeout."""
    from qinglong.host.settings import WorkerSettings
    from qinglong.worker import worker_config

    config = worker_config(WorkerSettings(url="http://h:1", token_file="w.token", orphans="leave",
                                          orphan_drain_ms=750),
                           hostname="w1")
    assert (config.orphans, config.orphan_drain_ms) == ("leave", 750)


def test_a_timeout_that_lands_while_the_output_drains_leaves_what_leave_keeps(tmp_path, daemon):
    """The job exited before its deadline, but the drain (something it left holds its output)
    outlasted the deadline: the timeout's TERM to the group killed the service the job started
    on purpose although the policy is `leave`, and although the job itself was done."""
    program, pids = daemon
    settings = write_settings(tmp_path, orphan_drain_ms=5_000, orphans="leave")
    script = (f"sh -c 'echo $$ >> {shlex.quote(str(pids))}; exec {shlex.quote(str(program))} 300' & "
              f"until [ -s {shlex.quote(str(pids))} ]; do sleep 0.01; done; exit 0")

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("service", ["sh", "-c", script], timeout_ms=1_000)
            run_id = await h.admit("service")
            detail = await h.until_ended(run_id)
            (attempt,) = detail.attempts
            assert attempt.cancel_reason == "timeout", "the deadline must have passed during the drain"
            assert state_of(detail.run.state) == "succeeded" and detail.run.exit_code == 0, detail
            (left,) = [int(p) for p in pids.read_text().split()]
            assert process_alive(left), "the timeout killed what orphans = \"leave\" keeps"
            assert 'orphans = "leave"' in attempt.reason, attempt.reason

    asyncio.run(body())
