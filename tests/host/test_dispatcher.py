"""The dispatcher on a real SQLite file, with the real edge backend and the real ``local_process``
executor: Runs run once, within the limits, under their overlap policy and timeout, with their
retries; a stop detaches or terminates; retention deletes old logs and leaves a tombstone."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from qinglong.contracts.errors import NotFound

from dispatcher_helpers import (
    group_members,
    marker_script,
    max_overlap,
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


@pytest.fixture
def marks(tmp_path):
    path = tmp_path / "marks"
    path.mkdir()
    return path


def _markers(marks) -> list[str]:
    return sorted(p.name for p in marks.iterdir())


def test_a_job_runs_once_and_its_exit_code_and_output_are_recorded(tmp_path, marks):
    """Without this a Run could run twice (two markers), or end with an invented outcome: a
    failing job shown as succeeded, or its exit code and output lost."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("ok", marker_script(marks, "echo hello from the job; exit 0"))
            await h.put_task("bad", marker_script(marks, "echo about to fail >&2; exit 7"))
            ok, bad = await h.admit("ok"), await h.admit("bad")
            ok_detail, bad_detail = await h.until_ended(ok), await h.until_ended(bad)
            assert state_of(ok_detail.run.state) == "succeeded" and ok_detail.run.exit_code == 0
            assert state_of(bad_detail.run.state) == "failed" and bad_detail.run.exit_code == 7
            assert len(ok_detail.attempts) == 1 and len(bad_detail.attempts) == 1
            log = open(f"{ok_detail.attempts[0].attempt_dir}/log", "rb").read()
            assert b"hello from the job" in log
            assert b"about to fail" in open(f"{bad_detail.attempts[0].attempt_dir}/log", "rb").read()
            assert _markers(marks) == sorted([ok_detail.attempts[0].attempt_id, bad_detail.attempts[0].attempt_id])

    asyncio.run(body())


def test_no_more_processes_run_at_once_than_max_running(tmp_path, marks):
    """The global limit is what keeps a router from being swamped: if it leaked, a backlog of
    Runs would start all at once."""
    settings = write_settings(tmp_path, max_running=2)
    lines = tmp_path / "lines"
    job = marker_script(marks, f"echo start >> {lines}; sleep 0.3; echo end >> {lines}")

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("work", job)
            runs = [await h.admit("work") for _ in range(6)]
            details = [await h.until_ended(run) for run in runs]
            assert [state_of(d.run.state) for d in details] == ["succeeded"] * 6
            assert all(len(d.attempts) == 1 for d in details)

    asyncio.run(body())
    sequence = lines.read_text().split()
    assert len(sequence) == 12
    assert 1 <= max_overlap(sequence) <= 2
    assert len(_markers(marks)) == 6


def _long_job(tmp_path, marks) -> list[str]:
    lines, go = tmp_path / "lines", tmp_path / "GO"
    return marker_script(marks, f'echo "start $QINGLONG_RUN_ID" >> {lines}; {wait_for_go(go)}; '
                                f'echo "end $QINGLONG_RUN_ID" >> {lines}')


def _lines(tmp_path) -> list[str]:
    path = tmp_path / "lines"
    return path.read_text().splitlines() if path.exists() else []


def test_forbid_skips_a_run_due_while_the_previous_one_still_runs(tmp_path, marks):
    """A job outlasting its period must not overlap itself under 'forbid': the later Run is
    skipped with its reason recorded, never run beside the first (two processes) nor lost in
    silence."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", _long_job(tmp_path, marks), concurrency="forbid")
            first = await h.admit("long")
            await h.until_state(first, "running")
            second = await h.admit("long")

            async def skipped():
                return [k for k in await h.store.recent_run_skips() if k.run_id == second]
            (record,) = await until(skipped, "the second Run recorded as a skip")
            assert "forbid" in record.reason
            with pytest.raises(NotFound):
                await h.detail(second)
            assert await h.state(first) == "running"
            (tmp_path / "GO").touch()
            assert state_of((await h.until_ended(first)).run.state) == "succeeded"
        assert len(_markers(marks)) == 1

    asyncio.run(body())


def test_replace_cancels_the_running_run_and_starts_the_new_one(tmp_path, marks):
    """Under 'replace' the newer Run must take over: the old process is stopped (its Run
    cancelled as replaced, not failed or lost) before the new one starts, never both at once."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", _long_job(tmp_path, marks), concurrency="replace")
            first = await h.admit("long")
            old = await h.until_state(first, "running")
            old_pgid = wrapper_pid(old.attempts[0].attempt_dir)
            second = await h.admit("long")
            replaced = await h.until_ended(first)
            assert state_of(replaced.run.state) == "cancelled"
            assert replaced.attempts[0].cancel_reason == "replaced"
            await h.until_state(second, "running")
            await until(lambda: not group_members(old_pgid), "the replaced job's group gone")
            (tmp_path / "GO").touch()
            assert state_of((await h.until_ended(second)).run.state) == "succeeded"
        starts = [line for line in _lines(tmp_path) if line.startswith("start")]
        assert starts == [f"start {first}", f"start {second}"]

    asyncio.run(body())


