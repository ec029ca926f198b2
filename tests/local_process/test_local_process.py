"""The ``local_process`` executor with real processes: start, log, receipt, probe, wait, signal.

Every wait here is for a condition (the lock, a file, /proc) with a generous overall timeout;
nothing sleeps a fixed time and then asserts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from qinglong.contracts.execution import (
    Executor,
    ExecutionSpec,
    ExecutorContext,
    ProcessHandle,
    ProcessState,
    StartError,
    StartRequest,
    minimal_environment,
)
from qinglong.plugins.local_process import create_executor, qinglong_executors
from qinglong.plugins.local_process.executor import LocalProcessExecutor
from qinglong.plugins.local_process.procfs import group_members, read_stat
from qinglong.plugins.local_process.wrapper import FENCE_NAP_CS, find_tools

from tests.support import procs as proc_helpers

TIMEOUT = 60.0
MIB = 1024 * 1024


def wait_until(condition, what: str, timeout: float = TIMEOUT):
    return proc_helpers.wait_until(condition, what, timeout=timeout, interval=0.01)

@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "db.logs" / "nested"


@pytest.fixture
def started():
    """Handles of the jobs a test started: their groups are KILLed (verified) at teardown, so a
    failing test leaks no process."""
    handles: list[tuple[LocalProcessExecutor, ProcessHandle]] = []
    yield handles
    for owner, handle in handles:
        owner.signal(handle, signal.SIGKILL)


def tracked(executor: LocalProcessExecutor, started) -> LocalProcessExecutor:
    start = executor.start

    async def start_and_track(req):
        handle = await start(req)
        started.append((executor, handle))
        return handle

    executor.start = start_and_track
    return executor


@pytest.fixture
def executor(log_dir: Path, tmp_path: Path, started) -> LocalProcessExecutor:
    return tracked(create_executor(ExecutorContext(str(log_dir), minimal_environment(str(tmp_path)),
                                                   2_000)), started)


def request(log_dir: Path, command, *, attempt: str = "a1", **spec) -> StartRequest:
    return StartRequest("run-1", attempt, 1, 1_700_000_000_000,
                        ExecutionSpec(tuple(command), **spec), str(log_dir / attempt))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


async def start_and_wait(executor, req):
    handle = await executor.start(req)
    await executor.wait(req.attempt_dir, handle)
    return handle


def alive(pid: int) -> bool:
    stat_ = read_stat(pid)
    return stat_ is not None and stat_.state != "Z"


# ------------------------------------------------------------------------------ the plugin


def test_local_process_is_offered_by_entry_point_and_builds_an_executor(log_dir, tmp_path):
    """Without the entry point no profile could start a job: every Run would stay queued."""
    (point,) = [p for p in entry_points(group="qinglong.plugins") if p.name == "local_process"]
    module = point.load()
    (spec,) = module.qinglong_executors()
    assert spec.name == "local_process" and callable(spec.create)
    built = spec.create(ExecutorContext(str(log_dir), minimal_environment(None), 1_000))
    assert isinstance(built, Executor) and built.name == "local_process"
    assert [s.name for s in qinglong_executors()] == ["local_process"]


# ------------------------------------------------------------------- output, status, files


def test_echo_is_logged_and_its_receipt_says_exit_0_with_private_files(executor, log_dir):
    """A lost receipt or log loses the Run's outcome and output; a world-readable log or
    directory leaks what the job printed to every local user."""
    req = request(log_dir, ["echo", "hello", "world"])
    handle = run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert receipt is not None and receipt.exit_code == 0 and receipt.signal is None
    assert receipt.dropped_bytes == 0 and receipt.log_bytes == len(b"hello world\n")
    attempt = Path(req.attempt_dir)
    assert (attempt / "log").read_bytes() == b"hello world\n"
    # the job's own end (the status line appended to ``pid``), not the receipt written after the drain
    assert (attempt / "pid").read_bytes() == b"%d\n0\n" % handle.pid
    assert abs(receipt.ended_at_ms - (attempt / "pid").stat().st_mtime_ns // 1_000_000) <= 1
    assert receipt.ended_at_ms <= (attempt / "receipt").stat().st_mtime_ns // 1_000_000
    for directory in (attempt, attempt.parent, attempt.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for name in ("log", "receipt", "pid"):
        assert stat.S_IMODE((attempt / name).stat().st_mode) == 0o600, name
    # the directory is the lock; the output went through a pipe: no other file
    assert sorted(p.name for p in attempt.iterdir()) == ["log", "pid", "receipt"]
    assert int((attempt / "pid").read_text().split()[0]) == handle.pid == handle.pgid
    assert not alive(handle.pid) and read_stat(handle.pid) is None, "the wrapper was left a zombie"


def test_non_zero_exit_and_death_by_signal_are_recorded(executor, log_dir):
    """A failure recorded as success (or a signal as an exit code) hides a broken job and
    retries the wrong thing."""
    req = request(log_dir, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.signal) == (3, None)
    assert (Path(req.attempt_dir) / "log").read_bytes().splitlines()[:2] == [b"out", b"err"]

    req = request(log_dir, ["sh", "-c", "kill -KILL $$"], attempt="a2")
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.signal) == (None, signal.SIGKILL)


def test_the_job_sees_its_task_env_and_the_minimal_env_but_not_the_control_planes(
        executor, log_dir, tmp_path, monkeypatch):
    """The control plane's own environment (database passwords, tokens) leaking into every job
    would hand its secrets to any task; a missing task variable breaks the job."""
    monkeypatch.setenv("QL_TEST_DATABASE_PASSWORD", "hunter2-secret")
    req = request(log_dir, ["sh", "-c", "env"], env={"GREETING": "hi there", "PATH": "/usr/bin:/bin"})
    run(start_and_wait(executor, req))
    seen = dict(line.split("=", 1) for line in
                (Path(req.attempt_dir) / "log").read_text().splitlines() if "=" in line)
    assert seen["GREETING"] == "hi there"
    assert seen["PATH"] == "/usr/bin:/bin"  # the task's env wins over the minimal one
    assert seen["HOME"] == str(tmp_path) and seen["LANG"] == "C.UTF-8"
    assert seen["QINGLONG_RUN_ID"] == "run-1" and seen["QINGLONG_ATTEMPT_ID"] == "a1"
    assert seen["QINGLONG_ATTEMPT"] == "1" and seen["QINGLONG_SCHEDULED_FOR_MS"] == "1700000000000"
    assert "QL_TEST_DATABASE_PASSWORD" not in seen
    assert "hunter2-secret" not in (Path(req.attempt_dir) / "log").read_text()
    # the wrapper's own variables are not exported to the job
    assert not [name for name in seen if name.startswith("QINGLONG_") and name not in
                ("QINGLONG_RUN_ID", "QINGLONG_ATTEMPT_ID", "QINGLONG_ATTEMPT", "QINGLONG_SCHEDULED_FOR_MS")]


def test_working_dir_is_honoured_and_defaults_to_the_control_planes_home(executor, log_dir, tmp_path):
    """A job run in the wrong directory writes or deletes files elsewhere than its owner meant."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "script.sh").write_text("#!/bin/sh\npwd\n")
    (work / "script.sh").chmod(0o700)
    req = request(log_dir, ["./script.sh"], working_dir=str(work))
    run(start_and_wait(executor, req))
    assert (Path(req.attempt_dir) / "log").read_text() == f"{work}\n"
    assert executor.read_receipt(req.attempt_dir).exit_code == 0

    # without a working_dir: the control plane's HOME, even when the task sets its own HOME
    req = request(log_dir, ["pwd"], attempt="a2", env={"HOME": "/nonexistent-home"})
    run(start_and_wait(executor, req))
    assert (Path(req.attempt_dir) / "log").read_text() == f"{tmp_path}\n"


