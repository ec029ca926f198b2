"""The dispatcher surviving its own control plane's crash: a job keeps running when ``qinglong run``
is killed -9, and the next start re-adopts it (same process) and records its outcome once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from qinglong.contracts.execution import StartRequest, parse_execution_spec
from qinglong.host.containers import build_container, create_executors, executor_context
from qinglong.host.settings import load_settings

from dispatcher_helpers import (
    WAIT_S,
    marker_script,
    now_ms,
    opened,
    process_alive,
    put_task,
    running,
    state_of,
    until,
    wait_for_go,
    wrapper_pid,
    write_settings,
)

REPO = Path(__file__).resolve().parents[2]


def _control_plane(root: Path, settings: Path, name: str) -> tuple[subprocess.Popen, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env["QINGLONG_SETTINGS"] = str(settings)
    stderr = root / f"stderr-{name}"
    with stderr.open("wb") as out:
        child = subprocess.Popen([sys.executable, "-m", "qinglong", "run"], cwd=root, env=env,
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    return child, stderr


def _wait_ready(child: subprocess.Popen, stderr: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while "lifecycle.admission_open" not in stderr.read_text(errors="replace"):
        assert child.poll() is None, f"qinglong run ended early:\n{stderr.read_text(errors='replace')}"
        assert time.monotonic() < deadline, "qinglong run did not start"
        time.sleep(0.05)


def test_a_live_job_is_readopted_after_the_control_plane_is_killed_and_recorded_once(tmp_path):
    """kill -9 of ``qinglong run`` while a job runs: the job must keep running (not die with its
    parent), and the next start must re-adopt that same process and record its real exit code
    once — not run it again (a second marker), not declare it lost, not record it twice."""
    marks, go = tmp_path / "marks", tmp_path / "GO"
    marks.mkdir()
    settings = write_settings(tmp_path, level="info")

    async def admit() -> str:
        async with opened(settings) as backend:
            await put_task(backend, "long", marker_script(marks, f"{wait_for_go(go)}; exit 5"))
            run_id, _ = await backend.execution().admit_manual_run("p", "long", "crash-me", now_ms())
            return run_id

    async def detail(run_id: str):
        async with opened(settings) as backend:
            return await backend.execution().run_detail(run_id)

    run_id = asyncio.run(admit())
    first, stderr = _control_plane(tmp_path, settings, "first")
    second = None
    try:
        running_detail = asyncio.run(until_running(detail, run_id))
        attempt = running_detail.attempts[0]
        pid = wrapper_pid(attempt.attempt_dir)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=WAIT_S)
        assert process_alive(pid), "the job died with its control plane"

        second, stderr = _control_plane(tmp_path, settings, "second")
        _wait_ready(second, stderr)
        text = stderr.read_text(errors="replace")
        assert "execution.reconciled: attempts left by an earlier run settled [adopted=1 recorded=0" in text
        assert state_of(asyncio.run(detail(run_id)).run.state) == "running"
        go.touch()
        ended = asyncio.run(until_ended(detail, run_id))
        assert state_of(ended.run.state) == "failed" and ended.run.exit_code == 5
        assert [a.attempt_id for a in ended.attempts] == [attempt.attempt_id]
        assert sorted(p.name for p in marks.iterdir()) == [attempt.attempt_id]
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=WAIT_S) == 0
    finally:
        for child in (first, second):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()


async def until_running(detail, run_id):
    async def reached():
        d = await detail(run_id)
        return d if state_of(d.run.state) == "running" else None
    return await until(reached, "the run running under the first control plane")


async def until_ended(detail, run_id):
    async def reached():
        d = await detail(run_id)
        return d if state_of(d.run.state) in {"succeeded", "failed", "timed_out", "cancelled", "lost"} else None
    return await until(reached, "the run ended under the second control plane")


def test_a_process_spawned_but_not_recorded_running_is_adopted_with_its_handle(tmp_path):
    """A crash after the spawn and before the running commit: the reconciler must find the live
    process's handle and adopt it, so the job is neither started a second time nor lost."""
    marks, go = tmp_path / "marks", tmp_path / "GO"
    marks.mkdir()
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with opened(settings) as backend:
            command = marker_script(marks, f"{wait_for_go(go)}; exit 0")
            await put_task(backend, "long", command)
            store = backend.execution()
            run_id, _ = await store.admit_manual_run("p", "long", "spawned", now_ms())
            [candidate] = await store.dispatch_candidates(now_ms(), 10)
            loaded = load_settings(settings)
            container = build_container(loaded)
            context = executor_context(loaded, container.backend_settings())
            executor = create_executors(container.plugin_host(), context)["local_process"]
            attempt_dir = os.path.join(context.log_dir, candidate.attempt_id)
            assert await store.begin_dispatch(candidate.attempt_id, attempt_dir, now_ms() + 60_000, now_ms())
            handle = await executor.start(StartRequest(run_id, candidate.attempt_id, 1, candidate.scheduled_for_ms,
                                                       candidate.spec or parse_execution_spec("long", {"command": command}),
                                                       attempt_dir))
            # the control plane "dies" here: the running commit never happens
        async with running(settings) as h:
            assert h.dispatcher.stats.reconciled["adopted"] == 1
            detail = await h.detail(run_id)
            assert state_of(detail.run.state) == "running"
            assert wrapper_pid(detail.attempts[0].attempt_dir) == handle.pid
            go.touch()
            ended = await h.until_ended(run_id)
            assert state_of(ended.run.state) == "succeeded" and len(ended.attempts) == 1
        assert sorted(p.name for p in marks.iterdir()) == [candidate.attempt_id]

    asyncio.run(body())