def test_queue_runs_the_waiting_runs_one_at_a_time_in_scheduled_order(tmp_path, marks):
    """Under 'queue' a Run due while the previous one runs waits (neither skipped nor run
    beside it) and they then run one by one in order."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", _long_job(tmp_path, marks), concurrency="queue")
            first = await h.admit("long")
            await h.until_state(first, "running")
            second, third = await h.admit("long"), await h.admit("long")
            await h.passes_after(3)
            assert [await h.state(second), await h.state(third)] == ["queued", "queued"]
            (tmp_path / "GO").touch()
            for run in (first, second, third):
                assert state_of((await h.until_ended(run)).run.state) == "succeeded"
            # dispatch order: scheduled time, then admission, then run id (two manual Runs admitted
            # in one millisecond are ordered by their ids)
            later = sorted([(await h.detail(run)).run for run in (second, third)],
                           key=lambda r: (r.scheduled_for_ms, r.admitted_at_ms, r.run_id))
            order = [first] + [r.run_id for r in later]
        assert _lines(tmp_path) == [f"{what} {run}" for run in order for what in ("start", "end")]

    asyncio.run(body())


def test_allow_runs_a_due_run_beside_the_one_still_running(tmp_path, marks):
    """Under 'allow' (the default) a Run due while the previous one runs starts at once: holding
    it back would make a long job delay every later occurrence."""
    settings = write_settings(tmp_path, max_running=2)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", _long_job(tmp_path, marks))
            first = await h.admit("long")
            await h.until_state(first, "running")
            second = await h.admit("long")
            await h.until_state(second, "running")
            assert await h.state(first) == "running"
            # `running` is recorded at the spawn; both jobs must have begun before either may end,
            # or a slow second start would read as no overlap
            await until(lambda: len([line for line in _lines(tmp_path) if line.startswith("start")]) == 2,
                        "both jobs to begin")
            (tmp_path / "GO").touch()
            for run in (first, second):
                assert state_of((await h.until_ended(run)).run.state) == "succeeded"
        assert max_overlap([line.split()[0] for line in _lines(tmp_path)]) == 2

    asyncio.run(body())


def test_a_timeout_ends_the_run_timed_out_and_kills_its_whole_process_group(tmp_path, marks):
    """``sleep 600`` with a 1 s timeout, TERM ignored: without the durable request, the group
    signals and the KILL after the grace, the Run would hang for ten minutes, or end while a
    grandchild keeps running unseen."""
    settings = write_settings(tmp_path, kill_grace_ms=300)
    grandchild = tmp_path / "grandchild"

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("slow", marker_script(
                marks, f"trap '' TERM; sleep 600 & echo $! > {grandchild}; sleep 600"), timeout_ms=1000)
            run = await h.admit("slow")
            started = await h.until_state(run, "running")
            pgid = wrapper_pid(started.attempts[0].attempt_dir)
            await until(grandchild.exists, "the grandchild's pid written")
            ended = await h.until_ended(run)
            assert state_of(ended.run.state) == "timed_out"
            assert ended.attempts[0].cancel_reason == "timeout" and len(ended.attempts) == 1
            await until(lambda: not group_members(pgid), "the job's whole process group gone")
            assert not process_alive(int(grandchild.read_text()))

    asyncio.run(body())


def test_a_retry_policy_gives_exactly_the_allowed_attempts(tmp_path, marks):
    """A failing job retried: one Attempt too few breaks the promise, one too many runs a job
    the policy said to stop (each Attempt leaves its own marker)."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("flaky", marker_script(marks, "exit 3"),
                             retry={"max_attempts": 3, "initial_backoff_ms": 0, "max_backoff_ms": 0,
                                    "jitter": 0})
            run = await h.admit("flaky")
            ended = await h.until_ended(run)
            assert state_of(ended.run.state) == "failed" and ended.run.exit_code == 3
            assert [a.attempt_no for a in ended.attempts] == [1, 2, 3]
            assert all(state_of(a.state) == "failed" and a.exit_code == 3 for a in ended.attempts)
            assert _markers(marks) == sorted(a.attempt_id for a in ended.attempts)

    asyncio.run(body())