@pytest.mark.parametrize("command, working_dir, message", [
    (["no-such-program-ql"], None, "program 'no-such-program-ql' not found on PATH"),
    (["/nonexistent/bin/tool"], None, "program '/nonexistent/bin/tool' does not exist"),
    (["./missing.sh"], "WORK", "program './missing.sh' does not exist (in the working directory"),
    (["./data.txt"], "WORK", "program './data.txt' is not an executable file"),
    (["echo"], "/nonexistent/work/dir", "the working directory '/nonexistent/work/dir' does not exist"),
    (["echo"], "WORK/data.txt", "is not a directory"),
])
def test_a_missing_program_or_working_dir_is_a_start_error_and_nothing_is_spawned(
        executor, log_dir, tmp_path, command, working_dir, message):
    """A missing program reported as a spawned job that 'failed' (or a hang) would hide a typo;
    anything spawned, or any pid file left, would make the Attempt look started."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("not a program")
    if working_dir is not None:
        working_dir = working_dir.replace("WORK", str(work))
    req = request(log_dir, command, working_dir=working_dir)
    before = set(live_children())
    with pytest.raises(StartError) as raised:
        run(executor.start(req))
    assert message in str(raised.value)
    assert set(live_children()) == before, "a process was spawned"
    attempt = Path(req.attempt_dir)
    assert not (attempt / "pid").exists() and not (attempt / "receipt").exists()
    assert executor.probe(req.attempt_dir, None) is ProcessState.NEVER_STARTED


def test_a_start_error_never_echoes_a_path_set_by_the_task(executor, log_dir):
    """Task env values may be secrets: a PATH from the task must not appear in an error."""
    req = request(log_dir, ["no-such-program-ql"], env={"PATH": "/opt/s3cr3t-token/bin"})
    with pytest.raises(StartError) as raised:
        run(executor.start(req))
    assert "s3cr3t" not in str(raised.value) and "the task's PATH" in str(raised.value)


def live_children() -> list[int]:
    """Live children of this test process (what a start could have spawned)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != b"Z":
                out.append(int(name))
    return out


def test_an_attempt_directory_that_shows_a_start_is_never_started_again(executor, log_dir, tmp_path):
    """Starting an Attempt twice would run the job twice for one occurrence."""
    marker = tmp_path / "runs"
    req = request(log_dir, ["sh", "-c", f"echo x >> {marker}"])
    run(start_and_wait(executor, req))
    with pytest.raises(StartError, match="earlier start"):
        run(executor.start(req))
    assert marker.read_text() == "x\n"


