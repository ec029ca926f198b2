"""A task's backlog of Runs waiting to start is bounded by ``[execution] max_queued``: beyond it
an occurrence is skipped with the reason, the oldest waiting Runs kept."""

from __future__ import annotations

import asyncio

from dispatcher_helpers import TERMINAL, marker_script, running, state_of, until, wait_for_go, write_settings


async def _bounded(h, backlog: list[str], kept: int, bound: int) -> list[str]:
    """Until all but ``kept`` of ``backlog`` ended skipped; the rest still queued. Returns those."""
    async def settled() -> bool:
        return sum([await h.state(run) in TERMINAL for run in backlog]) >= len(backlog) - kept
    await until(settled, f"all but {kept} waiting Runs skipped")
    await h.passes_after(2)
    waiting = []
    for run in backlog:
        detail = await h.detail(run)
        if state_of(detail.run.state) == "queued":
            waiting.append(run)
        else:
            assert state_of(detail.run.state) == "cancelled", detail.run
            assert f"max_queued = {bound}" in (detail.run.reason or ""), detail.run
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
