"""A running Attempt whose recorded process handle fails verification: its cancel is resolved
through the process holding the Attempt's lock, or, when none can be verified, said (an error
diagnostic, the Attempt's record, `runs show`) instead of staying pending in silence."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3

from dispatcher_helpers import marker_script, running, state_of, until, wait_for_go, wrapper_pid, write_settings

from qinglong.contracts.execution import CancelReason
from qinglong.host.cli.main import main


def _corrupt_handle(db, run_id: str) -> None:
    """Make the recorded handle name another process start (as after a pid was reused)."""
    with sqlite3.connect(db) as conn:
        (raw,) = conn.execute("SELECT handle_json FROM attempts WHERE run_id = ? AND state = 'running'",
                              (run_id,)).fetchone()
        handle = json.loads(raw)
        handle["start_ticks"] += 12345
        conn.execute("UPDATE attempts SET handle_json = ? WHERE run_id = ?", (json.dumps(handle), run_id))


async def _started(settings, tmp_path) -> tuple[str, str]:
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    async with running(settings) as h:  # stopped with on_stop = "detach": the job runs on
        await h.put_task("long", marker_script(marks, wait_for_go(tmp_path / "GO")))
        run_id = await h.admit("long")
        detail = await h.until_state(run_id, "running")
        return run_id, detail.attempts[-1].attempt_dir


def test_a_cancel_reaches_the_lock_holder_when_the_recorded_handle_fails_verification(tmp_path):
    """The job would run on with its cancel pending forever (nothing signalled, nothing said),
    holding `forbid`/`queue` behind it."""
    settings = write_settings(tmp_path, level="error")
    run_id, attempt_dir = asyncio.run(_started(settings, tmp_path))
    pid = wrapper_pid(attempt_dir)
    _corrupt_handle(tmp_path / "q.db", run_id)

    async def body() -> None:
        async with running(settings) as h:
            await h.store.request_cancel(run_id, CancelReason.OPERATOR, 0)
            h.dispatcher.wake()
            detail = await h.until_ended(run_id)
            assert state_of(detail.run.state) == "cancelled", detail

    try:
        asyncio.run(body())
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_run_that_cannot_be_stopped_says_so_in_its_record_and_an_error(tmp_path, capfd):
    """A cancel that can reach nothing must not look pending: the operator would wait for a stop
    that never comes, while an unrelated process is rightly left alone. `runs` and `runs --json`
    say it too, not a plain `running`."""
    settings = write_settings(tmp_path, level="error")
    run_id, attempt_dir = asyncio.run(_started(settings, tmp_path))
    pid = wrapper_pid(attempt_dir)
    _corrupt_handle(tmp_path / "q.db", run_id)
    with open(os.path.join(attempt_dir, "pid"), "w") as f:  # no verifiable holder either
        f.write(f"{os.getpid()}\n")

    async def body() -> None:
        async with running(settings) as h:
            await h.store.request_cancel(run_id, CancelReason.OPERATOR, 0)
            h.dispatcher.wake()

            async def noted():
                attempt = (await h.detail(run_id)).attempts[-1]
                return attempt.reason if attempt.reason and "cannot be stopped" in attempt.reason else None
            await until(noted, "the Attempt's record to say it cannot be stopped")
            assert await h.state(run_id) == "running"

    try:
        asyncio.run(body())
        assert "execution.handle_unverified" in capfd.readouterr().err
        main(["runs", "show", run_id, "--settings", str(settings)])
        shown = capfd.readouterr().out
        assert "cannot be stopped" in shown
        # the recorded pid may be an unrelated process now: the operator is pointed at the
        # attempt directory and told not to signal that pid
        assert attempt_dir in shown and "do not signal pid" in shown, shown
        # the listing too: a plain `running` there is the silence this note ends
        assert main(["runs", "--settings", str(settings)]) == 0
        assert "cannot be stopped" in capfd.readouterr().out
        assert main(["runs", "--json", "--settings", str(settings)]) == 0
        (listed,) = [r for r in json.loads(capfd.readouterr().out) if r["run_id"] == run_id]
        assert listed["state"] == "running" and "cannot be stopped" in listed["reason"], listed
    finally:
        os.killpg(pid, signal.SIGKILL)