def test_a_second_start_while_the_first_is_alive_is_refused(executor, log_dir, tmp_path):
    """Two wrappers for one Attempt would run the job twice and write two receipts."""
    go = tmp_path / "go"
    req = request(log_dir, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"])

    async def scenario():
        handle = await executor.start(req)
        with pytest.raises(StartError):
            await executor.start(req)
        go.touch()
        await executor.wait(req.attempt_dir, handle)

    run(scenario())
    assert executor.read_receipt(req.attempt_dir).exit_code == 0


def test_the_job_holds_only_null_stdin_and_the_log_pipe_never_the_lock(executor, log_dir, tmp_path):
    """A job (or a daemon it leaves behind) holding the Attempt's lock would make it look alive
    after its wrapper died, hanging the Attempt; a job reading the control plane's stdin would
    steal its input."""
    job_pid = tmp_path / "job.pid"
    req = request(log_dir, ["sh", "-c", f"echo $$ > {job_pid}; exec sleep 600"])

    async def scenario():
        handle = await executor.start(req)
        pid = int(await asyncio.to_thread(
            wait_until, lambda: job_pid.exists() and job_pid.read_text().strip(), "the job's pid"))
        await asyncio.to_thread(
            wait_until, lambda: Path(f"/proc/{pid}/comm").read_text() == "sleep\n", "the exec")
        fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert executor.signal(handle, signal.SIGKILL)
        await executor.wait(req.attempt_dir, handle)
        return fds

    fds = run(scenario())
    assert set(fds) == {0, 1, 2} and fds[0] == "/dev/null"
    assert fds[1] == fds[2] and fds[1].startswith("pipe:["), fds


# ------------------------------------------------------------------------------- signals


def test_term_to_the_group_ends_the_job_and_its_grandchildren(executor, log_dir, tmp_path):
    """A timeout that ends only the leader leaves grandchildren running (leaked processes
    holding files, ports and memory) and the Attempt never ends."""
    started = tmp_path / "started"
    req = request(log_dir, ["sh", "-c", f"sleep 600 & sleep 600 & echo $$ > {started}; wait"])

    async def scenario():
        handle = await executor.start(req)
        await asyncio.to_thread(wait_until, lambda: started.exists() and started.read_text(), "the job")
        await asyncio.to_thread(wait_until, lambda: len(group_members(handle.pgid)) >= 5,
                                "the wrapper, its log reader, the job and two sleeps")
        assert executor.signal(handle, signal.SIGTERM)
        try:
            await asyncio.wait_for(executor.wait(req.attempt_dir, handle),
                                   executor.kill_grace_ms / 1000)
        except asyncio.TimeoutError:
            assert executor.signal(handle, signal.SIGKILL)
            await executor.wait(req.attempt_dir, handle)
        return handle

    handle = run(scenario())
    wait_until(lambda: not group_members(handle.pgid), "every member of the group to be gone")
    receipt = executor.read_receipt(req.attempt_dir)
    assert receipt is not None and receipt.signal == signal.SIGTERM
    assert executor.probe(req.attempt_dir, handle) is ProcessState.ENDED
    assert not executor.signal(handle, signal.SIGTERM), "signalled a group that is gone"


def test_a_job_that_ignores_term_is_ended_by_kill_after_the_grace(executor, log_dir, tmp_path):
    """A job ignoring TERM would outlive its timeout forever without the KILL that follows."""
    ready, termed, survived = tmp_path / "ready", tmp_path / "termed", tmp_path / "survived"
    # the job notes the TERM and goes on (a later pass of its loop says so): the check that it
    # outlived TERM waits for that, not for a time a slow machine might not reach the TERM in
    req = request(log_dir, ["sh", "-c", f"trap 'touch {termed}' TERM; touch {ready}; "
                            f"while :; do [ -e {termed} ] && touch {survived}; sleep 0.05; done"])

    async def scenario():
        handle = await executor.start(req)
        await asyncio.to_thread(wait_until, ready.exists, "the job to ignore TERM")
        assert executor.signal(handle, signal.SIGTERM)
        waiting = asyncio.ensure_future(executor.wait(req.attempt_dir, handle))
        await asyncio.to_thread(wait_until, survived.exists, "the job to go on after its TERM")
        assert not waiting.done(), "the job was supposed to ignore TERM"
        assert executor.probe(req.attempt_dir, handle) is ProcessState.ALIVE
        assert executor.signal(handle, signal.SIGKILL)
        await waiting
        return handle

    handle = run(scenario())
    wait_until(lambda: not group_members(handle.pgid), "every member of the group to be gone")
    assert executor.probe(req.attempt_dir, handle) is ProcessState.ENDED
    assert executor.read_receipt(req.attempt_dir) is None  # the wrapper was killed with it


def test_a_handle_whose_start_time_or_boot_does_not_match_is_never_signalled(executor, log_dir, tmp_path):
    """Signalling a reused pid would kill an unrelated process of the machine."""
    go = tmp_path / "go"
    req = request(log_dir, ["sh", "-c", f"trap 'exit 0' TERM; while [ ! -e {go} ]; do sleep 0.02; done"])

    async def scenario():
        handle = await executor.start(req)
        stale_time = replace(handle, start_ticks=handle.start_ticks - 1)
        other_boot = replace(handle, boot_id="00000000-0000-0000-0000-000000000000")
        other_group = replace(handle, pgid=os.getpgid(0))
        for wrong in (stale_time, other_boot, other_group):
            assert executor.signal(wrong, signal.SIGTERM) is False
            assert executor.signal(wrong, signal.SIGKILL) is False
        await asyncio.to_thread(wait_until, lambda: len(group_members(handle.pgid)) >= 3,
                                "the wrapper, its log reader and the job")
        for wrong in (stale_time, other_boot, other_group):
            assert executor.signal(wrong, signal.SIGTERM) is False
        assert executor.probe(req.attempt_dir, handle) is ProcessState.ALIVE
        assert alive(handle.pid) and len(group_members(handle.pgid)) >= 3
        go.touch()
        await executor.wait(req.attempt_dir, handle)

    run(scenario())
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.signal) == (0, None), "the job was signalled"


# ---------------------------------------------------------------------------------- logs


def test_a_job_writing_100_mib_runs_to_its_own_exit_and_its_log_holds_the_limit(executor, log_dir, tmp_path):
    """Killing a chatty job by SIGPIPE at the limit would fail a job that works; an uncapped
    log fills a router's flash; an unrecorded truncation hides that output is missing."""
    done = tmp_path / "done"
    limit = 4 * MIB
    total = 100 * MIB
    req = request(log_dir, ["sh", "-c", f"head -c {total} /dev/zero && echo finished > {done}"],
                  log_limit_bytes=limit)
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.signal) == (0, None)
    assert done.read_text() == "finished\n"
    assert (Path(req.attempt_dir) / "log").stat().st_size == limit == receipt.log_bytes
    assert receipt.dropped_bytes == total - limit


def test_binary_and_non_utf8_output_is_kept_byte_for_byte(executor, log_dir):
    """Decoding or re-encoding the output would corrupt what a job printed."""
    payload = bytes(range(256)) * 3 + b"\xff\xfe\xc3(\x00\r\n no newline at the end \xe2\x82"
    req = request(log_dir, [sys.executable, "-c",
                            f"import sys; sys.stdout.buffer.write({payload!r}); sys.stdout.flush();"
                            f"sys.stderr.buffer.write(b'\\x80err')"])
    run(start_and_wait(executor, req))
    assert (Path(req.attempt_dir) / "log").read_bytes() == payload + b"\x80err"
    assert executor.read_receipt(req.attempt_dir).exit_code == 0


