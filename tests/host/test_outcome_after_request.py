"""A timeout or cancel request that lands between a job's exit and the record of its outcome:
the job's own exit stands when it came first, and `runs` says why a request's state sits beside
an exit code when it came after."""

from __future__ import annotations

import asyncio

from dispatcher_helpers import now_ms, running, state_of, until, write_settings

from qinglong.contracts.execution import Actor, CancelReason

from qinglong.host.cli.main import main


def test_a_job_that_exited_0_before_its_timeout_was_requested_succeeds(tmp_path):
    """Recorded `timed_out` with exit 0, the job's completed work is reported as a timeout (and
    a retried timeout runs it again)."""
    # the helper left in the job's group holds its output past the 1 s timeout; the drain (5 s)
    # is what keeps the outcome unrecorded when the request lands
    settings = write_settings(tmp_path, orphan_drain_ms=5_000)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("quick", ["sh", "-c", "sleep 30 & exit 0"], timeout_ms=1_000)
            run_id = await h.admit("quick")
            detail = await h.until_ended(run_id)
            (attempt,) = detail.attempts
            assert attempt.cancel_reason == "timeout", "the request must have landed for this test"
            assert state_of(detail.run.state) == "succeeded" and detail.run.exit_code == 0, detail

    asyncio.run(body())


def test_runs_says_a_timed_out_run_beside_exit_0_exited_after_the_request(tmp_path, capsys):
    """`timed_out` beside exit 0 with no word of why reads as a contradiction: the operator
    cannot tell a job that finished from one that was stopped."""
    settings = write_settings(tmp_path)
    ready = tmp_path / "ready"

    async def body() -> str:
        async with running(settings) as h:
            await h.put_task("polite", ["sh", "-c", f"trap 'exit 0' TERM; touch {ready}; "
                                                   "while :; do sleep 0.05; done"], timeout_ms=1_000)
            run_id = await h.admit("polite")
            detail = await h.until_ended(run_id)
            assert state_of(detail.run.state) == "timed_out" and detail.run.exit_code == 0
            assert "exited 0 after the request" in detail.attempts[0].reason
            return run_id

    run_id = asyncio.run(body())
    capsys.readouterr()
    assert main(["runs", "--settings", str(settings)]) == 0
    assert "timed_out (exited 0 after the request)" in capsys.readouterr().out
    assert main(["runs", "show", run_id, "--settings", str(settings)]) == 0
    assert f"run {run_id}: timed_out (exited 0 after the request)" in capsys.readouterr().out


def test_a_cancel_after_the_jobs_exit_leaves_its_exit_and_runs_show_says_why(tmp_path, capsys):
    """An operator's cancel that lands while a finished job's output is still drained: recorded
    `cancelled`, the job's completed work would be reported as stopped; shown beside `succeeded`
    as a bare "cancel requested", it reads as a cancel the control plane ignored."""
    settings = write_settings(tmp_path, orphan_drain_ms=5_000)

    async def body() -> str:
        async with running(settings) as h:
            await h.put_task("quick", ["sh", "-c", "sleep 30 & exit 0"], timeout_ms=3_600_000)
            run_id = await h.admit("quick")
            attempt_dir = (await h.until_state(run_id, "running")).attempts[-1].attempt_dir

            def exited() -> bool:  # the wrapper appends the job's status to its pid file
                try:
                    return open(f"{attempt_dir}/pid").read().count("\n") >= 2
                except FileNotFoundError:
                    return False
            await until(exited, "the job's own exit")
            await h.store.request_cancel(run_id, CancelReason.OPERATOR, now_ms(), Actor.OPERATOR)
            h.dispatcher.wake()
            detail = await h.until_ended(run_id)
            (attempt,) = detail.attempts
            assert attempt.cancel_reason == "operator"
            assert state_of(detail.run.state) == "succeeded" and detail.run.exit_code == 0, detail
            return run_id

    run_id = asyncio.run(body())
    capsys.readouterr()
    assert main(["runs", "show", run_id, "--settings", str(settings)]) == 0
    out = capsys.readouterr().out
    assert "cancel requested (operator) after the job had ended: its own exit is the outcome" in out, out


def test_runs_show_says_a_timeout_after_the_jobs_exit_beside_what_its_helpers_did(tmp_path, capsys):
    """The Attempt has a reason of its own (the helper it left held its output and was sent
    TERM): shown alone, it hid that the timeout fired after the job's end, so `succeeded` beside
    a stopped helper read as if the timeout had never fired, or had ended the job."""
    settings = write_settings(tmp_path, orphan_drain_ms=5_000)

    async def body() -> str:
        async with running(settings) as h:
            await h.put_task("quick", ["sh", "-c", "sleep 30 & exit 0"], timeout_ms=1_000)
            run_id = await h.admit("quick")
            detail = await h.until_ended(run_id)
            (attempt,) = detail.attempts
            assert attempt.cancel_reason == "timeout" and attempt.reason, attempt
            return run_id

    run_id = asyncio.run(body())
    capsys.readouterr()
    assert main(["runs", "show", run_id, "--settings", str(settings)]) == 0
    out = capsys.readouterr().out
    assert "held its output" in out, out
    assert "cancel requested (timeout) after the job had ended: its own exit is the outcome" in out, out