def test_a_start_error_or_a_missing_command_fails_the_run_with_the_reason_and_no_retry(tmp_path):
    """A missing program must end the Run failed, saying why, at once: retrying it (the program is
    missing next time too) or leaving the Run queued would hide the mistake."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("missing", ["/nonexistent/program", "x"], retry={"max_attempts": 3})
            await h.put_task("nothing", [])
            missing, nothing = await h.admit("missing"), await h.admit("nothing")
            ended = await h.until_ended(missing)
            assert state_of(ended.run.state) == "failed" and len(ended.attempts) == 1
            assert "/nonexistent/program" in (ended.attempts[0].reason or "")
            ended = await h.until_ended(nothing)
            assert state_of(ended.run.state) == "failed"
            assert ended.attempts[0].reason == "the task has no command"

    asyncio.run(body())


def test_an_attempt_left_dispatching_without_a_process_is_dispatched_once(tmp_path, marks):
    """A control plane that died between the dispatching commit and the spawn: the reconciler
    must give the Attempt back to the queue so it runs exactly once (not lost, not twice)."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with opened(settings) as backend:
            await put_task(backend, "once", marker_script(marks, "exit 0"))
            store = backend.execution()
            run, _ = await store.admit_manual_run("p", "once", "left-dispatching", now_ms())
            [candidate] = await store.dispatch_candidates(now_ms(), 10)
            attempt_dir = f"{tmp_path / 'q.db'}.logs/{candidate.attempt_id}"
            assert await store.begin_dispatch(candidate.attempt_id, attempt_dir, now_ms() + 60_000, now_ms())
            assert state_of((await store.run_detail(run)).run.state) == "dispatching"
        async with running(settings) as h:
            ended = await h.until_ended(run)
            assert state_of(ended.run.state) == "succeeded" and len(ended.attempts) == 1
            assert h.dispatcher.stats.reconciled["requeued"] == 1
        assert _markers(marks) == [candidate.attempt_id]

    asyncio.run(body())


def test_stop_detaches_by_default_and_the_next_start_records_the_outcome(tmp_path, marks):
    """SIGTERM of ``qinglong run`` must not kill the jobs (detach), and their outcome must still
    be recorded once by the next start: otherwise a restart loses or kills work."""
    settings = write_settings(tmp_path)
    go = tmp_path / "GO"

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", marker_script(marks, f"{wait_for_go(go)}; exit 4"))
            run = await h.admit("long")
            detail = await h.until_state(run, "running")
            pid = wrapper_pid(detail.attempts[0].attempt_dir)
        assert process_alive(pid)
        async with running(settings) as h:
            assert h.dispatcher.stats.reconciled["adopted"] == 1
            assert await h.state(run) == "running"
            go.touch()
            ended = await h.until_ended(run)
            assert state_of(ended.run.state) == "failed" and ended.run.exit_code == 4
            assert len(ended.attempts) == 1
        assert len(_markers(marks)) == 1

    asyncio.run(body())


def test_stop_with_terminate_cancels_the_running_jobs_and_records_them(tmp_path, marks):
    """``on_stop = "terminate"``: the jobs must be stopped and recorded cancelled before the stop
    returns, leaving no process of theirs behind, even when the job ignores TERM and the KILL
    grace is longer than the stop may take."""
    settings = write_settings(tmp_path, on_stop="terminate", kill_grace_ms=60_000,
                              lifecycle={"stop_timeout_ms": 3000})

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", marker_script(marks, "trap '' TERM; sleep 600"))
            run = await h.admit("long")
            detail = await h.until_state(run, "running")
            pgid = wrapper_pid(detail.attempts[0].attempt_dir)
        assert not group_members(pgid)
        async with opened(settings) as backend:
            ended = await backend.execution().run_detail(run)
            assert state_of(ended.run.state) == "cancelled"
            assert ended.attempts[0].cancel_reason == "shutdown"

    asyncio.run(body())