def test_a_zero_log_limit_keeps_nothing_and_counts_everything(executor, log_dir):
    """With no room for output the job must still run to its end, and the count say so."""
    req = request(log_dir, ["sh", "-c", "printf 12345"], log_limit_bytes=0)
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.log_bytes, receipt.dropped_bytes) == (0, 0, 5)


# --------------------------------------------------------------------- probe and handles


def test_probe_follows_the_life_cycle_and_find_handle_reads_the_pid_file(executor, log_dir, tmp_path):
    """A probe that says NEVER_STARTED for a started job makes the reconciler start it twice;
    ALIVE for an ended one hangs the Attempt; no handle for a live job leaves it unkillable."""
    empty = log_dir / "empty"
    empty.mkdir(parents=True)
    assert executor.probe(str(empty), None) is ProcessState.NEVER_STARTED
    assert executor.probe(str(log_dir / "absent"), None) is ProcessState.NEVER_STARTED
    assert executor.find_handle(str(empty)) is None

    go = tmp_path / "go"
    req = request(log_dir, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"])

    async def scenario():
        handle = await executor.start(req)
        assert executor.probe(req.attempt_dir, handle) is ProcessState.ALIVE
        assert executor.probe(req.attempt_dir, None) is ProcessState.ALIVE
        # the wrapper writes its pid file first thing; until then find_handle says "not yet"
        found = await asyncio.to_thread(wait_until, lambda: executor.find_handle(req.attempt_dir),
                                        "the pid file")
        assert found == handle
        go.touch()
        await executor.wait(req.attempt_dir, handle)
        return handle

    handle = run(scenario())
    assert executor.probe(req.attempt_dir, handle) is ProcessState.ENDED
    assert executor.find_handle(req.attempt_dir) is None
    # a wrapper that died before the receipt: a pid file, no receipt, lock free -> ENDED
    (Path(req.attempt_dir) / "receipt").unlink()
    assert executor.probe(req.attempt_dir, handle) is ProcessState.ENDED
    assert executor.read_receipt(req.attempt_dir) is None


STARTER = textwrap.dedent("""
    import asyncio, json, os, sys
    from qinglong.contracts.execution import (ExecutionSpec, ExecutorContext, StartRequest,
                                              minimal_environment)
    from qinglong.plugins.local_process import create_executor

    log_dir, attempt_dir, go = sys.argv[1:4]
    executor = create_executor(ExecutorContext(log_dir, minimal_environment(None), 1000))
    spec = ExecutionSpec(("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; echo survived; exit 7"))
    handle = asyncio.run(executor.start(StartRequest("r", "a", 1, 0, spec, attempt_dir)))
    print(json.dumps(handle.to_json()), flush=True)
    os._exit(0)  # dies at once: no cleanup, no wait, nothing reaped
""")


def test_a_job_outlives_the_control_plane_that_started_it_and_its_receipt_is_written(
        executor, log_dir, tmp_path, started):
    """If the job died with the control plane (or its outcome were not written), a restart
    would lose the Run's outcome, or a reconciler would run the job a second time."""
    go = tmp_path / "go"
    attempt_dir = log_dir / "survivor"
    starter = subprocess.run([sys.executable, "-c", STARTER, str(log_dir), str(attempt_dir), str(go)],
                             capture_output=True, text=True, timeout=TIMEOUT)
    assert starter.returncode == 0, starter.stderr
    handle = ProcessHandle.from_json(json.loads(starter.stdout))
    started.append((executor, handle))
    # the starter is gone; its wrapper and job live on, holding the Attempt
    assert alive(handle.pid)
    assert executor.probe(str(attempt_dir), None) is ProcessState.ALIVE
    assert wait_until(lambda: executor.find_handle(str(attempt_dir)), "the pid file") == handle
    assert executor.read_receipt(str(attempt_dir)) is None

    async def adopt():
        waiting = asyncio.ensure_future(executor.wait(str(attempt_dir), handle))
        await asyncio.sleep(0)
        assert executor.probe(str(attempt_dir), handle) is ProcessState.ALIVE
        go.touch()
        await waiting

    run(adopt())
    assert executor.probe(str(attempt_dir), handle) is ProcessState.ENDED
    receipt = executor.read_receipt(str(attempt_dir))
    assert (receipt.exit_code, receipt.signal) == (7, None)
    assert (attempt_dir / "log").read_text() == "survived\n"


# ------------------------------------------------------------------------------ busybox

NO_BUSYBOX = pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox is not installed")
WRAPPER_TOOLS = ("sh", "dd", "wc", "mv", "sleep")


def busybox_executor(log_dir: Path, tmp_path: Path, started) -> LocalProcessExecutor:
    """An executor whose wrapper runs under busybox's sh and tools, as on a router."""
    tools_dir = tmp_path / "busybox"
    tools_dir.mkdir(exist_ok=True)
    for tool in WRAPPER_TOOLS:
        if not (tools_dir / tool).exists():
            (tools_dir / tool).symlink_to(shutil.which("busybox"))
    return tracked(LocalProcessExecutor(
        ExecutorContext(str(log_dir), minimal_environment(None), 1_000),
        {tool: str(tools_dir / tool) for tool in WRAPPER_TOOLS}), started)


@pytest.fixture(params=["dash_and_gnu_tools", pytest.param("busybox", marks=NO_BUSYBOX)])
def any_executor(request, log_dir, tmp_path, started) -> LocalProcessExecutor:
    """The executor with the machine's tools, then under busybox (skipped where not installed)."""
    if request.param == "busybox":
        return busybox_executor(log_dir, tmp_path, started)
    return tracked(create_executor(ExecutorContext(str(log_dir), minimal_environment(str(tmp_path)),
                                                   2_000)), started)


@NO_BUSYBOX
def test_the_wrapper_works_under_busybox_sh_and_tools(log_dir, tmp_path, started):
    """Routers run busybox: a wrapper that needs bash or GNU tools would run no job there."""
    executor = busybox_executor(log_dir, tmp_path, started)
    req = request(log_dir, ["sh", "-c", "echo hi; head -c 300000 /dev/zero; exit 4"], log_limit_bytes=1000)
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.log_bytes) == (4, 1000)
    assert receipt.dropped_bytes == 300003 - 1000

    ready = tmp_path / "ready"
    req = request(log_dir, ["sh", "-c", f"touch {ready}; sleep 600"], attempt="a2")

    async def terminate():
        handle = await executor.start(req)
        await asyncio.to_thread(wait_until, ready.exists, "the job")
        assert executor.signal(handle, signal.SIGTERM)
        await executor.wait(req.attempt_dir, handle)

    run(terminate())
    assert executor.read_receipt(req.attempt_dir).signal == signal.SIGTERM