def test_a_job_that_ended_while_no_control_plane_ran_is_recorded_from_its_receipt(tmp_path):
    """A job finishing while ``qinglong run`` is down: the next start must take its exit code from
    the receipt the wrapper left (not call it lost, not run it again)."""
    marks, go = tmp_path / "marks", tmp_path / "GO"
    marks.mkdir()
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", marker_script(marks, f"{wait_for_go(go)}; echo done; exit 6"))
            run_id = await h.admit("long")
            attempt_dir = (await h.until_state(run_id, "running")).attempts[0].attempt_dir
        go.touch()  # detached: the job ends with no control plane watching
        await until(lambda: os.path.exists(os.path.join(attempt_dir, "receipt")), "the receipt written")
        async with running(settings) as h:
            assert h.dispatcher.stats.reconciled["recorded"] == 1
            ended = await h.detail(run_id)
            assert state_of(ended.run.state) == "failed" and ended.run.exit_code == 6
            assert len(ended.attempts) == 1
        assert len(list(marks.iterdir())) == 1

    asyncio.run(body())


def test_a_job_whose_waiter_died_without_a_receipt_is_lost_with_the_reason_and_not_retried(tmp_path):
    """The job and its wrapper killed together while ``qinglong run`` is down leave no receipt:
    its fate is unknown, so the Attempt must end lost with the reason, never succeeded, and a task
    that is not idempotent must not run again (it may have done its work)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", marker_script(marks, "sleep 600"), retry={"max_attempts": 3})
            run_id = await h.admit("long")
            attempt_dir = (await h.until_state(run_id, "running")).attempts[0].attempt_dir
            pgid = wrapper_pid(attempt_dir)
            # the job has begun its work (on a loaded machine it may not have run its first line
            # when the Attempt reads running): only then would a second run of it be a duplicate
            await until(lambda: any(marks.iterdir()), "the job's marker")
        os.killpg(pgid, signal.SIGKILL)
        await until(lambda: not process_alive(pgid), "the wrapper gone")
        async with running(settings) as h:
            ended = await h.until_ended(run_id)
            assert state_of(ended.run.state) == "lost" and len(ended.attempts) == 1
            assert "receipt" in (ended.attempts[0].reason or "")
        assert len(list(marks.iterdir())) == 1

    asyncio.run(body())
