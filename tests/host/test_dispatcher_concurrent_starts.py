"""The starts of one dispatch pass are under way together: a pass that found N startable Runs
and N free slots does not wait for one start (its wrapper's pid file) before the next. A task
whose next decision depends on whether a start succeeded (``forbid``, ``queue``, ``replace``)
has that start settled first.

The real lifecycle, store and ``local_process`` executor; the executor is wrapped only to hold
starts at a gate, so "together" is proved by the starts meeting there, not by timing."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from dispatcher_helpers import PROJECT, TERMINAL, WAIT_S, marker_script, now_ms, running, until, wait_for_go, write_settings

from qinglong.contracts.execution import StartError


class Gate:
    """The real executor, its ``start`` held until ``meet`` starts are at the gate at once (or,
    for ``hold``, until ``release``). ``refuse``: run ids whose first start fails as the executor
    refuses one (a missing program, a full log filesystem)."""

    def __init__(self, real: Any, meet: int, *, hold: str | None = None, refuse: set[str] = frozenset()) -> None:
        self._real = real
        self.meet = meet
        self.hold = hold
        self.refuse = set(refuse)
        self.at_gate: set[str] = set()
        self.most_at_once = 0
        self.met = asyncio.Event()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.started: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def start(self, request: Any) -> Any:
        run_id = request.run_id
        if run_id == self.hold:
            self.holding.set()
            await self.release.wait()
        elif run_id in self.refuse:
            self.refuse.discard(run_id)
            raise StartError("refused at the gate")
        else:
            self.at_gate.add(run_id)
            self.most_at_once = max(self.most_at_once, len(self.at_gate))
            if len(self.at_gate) >= self.meet:
                self.met.set()
            try:
                # bounded: starts one at a time never meet here, and each would wait this long
                await asyncio.wait_for(self.met.wait(), WAIT_S)
            except asyncio.TimeoutError:
                pass
            finally:
                self.at_gate.discard(run_id)
        self.started.append(run_id)
        return await self._real.start(request)


async def _admit_behind_a_held_start(h: Any, gate: Gate, task: str, count: int,
                                     refuse_first: bool = False) -> list[str]:
    """Admit ``count`` Runs of ``task`` while the pass is held in the start of a ``blocker`` Run
    (which then runs on): the next pass finds all of them at once, in the order admitted.
    ``refuse_first``: the first of them is refused at its start."""
    run_id, created = await h.store.admit_manual_run(PROJECT, "blocker", f"blocker-{now_ms()}", now_ms())
    assert created
    gate.hold = run_id
    h.dispatcher.wake()
    await until(gate.holding.is_set, "the blocker's start")
    runs = []
    # one millisecond apart, in the past: a pass visits them in this order (Runs of one instant
    # would go by their random ids)
    at = now_ms() - 1000
    for i in range(count):
        run_id, created = await h.store.admit_manual_run(PROJECT, task, f"k-{i}-{at}", at + i)
        assert created
        runs.append(run_id)
    if refuse_first:
        gate.refuse.add(runs[0])
    gate.release.set()
    h.dispatcher.wake()
    return runs


@asynccontextmanager
async def gated(tmp_path: Path, task: str, *, meet: int = 1, **execution: Any) -> AsyncIterator[tuple[Any, Gate]]:
    """The lifecycle with a ``blocker`` task (its job waits for a GO file) and ``task`` (``spec``
    keys after ``task_``; its jobs exit 0 at once), its executor behind a :class:`Gate`; the
    blocker ends before the lifecycle stops."""
    go = tmp_path / "GO"
    marks = tmp_path / "marks"
    marks.mkdir()
    spec = {k[len("task_"):]: execution.pop(k) for k in list(execution) if k.startswith("task_")}
    async with running(write_settings(tmp_path, max_queued=16, **execution)) as h:
        await h.put_task("blocker", marker_script(marks, wait_for_go(go)))
        await h.put_task(task, marker_script(marks, "true"), **spec)
        gate = Gate(h.dispatcher._executors["local_process"], meet=meet)
        h.dispatcher._executors["local_process"] = gate
        yield h, gate
        go.touch()
        if gate.hold is not None:
            await h.until_ended(gate.hold)


async def test_the_starts_of_one_pass_meet_at_once(tmp_path):
    """If starts went one at a time, 16 free slots held 4 jobs at most in a burst of /bin/true and
    the burst took as long as its starts in a row: here the first start would wait at the gate
    for the others, which would never come."""
    async with gated(tmp_path, "burst", meet=4, max_running=5) as (h, gate):
        runs = await _admit_behind_a_held_start(h, gate, "burst", 4)
        for run_id in runs:
            assert (await h.until_ended(run_id)).run.state.value == "succeeded"
        assert gate.most_at_once == 4, f"{gate.most_at_once} of 4 starts were under way at once"


async def test_a_forbid_task_decides_its_next_run_once_the_start_is_known(tmp_path):
    """If a forbid task's next Run were decided while the first one's start was still under way,
    a start that then failed would skip the next Run as overlapping a Run that never ran: the
    occurrence would be lost although nothing of its task was running."""
    async with gated(tmp_path, "once", max_running=5, task_concurrency="forbid") as (h, gate):
        first, second = await _admit_behind_a_held_start(h, gate, "once", 2, refuse_first=True)
        assert (await h.until_ended(first)).run.state.value == "failed"
        second_detail = await h.until_ended(second)
        assert second_detail.run.state.value == "succeeded", second_detail


async def test_a_failed_start_gives_its_slot_back_at_once(tmp_path):
    """If a start that failed kept its slot until the next timed pass, the Runs behind it would
    wait for a slot nothing holds: with one free slot and a timed pass only every minute, the
    Runs behind the refused start would wait that minute (here: past the half minute allowed)."""
    async with gated(tmp_path, "many", max_running=2, poll_ms=60_000) as (h, gate):
        runs = await _admit_behind_a_held_start(h, gate, "many", 3, refuse_first=True)

        async def ended() -> list[str] | None:
            states = [(await h.detail(run_id)).run.state.value for run_id in runs]
            return states if all(s in TERMINAL for s in states) else None
        states = await until(ended, "the Runs behind a refused start ended", timeout=30)
        assert states == ["failed", "succeeded", "succeeded"], states


async def test_a_batch_the_store_refuses_is_begun_one_by_one(tmp_path):
    """If one Attempt the batch cannot move (a write refused: a busy or damaged database) rolled
    back the whole pass's starts for good, every Run of the pass would wait on it pass after pass;
    begun one by one, the others start and only the refused one is reported."""
    async with gated(tmp_path, "burst", max_running=5) as (h, gate):
        store = h.dispatcher._store
        real_batch, real_one = store.begin_dispatches, store.begin_dispatch
        refused: set[str] = set()
        batches: list[int] = []

        async def failing_batch(starts, now_ms):  # the fault: the batch's transaction fails
            batches.append(len(starts))
            if len(starts) > 1:
                raise OSError("disk I/O error (injected)")
            return await real_batch(starts, now_ms)

        async def one_refused(attempt_id, attempt_dir, deadline_ms, now_ms):
            if not refused:
                refused.add(attempt_id)
                raise OSError("disk I/O error (injected)")
            return await real_one(attempt_id, attempt_dir, deadline_ms, now_ms)

        store.begin_dispatches, store.begin_dispatch = failing_batch, one_refused
        runs = await _admit_behind_a_held_start(h, gate, "burst", 3)
        ended = [(await h.until_ended(run_id)).run.state.value for run_id in runs]
        assert ended == ["succeeded"] * 3, ended  # the refused one started on a later pass
        assert 3 in batches and len(refused) == 1
