"""A task's backlog of Runs waiting to start is bounded by ``[execution] max_queued``: beyond it
an occurrence is skipped with the reason, the oldest waiting Runs kept."""

from __future__ import annotations

import asyncio

from dispatcher_helpers import TERMINAL, marker_script, running, state_of, until, wait_for_go, write_settings


async def _bounded(h, backlog: list[str], kept: int, bound: int) -> list[str]:
    """Until all but ``kept`` of ``backlog`` are skip records saying the bound; the rest still
    queued. Returns those."""
    async def skipped() -> dict[str, str] | None:
        records = {k.run_id: k.reason for k in await h.store.recent_run_skips(100) if k.run_id in backlog}
        return records if len(records) >= len(backlog) - kept else None
    records = await until(skipped, f"all but {kept} waiting Runs skipped")
    await h.passes_after(2)
    assert all(f"max_queued = {bound}" in reason for reason in records.values()), records
    waiting = [run for run in backlog if run not in records]
    assert [state_of((await h.detail(run)).run.state) for run in waiting] == ["queued"] * kept
    assert len(waiting) == kept
    return waiting


def test_a_queue_task_keeps_at_most_max_queued_runs_waiting_and_skips_the_rest(tmp_path):
    """Without the bound, 3 s jobs on a per-second trigger left 75 `queue` Runs waiting and
    growing: a router's store and its backlog grow without limit and nothing says so."""
    marks = tmp_path / "marks"
    marks.mkdir()
    settings = write_settings(tmp_path, max_queued=3)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("slow", marker_script(marks, wait_for_go(tmp_path / "GO")), concurrency="queue")
            first = await h.admit("slow")
            await h.until_state(first, "running")
            backlog = [await h.admit("slow") for _ in range(7)]
            waiting = await _bounded(h, backlog, 3, 3)
            stats = await h.backend.reader().store_stats()
            assert stats.queued_by_task == {"p/slow": 3} and stats.skipped_recent == 4
            (tmp_path / "GO").touch()
            for run in [first, *waiting]:
                assert state_of((await h.until_ended(run)).run.state) == "succeeded"

    asyncio.run(body())


def test_an_allow_task_at_its_max_running_is_bounded_too(tmp_path):
    """`allow` Runs waiting for a slot grew the same way (39 in the same hour)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    settings = write_settings(tmp_path, max_queued=2, max_running=1)

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("slow", marker_script(marks, wait_for_go(tmp_path / "GO")))
            first = await h.admit("slow")
            await h.until_state(first, "running")
            backlog = [await h.admit("slow") for _ in range(5)]
            waiting = await _bounded(h, backlog, 2, 2)
            (tmp_path / "GO").touch()
            for run in [first, *waiting]:
                assert state_of((await h.until_ended(run)).run.state) == "succeeded"

    asyncio.run(body())


def test_status_and_skips_show_each_tasks_queue_and_the_skipped_runs(tmp_path, capsys):
    """`status` showed only a total of queued Runs and `skips` showed 0 while Runs were skipped:
    the operator could not see which task backs up, nor that occurrences were dropped."""
    from qinglong.host.cli.main import main

    marks = tmp_path / "marks"
    marks.mkdir()
    settings = write_settings(tmp_path, max_queued=2)

    async def body() -> list[str]:
        async with running(settings) as h:
            await h.put_task("slow", marker_script(marks, wait_for_go(tmp_path / "GO")), concurrency="queue")
            await h.put_task("one", marker_script(marks, wait_for_go(tmp_path / "GO")), concurrency="forbid")
            first, other = await h.admit("slow"), await h.admit("one")
            await h.until_state(first, "running")
            await h.until_state(other, "running")
            backlog = [await h.admit("slow") for _ in range(4)]
            forbidden = await h.admit("one")
            waiting = await _bounded(h, backlog, 2, 2)
            return [first, other, *waiting], [forbidden]

    started, forbidden = asyncio.run(body())
    capsys.readouterr()
    main(["status", "--once", "--json", "--settings", str(settings)])  # exit code: the verdict
    out = capsys.readouterr().out
    assert '"p/slow": 2' in out, out
    assert main(["skips", "--settings", str(settings)]) == 0
    out = capsys.readouterr().out
    assert out.count("max_queued = 2") == 2 and forbidden[0] in out and "forbid" in out, out

    async def finish() -> None:
        # a restarted plane adopts the two jobs still waiting, lets them and the queue end: no job
        # outlives the test
        async with running(settings) as h:
            (tmp_path / "GO").touch()
            for run in started:
                assert state_of((await h.until_ended(run)).run.state) == "succeeded"

    asyncio.run(finish())