# ---------------------------------------------------------------------- logs, both tool sets


def test_a_running_jobs_log_shows_what_it_printed_before_it_ends(any_executor, log_dir, tmp_path):
    """A log written only when 4 KiB piled up or the job ended shows nothing of a job printing a
    line a minute: `logs --follow` and any look at a running job's log would stay empty for
    hours. The job waits for a file this test creates only once the log showed its output, so
    the output was in the log while the job was alive (or the wait below times out)."""
    executor = any_executor
    go = tmp_path / "go"
    req = request(log_dir, ["sh", "-c", f"echo started; printf 'half a line'; "
                                        f"while [ ! -e {go} ]; do sleep 0.02; done; echo ' and the end'"])
    log = Path(req.attempt_dir) / "log"

    def the_log_shows_both_writes():
        return log.exists() and log.read_bytes() == b"started\nhalf a line"

    async def scenario():
        handle = await executor.start(req)
        await asyncio.to_thread(wait_until, the_log_shows_both_writes,
                                "the running job's output in its log", 30.0)
        assert executor.probe(req.attempt_dir, handle) is ProcessState.ALIVE
        assert executor.read_receipt(req.attempt_dir) is None
        go.touch()
        await executor.wait(req.attempt_dir, handle)

    run(scenario())
    assert log.read_bytes() == b"started\nhalf a line and the end\n"
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.dropped_bytes) == (0, 0)


def test_many_short_writes_across_the_limit_keep_exactly_the_first_bytes_and_count_the_rest(
        any_executor, log_dir):
    """A log that overshoots its limit (or stops short of it), or a wrong dropped count, when the
    output comes in many small writes rather than one stream: a log larger than its cap fills a
    router's flash, a short or miscounted one hides what the job printed."""
    executor = any_executor
    lines = 3000
    expected = b"".join(b"line %d\n" % i for i in range(lines))
    limit = 5_001  # not a multiple of any block size, crossed in the middle of a line
    req = request(log_dir, ["sh", "-c", f'i=0; while [ $i -lt {lines} ]; do echo "line $i"; i=$((i+1)); done'],
                  log_limit_bytes=limit)
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (Path(req.attempt_dir) / "log").read_bytes() == expected[:limit]
    assert (receipt.exit_code, receipt.log_bytes, receipt.dropped_bytes) == (0, limit, len(expected) - limit)


def test_a_log_that_cannot_be_written_still_lets_the_job_run_to_its_end(any_executor, log_dir):
    """A log reader that gave up when the log could not be created would leave the job writing
    to a pipe nobody reads: killed by SIGPIPE, or hung once the pipe is full."""
    executor = any_executor
    req = request(log_dir, ["sh", "-c", "head -c 200000 /dev/zero; echo finished"])
    (Path(req.attempt_dir) / "log").mkdir(parents=True)  # not a file: appending to it fails
    os.chmod(req.attempt_dir, 0o700)
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.signal, receipt.dropped_bytes) == (0, None, 200009)



def test_a_receipt_the_full_filesystem_refuses_is_read_from_the_pid_file(any_executor, tmp_path):
    """The log filesystem fills while the job runs: without a place for its receipt the job's
    exit (3 here) would be lost with it, and the Attempt recorded as if the job had vanished."""
    mount = tmp_path / "logfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        req = request(mount, ["sh", "-c", f"echo begin; dd if=/dev/zero of={mount}/fill bs=4k 2>/dev/null; exit 3"])
        run(start_and_wait(any_executor, req))
        assert not os.path.getsize(Path(req.attempt_dir) / "receipt"), "the receipt was written after all"
        receipt = any_executor.read_receipt(req.attempt_dir)
        assert receipt is not None and (receipt.exit_code, receipt.signal) == (3, None)
        assert "no space left on the log filesystem" in receipt.note, receipt.note
        assert any_executor.probe(req.attempt_dir, None) is ProcessState.ENDED
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ------------------------------------------------------------------------------- waiting