def test_retention_deletes_old_logs_leaving_a_tombstone_and_prunes_old_runs(tmp_path, marks):
    """Logs and Runs must not grow without bound (a router's disk fills), yet a deleted log must
    say it was deleted rather than look like a job that printed nothing."""
    settings = write_settings(tmp_path, log_retention_days=1, run_retention_days=30)
    day = 86_400_000

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("talk", marker_script(marks, "echo something worth keeping a while"))
            old, young = await h.admit("talk"), await h.admit("talk")
            for run in (old, young):
                await h.until_ended(run)
            old_dir = (await h.detail(old)).attempts[0].attempt_dir
            young_dir = (await h.detail(young)).attempts[0].attempt_dir
            retention = h.dispatcher.retention

            report = await retention.sweep(now_ms() + day // 2)
            assert report.logs_deleted == 0 and (await h.detail(old)).attempts[0].log_deleted is False

            report = await retention.sweep(now_ms() + 2 * day)
            assert report.logs_deleted == 2
            for run, directory in ((old, old_dir), (young, young_dir)):
                view = (await h.detail(run)).attempts[0]
                assert view.log_deleted is True
                assert not os.path.exists(directory)
            assert report.runs_pruned == 0

            report = await retention.sweep(now_ms() + 31 * day)
            assert report.runs_pruned == 2
            with pytest.raises(NotFound):
                await h.detail(old)

    asyncio.run(body())


def test_retention_deletes_the_oldest_logs_first_when_free_space_is_low(tmp_path, marks):
    """Below the free-space floor a log must go before its age says so, oldest first: otherwise
    job output fills the disk the database lives on."""
    from qinglong.host.execution import Retention

    settings = write_settings(tmp_path, log_retention_days=7)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("talk", marker_script(marks, "echo output"))
            first = await h.admit("talk")
            await h.until_ended(first)
            second = await h.admit("talk")
            await h.until_ended(second)
            frees = iter([0, 10**12])  # one deletion frees enough
            retention = Retention(h.store, h.dispatcher._config.log_dir, log_retention_days=7,
                                  run_retention_days=7, min_free_bytes=1024, prune_batch=10,
                                  diagnostics=h.lifecycle.diagnostics, free_bytes=lambda path: next(frees),
                                  keep_per_task=1)
            report = await retention.sweep(now_ms())
            assert report.logs_deleted == 0 and report.logs_deleted_for_space == 1
            assert (await h.detail(first)).attempts[0].log_deleted is True
            assert (await h.detail(second)).attempts[0].log_deleted is False

    asyncio.run(body())


def test_a_cancel_request_written_by_another_process_is_signalled(tmp_path, marks):
    """``qinglong runs cancel`` in another process only writes the request; unless the dispatcher
    acts on requests it did not write, the job would run on while the operator thinks it stopped."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        from qinglong.contracts.execution import CancelReason

        async with running(settings) as h:
            await h.put_task("long", marker_script(marks, "sleep 600"))
            run = await h.admit("long")
            detail = await h.until_state(run, "running")
            pgid = wrapper_pid(detail.attempts[0].attempt_dir)
            async with opened(settings) as other:
                await other.execution().request_cancel(run, CancelReason.OPERATOR, now_ms())
            ended = await h.until_ended(run)
            assert state_of(ended.run.state) == "cancelled"
            assert ended.attempts[0].cancel_reason == "operator"
            await until(lambda: not group_members(pgid), "the cancelled job's group gone")

    asyncio.run(body())



def test_a_per_second_trigger_whose_job_outlasts_its_period_never_overlaps_under_forbid(tmp_path, marks):
    """The case cron panels get wrong: a job scheduled every second that runs longer. Under
    'forbid' the occurrences due meanwhile must be skipped with the reason recorded (not queued
    up to run in a burst, not run beside it), and after it ended the next occurrence runs."""
    from qinglong.contracts.records import TriggerDefinition

    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", _long_job(tmp_path, marks), concurrency="forbid")
            await h.backend.publisher().put_trigger(TriggerDefinition(
                project_id="p", trigger_id="every-second", task_id="long", kind="cron",
                spec={"expression": "* * * * * *", "timezone": "UTC"}))

            async def states() -> dict[str, list[str]]:
                found: dict[str, list[str]] = {}
                for run in await h.store.list_runs(task_id="long", limit=100):
                    found.setdefault(state_of(run.state), []).append(run.run_id)
                return found

            async def two_skipped() -> Any:
                records = [k for k in await h.store.recent_run_skips(100) if k.task_id == "long"]
                return records if len(records) >= 2 else None
            records = await until(two_skipped, "two occurrences recorded as skips while the first runs")
            found = await states()
            assert len(found.get("running", [])) == 1 and "cancelled" not in found
            first = found["running"][0]
            for record in records:
                assert "forbid" in record.reason and record.trigger_id == "every-second"
            (tmp_path / "GO").touch()
            await h.until_ended(first)

            async def a_later_run_succeeded() -> bool:
                return len((await states()).get("succeeded", [])) >= 2
            await until(a_later_run_succeeded, "a later occurrence ran after the first ended")
        lines = _lines(tmp_path)
        assert max_overlap([line.split()[0] for line in lines]) == 1
        assert lines[:2] == [f"start {first}", f"end {first}"]

    asyncio.run(body())


def test_with_execution_disabled_no_dispatcher_starts_and_runs_stay_queued(tmp_path, marks):
    """``[execution] enabled = false`` is how an operator keeps a host from running jobs (say, a
    standby copy of the file): a dispatcher started anyway would run them here too."""
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    settings = write_settings(tmp_path, enabled=False)

    async def body() -> None:
        lifecycle = build_container(load_settings(settings)).lifecycle()
        await lifecycle.start()
        try:
            assert lifecycle.dispatcher is None and "dispatcher_started" not in lifecycle.steps
            store = lifecycle.backend.execution()
            await put_task(lifecycle.backend, "work", marker_script(marks, "exit 0"))
            run, _ = await store.admit_manual_run("p", "work", "disabled", now_ms())
            for _ in range(3):
                await lifecycle.loop.run_once()
            assert state_of((await store.run_detail(run)).run.state) == "queued"
        finally:
            await lifecycle.stop()
        assert _markers(marks) == []

    asyncio.run(body())


def test_diagnostics_of_start_errors_and_timeouts_never_show_env_values(tmp_path, marks, capfd):
    """A task's env holds its secrets; the dispatcher's diagnostics (start errors, timeouts) go to
    stderr and plugin sinks, where a value must never appear."""
    settings = write_settings(tmp_path, level="debug")
    secret = "s3cret-token-value"

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("missing", ["no-such-program-here"], env={"API_TOKEN": secret})
            await h.put_task("slow", marker_script(marks, "sleep 600"), env={"API_TOKEN": secret},
                             timeout_ms=1000)
            missing, slow = await h.admit("missing"), await h.admit("slow")
            assert state_of((await h.until_ended(missing)).run.state) == "failed"
            assert state_of((await h.until_ended(slow)).run.state) == "timed_out"

    asyncio.run(body())
    err = capfd.readouterr().err
    assert "execution.start_failed" in err and "execution.timeout" in err
    assert secret not in err


def test_a_task_naming_an_executor_nobody_offers_fails_naming_it(tmp_path, marks):
    """A task whose executor plugin is not loaded (disabled, uninstalled) must fail saying which
    executor is missing, not wait forever in the queue nor run under another executor."""
    settings = write_settings(tmp_path)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("elsewhere", marker_script(marks, "exit 0"), executor="acme_remote")
            run = await h.admit("elsewhere")
            ended = await h.until_ended(run)
            assert state_of(ended.run.state) == "failed" and len(ended.attempts) == 1
            assert "'acme_remote'" in (ended.attempts[0].reason or "")
            assert "local_process" in (ended.attempts[0].reason or "")
        assert _markers(marks) == []

    asyncio.run(body())


def test_a_backlog_waiting_under_queue_does_not_hide_another_tasks_run_behind_it(tmp_path, marks):
    """A 'queue' task whose job outlasts its period piles up waiting Runs ahead (in scheduled
    order) of every later Run; if the dispatcher looked only at the first page, another task's
    Run would never start while a slot is free."""
    settings = write_settings(tmp_path, max_running=2, max_queued=100)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("long", _long_job(tmp_path, marks), concurrency="queue")
            await h.put_task("quick", marker_script(marks, "exit 0"))
            first = await h.admit("long")
            await h.until_state(first, "running")
            backlog = [await h.admit("long") for _ in range(60)]
            quick = await h.admit("quick")
            assert state_of((await h.until_ended(quick)).run.state) == "succeeded"
            assert all([await h.state(run) == "queued" for run in backlog])
            (tmp_path / "GO").touch()
            await h.until_ended(backlog[-1])

    asyncio.run(body())