def test_a_cancelled_wait_leaves_the_job_running_and_a_later_wait_sees_its_end(executor, log_dir, tmp_path):
    """Stopping the control plane with on_stop = detach cancels its waits: if that ended or
    orphaned the job's outcome, detaching would lose every running Run."""
    go = tmp_path / "go"
    req = request(log_dir, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 5"])

    async def scenario():
        handle = await executor.start(req)
        waiting = asyncio.ensure_future(executor.wait(req.attempt_dir, handle))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert executor.probe(req.attempt_dir, handle) is ProcessState.ALIVE
        go.touch()
        await executor.wait(req.attempt_dir, handle)

    run(scenario())
    assert executor.read_receipt(req.attempt_dir).exit_code == 5


def test_wait_polls_the_lock_on_a_kernel_without_pidfd(executor, log_dir, tmp_path, monkeypatch):
    """Routers run old kernels: without pidfd, wait must still return when the job ends
    (else every Attempt there would hang in running)."""
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    go = tmp_path / "go"
    req = request(log_dir, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"])

    async def scenario():
        handle = await executor.start(req)
        waiting = asyncio.ensure_future(executor.wait(req.attempt_dir, handle))
        await asyncio.sleep(0)
        assert not waiting.done()
        go.touch()
        await waiting
        return handle

    handle = run(scenario())
    assert executor.read_receipt(req.attempt_dir).exit_code == 0
    wait_until(lambda: read_stat(handle.pid) is None, "the wrapper to be reaped")


# ------------------------------------------------------- files written in place, processes per job


def test_a_pid_file_cut_short_means_never_started_and_the_attempt_still_starts(executor, log_dir):
    """The wrapper writes its pid file in place: one cut short by its death (empty, or without
    its newline) read as a start would record as lost a job that never ran and refuse to run it
    again; read as a pid it would name another process, which a cancel would then signal."""
    req = request(log_dir, ["sh", "-c", "exit 6"])
    attempt = Path(req.attempt_dir)
    attempt.mkdir(parents=True, mode=0o700)
    for cut_short in (b"", b"4", b"4321"):
        (attempt / "pid").write_bytes(cut_short)
        assert executor.probe(req.attempt_dir, None) is ProcessState.NEVER_STARTED, cut_short
        assert executor.find_handle(req.attempt_dir) is None, cut_short
    handle = run(start_and_wait(executor, req))
    assert (attempt / "pid").read_bytes() == b"%d\n6\n" % handle.pid
    assert executor.read_receipt(req.attempt_dir).exit_code == 6
    assert executor.probe(req.attempt_dir, handle) is ProcessState.ENDED


def test_a_receipt_cut_short_counts_as_none_and_an_earlier_wrappers_receipt_is_read(executor, log_dir):
    """The wrapper writes its receipt in place: one read half-written would record a wrong
    outcome (status=137, a KILL, cut to status=1 or 13: a failure with another exit code), so
    every shorter prefix must read as no receipt (the job's outcome is then lost, as when the
    wrapper died before writing it). A receipt of an earlier wrapper (renamed into place, so
    whole, without the last line) must still be read, or a job that ran across an upgrade loses
    its outcome."""
    req = request(log_dir, ["sh", "-c", "printf 123; kill -KILL $$"])
    run(start_and_wait(executor, req))
    path = Path(req.attempt_dir) / "receipt"
    whole = path.read_bytes()
    assert re.fullmatch(rb"format=3\nstatus=137\nheld=\npipe=\d+\nend\n", whole), whole
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.signal) == (None, signal.SIGKILL)
    assert receipt.log_bytes == (Path(req.attempt_dir) / "log").stat().st_size >= 3
    for length in range(len(whole)):
        path.write_bytes(whole[:length])
        assert executor.read_receipt(req.attempt_dir) is None, whole[:length]
        assert executor.probe(req.attempt_dir, None) is ProcessState.ENDED
    path.write_bytes(b"status=3\ndropped=7\n")
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.signal, receipt.dropped_bytes) == (3, None, 7)


def counting_executor(kind: str, tmp_path: Path, log_dir: Path, started, *,
                      report: bool = True) -> tuple[LocalProcessExecutor, Path]:
    """An executor whose ``dd`` and ``wc`` are scripts noting each start in a file, then running
    the real tool (the machine's or busybox's); with ``report=False`` dd's report is thrown away."""
    tools_dir = tmp_path / f"counting-{kind}"
    tools_dir.mkdir(exist_ok=True)
    starts = tools_dir / "starts"
    tools = {}
    for tool in WRAPPER_TOOLS:
        if kind == "busybox":
            real = tools_dir / "busybox" / tool  # busybox runs the applet its link is named
            real.parent.mkdir(exist_ok=True)
            if not real.exists():
                real.symlink_to(shutil.which("busybox"))
            real = str(real)
        else:
            real = shutil.which(tool, path=minimal_environment(None)["PATH"])
        if tool == "sh":
            tools[tool] = real
            continue
        quiet = " 2>/dev/null" if tool == "dd" and not report else ""
        script = tools_dir / f"counted-{tool}"
        script.write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {starts}\nexec {real} \"$@\"{quiet}\n")
        script.chmod(0o700)
        tools[tool] = str(script)
    executor = tracked(LocalProcessExecutor(
        ExecutorContext(str(log_dir), minimal_environment(None), 1_000), tools), started)
    return executor, starts


def helper_starts(starts: Path) -> list[str]:
    """The helpers started since the last look, by name."""
    return sorted(line.split()[0] for line in helper_lines(starts))


def helper_lines(starts: Path) -> list[str]:
    """The helpers started since the last look, each with its arguments."""
    found = starts.read_text().splitlines() if starts.exists() else []
    starts.unlink(missing_ok=True)
    return [line for line in found if line.strip()]


@pytest.mark.parametrize("kind", ["dash_and_gnu_tools", pytest.param("busybox", marks=NO_BUSYBOX)])
def test_a_job_whose_output_ends_before_the_limit_costs_the_wrapper_one_dd_and_no_wc(
        kind, tmp_path, log_dir, started):
    """Every helper process the wrapper starts is paid by every job, and a small router drains
    its queue at the rate of process starts: a silent job or one printing a line must cost one
    dd (which tells the end of the output itself) and no wc; the log and the count stay exact
    when the output runs into the limit, where measuring begins."""
    executor, starts = counting_executor(kind, tmp_path, log_dir, started)
    for attempt, command, log in (("silent", ["true"], b""), ("line", ["echo", "a line"], b"a line\n"),
                                  ("lines", ["sh", "-c", "echo one; sleep 0.05; echo two"], b"one\ntwo\n")):
        req = request(log_dir, command, attempt=attempt)
        run(start_and_wait(executor, req))
        assert (Path(req.attempt_dir) / "log").read_bytes() == log
        assert executor.read_receipt(req.attempt_dir).dropped_bytes == 0
        assert helper_starts(starts) == ["dd"], attempt

    req = request(log_dir, ["sh", "-c", "head -c 300000 /dev/zero"], attempt="over", log_limit_bytes=1000)
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.log_bytes, receipt.dropped_bytes) == (0, 1000, 299_000)
    assert "wc" in helper_starts(starts)


@pytest.mark.parametrize("kind", ["dash_and_gnu_tools", pytest.param("busybox", marks=NO_BUSYBOX)])
def test_without_dds_report_the_log_reader_measures_and_stays_exact(kind, tmp_path, log_dir, started):
    """The reader learns the end of the output from dd's report; a dd reporting nothing (or in
    words the reader does not know) must not end the copy early (a truncated log, a job killed by
    SIGPIPE) nor overshoot the limit: the reader then measures the log as it always could."""
    executor, starts = counting_executor(kind, tmp_path, log_dir, started, report=False)
    req = request(log_dir, ["sh", "-c", "echo one; sleep 0.05; echo two"], attempt="small")
    run(start_and_wait(executor, req))
    assert (Path(req.attempt_dir) / "log").read_bytes() == b"one\ntwo\n"
    assert executor.read_receipt(req.attempt_dir).dropped_bytes == 0
    lines = 3000
    expected = b"".join(b"line %d\n" % i for i in range(lines))
    req = request(log_dir, ["sh", "-c", f'i=0; while [ $i -lt {lines} ]; do echo "line $i"; i=$((i+1)); done'],
                  attempt="over", log_limit_bytes=5_001)
    run(start_and_wait(executor, req))
    receipt = executor.read_receipt(req.attempt_dir)
    assert (Path(req.attempt_dir) / "log").read_bytes() == expected[:5_001]
    assert (receipt.exit_code, receipt.dropped_bytes) == (0, len(expected) - 5_001)
    assert "wc" in helper_starts(starts)


# ------------------------------------------------------------------------------ the fence


def test_a_fenced_job_is_killed_with_its_whole_group_once_its_fence_passes_unrenewed(any_executor, log_dir):
    """A cluster worker's job must not outlive its lease: were the fence not enforced by the
    wrapper itself, a job whose worker stopped renewing would run on beside its retry on
    another worker (one Run executed twice at once). The job and its child are gone, no receipt
    claims an outcome, and nothing was killed before the fence."""
    fence = time.monotonic() + 1.5
    req = replace(request(log_dir, ["sh", "-c", "sleep 600 & sleep 600; wait"]), fence_deadline_mono=fence)
    before = time.monotonic()
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    after = time.monotonic()
    handle = run(any_executor.start(req))
    took = time.monotonic() - after
    wait_until(lambda: len(group_members(handle.pgid)) >= 3, "the job and its child to start")
    # The fence as written: an instant of /proc/uptime in centiseconds, never later than asked,
    # and earlier only by its rounding (two centiseconds) and the writer's own delay between its
    # two clock reads (within the start). /proc/uptime - monotonic lies in [low, high].
    fence_cs = int((Path(req.attempt_dir) / "fence").read_text())
    low, high = uptime - after, uptime + 0.01 - before
    assert (fence + low - 0.02 - took) * 100 <= fence_cs <= (fence + high) * 100
    # and the wrapper must not kill before that instant in its own clock
    run(any_executor.wait(req.attempt_dir, handle))
    with open("/proc/uptime") as f:
        assert round(float(f.read().split()[0]) * 100) >= fence_cs
    wait_until(lambda: group_members(handle.pgid) == [], "every process of the group to be gone")
    assert any_executor.read_receipt(req.attempt_dir) is None


def test_a_renewed_fence_keeps_the_job_running_and_its_watcher_ends_with_the_job(any_executor, log_dir, tmp_path):
    """Renewal is what keeps a healthy worker's job alive: a watcher that ignored the renewed
    fence would kill every job longer than one heartbeat's lease (runs lost on every worker);
    one that outlived its job would leak a process per Attempt."""
    go = tmp_path / "go"
    first = time.monotonic() + 1.5
    req = replace(request(log_dir, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 3"]),
                  fence_deadline_mono=first)
    handle = run(any_executor.start(req))
    any_executor.renew_fence(req.attempt_dir, time.monotonic() + 60)
    wait_until(lambda: time.monotonic() > first + 2.5, "the first fence to lie well behind")
    assert any_executor.probe(req.attempt_dir, handle) is ProcessState.ALIVE
    go.touch()
    run(any_executor.wait(req.attempt_dir, handle))
    receipt = any_executor.read_receipt(req.attempt_dir)
    assert receipt is not None and receipt.exit_code == 3
    wait_until(lambda: group_members(handle.pgid) == [], "the watcher to end with the job")


def test_a_fenced_job_dies_at_its_fence_even_when_the_process_that_started_it_was_killed(log_dir, tmp_path):
    """kill -9 of a worker leaves nobody to stop its jobs: the fence in the Attempt directory
    does it. Without it the job of a SIGKILLed worker runs on past the lease into its retry."""
    starter = textwrap.dedent(f"""
        import asyncio, os, sys, time
        from qinglong.contracts.execution import ExecutionSpec, ExecutorContext, StartRequest, minimal_environment
        from qinglong.plugins.local_process import create_executor
        ex = create_executor(ExecutorContext({str(log_dir)!r}, minimal_environment(None), 1000))
        req = StartRequest("run-1", "a1", 1, 0, ExecutionSpec(("sleep", "600")), {str(log_dir / "a1")!r},
                           fence_deadline_mono=time.monotonic() + 2.0)
        handle = asyncio.run(ex.start(req))
        print(handle.pgid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(proc.stdout.readline())
        wait_until(lambda: len(group_members(pgid)) >= 2, "the job to start")
        proc.kill()
        proc.wait()
        wait_until(lambda: group_members(pgid) == [], "the orphaned job to be killed at its fence")
    finally:
        proc.kill()
        proc.wait()
    assert not (log_dir / "a1" / "receipt").exists()


def test_a_wrapper_whose_helpers_die_of_a_signal_still_ends_and_writes_its_receipt(any_executor, log_dir):
    """The wrapper waits for its log reader and its fence watcher; a shell answers a wait on a
    child killed by a signal with 128+N, the same as a wait cut short by a trapped signal, and
    dash repeats it on every later wait. A wrapper looping on that status spins forever: the Run
    stays running with its lease renewed, and its real outcome is never recorded. Here the job
    itself KILLs both helpers (the watcher can also die of the wrapper's USR1 before its trap is
    set, in a job that ends at once)."""
    killer = ("import os, signal\n"
              "me, parent = os.getpid(), os.getppid()\n"
              "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
              "    try:\n"
              "        stat = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
              "    except OSError:\n"
              "        continue\n"
              "    if int(stat[1]) == parent and pid != me:\n"
              "        os.kill(pid, signal.SIGKILL)\n"
              "raise SystemExit(5)\n")
    req = replace(request(log_dir, ["python3", "-c", killer]), fence_deadline_mono=time.monotonic() + 60)
    handle = run(any_executor.start(req))
    run(any_executor.wait(req.attempt_dir, handle))
    receipt = any_executor.read_receipt(req.attempt_dir)
    assert receipt is not None and receipt.exit_code == 5
    wait_until(lambda: group_members(handle.pgid) == [], "the group to be gone")


@pytest.mark.parametrize("kind", ["dash_and_gnu_tools", pytest.param("busybox", marks=NO_BUSYBOX)])
def test_the_fence_watcher_sleeps_until_the_fence_not_once_a_second(kind, tmp_path, log_dir, started):
    """A cluster worker pays every process its jobs' watchers start: one ``sleep`` a second per
    running job is a process start a second per slot, for the job's whole life. The watcher
    sleeps until its fence (renewed here: still one long sleep, then its USR1 at the job's end)."""
    executor, starts = counting_executor(kind, tmp_path, log_dir, started)
    go = tmp_path / "go"
    began = time.monotonic()
    req = replace(request(log_dir, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 3"]),
                  fence_deadline_mono=began + 60)
    handle = run(executor.start(req))
    executor.renew_fence(req.attempt_dir, began + 90)
    wait_until(lambda: time.monotonic() > began + 3.5, "the job to run over three seconds")
    assert executor.probe(req.attempt_dir, handle) is ProcessState.ALIVE
    go.touch()
    run(executor.wait(req.attempt_dir, handle))
    assert executor.read_receipt(req.attempt_dir).exit_code == 3
    # the drain's short naps (<= 0.2 s, only when the reader is slow to end) are not the watcher's
    naps = [line for line in helper_lines(starts) if line.startswith("sleep ") and float(line.split()[1]) > 0.2]
    assert naps == [f"sleep {FENCE_NAP_CS // 100}.00"], naps


def test_a_receipt_counts_up_to_its_end_line_with_the_readers_dropped_line_before_it(executor, log_dir):
    """The log reader writes its dropped count into the receipt before the wrapper's block: every
    prefix of the whole must still read as no receipt (a half-written one would record a wrong
    outcome), and a line a reader still running under orphans = leave appends after ``end``
    must not turn a whole receipt into none (the Run's outcome lost)."""
    req = request(log_dir, ["sh", "-c", "head -c 5000 /dev/zero; exit 2"], log_limit_bytes=1000)
    run(start_and_wait(executor, req))
    path = Path(req.attempt_dir) / "receipt"
    whole = path.read_bytes()
    assert re.fullmatch(rb"dropped=4000\nformat=3\nstatus=2\nheld=\npipe=\d+\nend\n", whole), whole
    receipt = executor.read_receipt(req.attempt_dir)
    assert (receipt.exit_code, receipt.log_bytes, receipt.dropped_bytes) == (2, 1000, 4000)
    for length in range(len(whole)):
        path.write_bytes(whole[:length])
        assert executor.read_receipt(req.attempt_dir) is None, whole[:length]
    path.write_bytes(whole + b"dropped=9999\n")
    assert executor.read_receipt(req.attempt_dir).dropped_bytes == 4000


FORMAT_2_WRAPPER = (Path(__file__).parent / "wrapper_format2.sh").read_text()


def start_a_format_2_wrapper(attempt: Path, argv: list[str], log_limit: int) -> subprocess.Popen:
    """What the previous executor did: a ``lock`` file held across the spawn, the ``out`` FIFO,
    and the previous wrapper's text."""
    tools = find_tools()
    script = FORMAT_2_WRAPPER
    for name in ("dd", "wc", "sleep"):
        script = script.replace(f"@{name.upper()}@", tools[name])
    attempt.mkdir(parents=True, mode=0o700)
    os.mkfifo(attempt / "out", 0o600)
    lock = os.open(attempt / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.Popen([tools["sh"], "-c", script, "qinglong-job", str(attempt), str(log_limit),
                                 "2000", "kill", "--", *argv], stdin=lock, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(lock)


def test_a_job_started_by_the_previous_wrapper_is_adopted_and_read_after_an_upgrade(
        executor, log_dir, tmp_path, started):
    """An upgrade restarts the control plane while jobs of the previous wrapper run: if the new
    executor did not see their lock, it would report them ended (their Runs lost or started a
    second time); if it could not read their directory, their outcome, end time and dropped
    count would be lost."""
    go = tmp_path / "go"
    attempt = log_dir / "old"
    proc = start_a_format_2_wrapper(attempt, ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; "
                                                          "head -c 3000 /dev/zero; exit 4"], 1000)
    handle = wait_until(lambda: executor.find_handle(str(attempt)), "the previous wrapper's pid file")
    started.append((executor, handle))
    assert handle.pid == proc.pid
    assert executor.probe(str(attempt), None) is ProcessState.ALIVE
    assert executor.read_receipt(str(attempt)) is None
    with pytest.raises(StartError):
        run(executor.start(StartRequest("run-1", "old", 1, 0, ExecutionSpec(("true",)), str(attempt))))

    async def adopt():
        waiting = asyncio.ensure_future(executor.wait(str(attempt), handle))
        await asyncio.sleep(0)
        assert not waiting.done()
        go.touch()
        await waiting

    run(adopt())
    proc.wait(TIMEOUT)
    assert executor.probe(str(attempt), handle) is ProcessState.ENDED
    assert (attempt / "receipt").read_text().startswith("format=2\n")
    receipt = executor.read_receipt(str(attempt))
    assert (receipt.exit_code, receipt.signal, receipt.log_bytes, receipt.dropped_bytes) == (4, None, 1000, 2000)
    assert receipt.ended_at_ms == (attempt / "exited").stat().st_mtime_ns // 1_000_000
    assert executor.find_handle(str(attempt)) is None
