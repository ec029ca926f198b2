"""The lifecycle order and the scheduler loop's bounds (no overlap, errors survive, bounded drain)."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time

import pytest

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.records import RoundReport
from qinglong.host.containers import build_container
from qinglong.host.lifecycle import SchedulerLoop
from qinglong.host.settings import load_settings

RECORDER = '''
import asyncio
from qinglong.contracts.hookspecs import ComponentPhase, hookimpl

EVENTS = []


class Sink:
    def emit(self, event):
        EVENTS.append(event.code)


class Component:
    def __init__(self, name, phase, backend):
        self.name, self.phase, self.backend = name, phase, backend

    async def start(self):
        EVENTS.append(f"start:{self.name}")

    async def stop(self):
        EVENTS.append(f"stop:{self.name}")


@hookimpl
def qinglong_diagnostic_sinks(settings):
    return [Sink()]


@hookimpl
def qinglong_lifecycle_components(context):
    return [Component("intake", ComponentPhase.ADMISSION, context.backend),
            Component("metrics", ComponentPhase.STACK, context.backend)]
'''


class Recorder:
    def __init__(self) -> None:
        self.events: list[DiagnosticEvent] = []

    def emit(self, event: DiagnosticEvent) -> None:
        self.events.append(event)


def test_hook_qinglong_lifecycle_components_start_and_stop_in_the_documented_order(site, tmp_path, monkeypatch):
    """Admission must open last and close first, or Runs could be admitted by a half-started host;
    the dispatcher starts after the scheduler and stops before it drains, so no Run is started
    by a host whose scheduler is gone."""
    site.add_distribution("acme-recorder", {"acme_recorder.py": RECORDER}, {"recorder": "acme_recorder"})
    monkeypatch.syspath_prepend(str(site.root))
    importlib.invalidate_caches()
    settings = tmp_path / "s.toml"
    settings.write_text(f'[plugins]\nenable = ["recorder"]\n[backend]\npath = "{tmp_path / "q.db"}"\n'
                        '[diagnostics]\nlevel = "error"\n')
    container = build_container(load_settings(settings))
    lifecycle = container.lifecycle()

    async def go() -> None:
        await lifecycle.start()
        await asyncio.sleep(0.05)
        await lifecycle.stop()

    asyncio.run(go())
    events = [e for e in sys.modules["acme_recorder"].EVENTS
              if not e.startswith(("scheduler.", "execution."))]
    assert events == [
        "lifecycle.database_opened", "lifecycle.migrated", "lifecycle.schema_ready", "lifecycle.recovered",
        "lifecycle.scheduler_started", "lifecycle.dispatcher_started", "start:metrics", "start:intake",
        "lifecycle.admission_open", "stop:intake", "lifecycle.admission_withdrawn",
        "lifecycle.dispatcher_stopped", "lifecycle.scheduler_drained", "stop:metrics",
        "lifecycle.database_closed",
    ]


async def _until(condition, what: str, timeout: float = 60) -> None:
    """Yield to the event loop until ``condition()`` holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not reached within {timeout:.0f} s"
        await asyncio.sleep(0.005)


def test_rounds_never_overlap_even_when_a_round_outlasts_the_cadence():
    """Two overlapping rounds could decide the same schedule twice."""
    active = 0
    most = 0
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow_round() -> RoundReport:
        nonlocal active, most
        active += 1
        most = max(most, active)
        entered.set()
        await release.wait()  # the first round is held across several cadences
        await asyncio.sleep(0.06)  # and every round outlasts the 50 ms cadence
        active -= 1
        return RoundReport()

    async def go() -> SchedulerLoop:
        loop = SchedulerLoop(slow_round, cadence_ms=50, diagnostics=Recorder())
        loop.start()
        await asyncio.wait_for(entered.wait(), 60)
        assert await loop.run_once() is None  # refused while the loop's round runs
        await asyncio.sleep(0.2)  # let cadences pass while the round is held: no second round starts
        assert loop.stats.rounds == 0 and active == 1
        release.set()
        await _until(lambda: loop.stats.rounds >= 3, "three rounds")
        assert await loop.stop(60)
        return loop

    loop = asyncio.run(go())
    assert most == 1
    assert loop.stats.overlaps_prevented == 1
    assert loop.stats.rounds >= 3


def test_a_failing_round_is_reported_and_the_loop_goes_on():
    """An exception in one round must not kill the scheduler: later occurrences would be lost."""
    calls = 0
    sink = Recorder()

    async def flaky_round() -> RoundReport:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise ConnectionError("database went away (password=hunter2)")
        return RoundReport(admitted=1)

    async def go() -> SchedulerLoop:
        loop = SchedulerLoop(flaky_round, cadence_ms=50, diagnostics=sink)
        loop.start()
        await _until(lambda: loop.stats.admitted >= 1, "a round after the two failures")
        await loop.stop(60)
        return loop

    loop = asyncio.run(go())
    assert loop.stats.failed_rounds == 2
    assert loop.stats.admitted >= 1
    assert [e.code for e in sink.events[:2]] == ["scheduler.round_failed"] * 2


def test_stop_lets_the_current_round_finish():
    """Cancelling a round mid-commit is what the drain exists to avoid."""
    finished = []
    started = asyncio.Event()

    async def round_() -> RoundReport:
        started.set()
        await asyncio.sleep(0.2)
        finished.append(True)
        return RoundReport()

    async def go() -> bool:
        loop = SchedulerLoop(round_, cadence_ms=1000, diagnostics=Recorder())
        loop.start()
        await asyncio.wait_for(started.wait(), 60)  # stop is asked mid-round
        return await loop.stop(60)

    assert asyncio.run(go()) is True
    assert finished == [True]


def test_stop_is_bounded_when_a_round_hangs():
    """A hung database call must not keep the process from stopping."""
    sink = Recorder()
    started_round = asyncio.Event()

    async def hung() -> RoundReport:
        started_round.set()
        await asyncio.sleep(30)
        return RoundReport()

    async def go() -> tuple[bool, float]:
        loop = SchedulerLoop(hung, cadence_ms=1000, diagnostics=sink)
        loop.start()
        await asyncio.wait_for(started_round.wait(), 60)
        started = time.monotonic()
        drained = await loop.stop(0.2)
        return drained, time.monotonic() - started

    drained, elapsed = asyncio.run(go())
    assert drained is False
    assert elapsed < 10  # the round hangs for 30 s: only the bounded stop returns sooner
    assert sink.events[-1].code == "scheduler.drain_timeout"


@pytest.mark.parametrize("more_due", [True, False])
def test_a_full_page_is_followed_at_once_by_the_next(more_due):
    """A backlog drains page after page instead of one page per cadence: otherwise a backlog of
    five pages would take five minutes (cadence 60 s) instead of five rounds at once."""
    calls = 0

    async def round_() -> RoundReport:
        nonlocal calls
        calls += 1
        return RoundReport(more_due=more_due and calls < 5)

    async def go() -> None:
        loop = SchedulerLoop(round_, cadence_ms=60_000, diagnostics=Recorder())
        loop.start()
        # the first round runs at once; the loop then waits for the next cadence unless more is due
        await _until(lambda: loop.stats.rounds >= 1, "the first round")
        if more_due:
            await _until(lambda: calls >= 5, "five pages in a row", timeout=30)
        await loop.stop(60)

    asyncio.run(go())
    if more_due:
        assert calls >= 5  # four full pages, then one more round at once
    else:
        assert calls <= 2  # one round, and at most one more if a minute boundary fell meanwhile


def test_a_round_that_admitted_runs_wakes_the_dispatcher_at_once():
    """The dispatcher's wake-up: without the callback an admitted Run waits for the poll timer
    (up to a second late); a callback that raises must not stop the rounds either."""
    reports = [RoundReport(), RoundReport(admitted=2), RoundReport(), RoundReport(admitted=1)]
    woken: list[int] = []
    sink = Recorder()

    async def round_() -> RoundReport:
        return reports.pop(0) if reports else RoundReport()

    def on_admitted(report: RoundReport) -> None:
        woken.append(report.admitted)
        if len(woken) == 1:
            raise RuntimeError("a failing wake-up")

    async def go() -> None:
        loop = SchedulerLoop(round_, cadence_ms=50, diagnostics=sink, on_admitted=on_admitted)
        loop.start()
        await _until(lambda: len(woken) == 2, "both admitting rounds woke the dispatcher")
        await loop.stop(60)

    asyncio.run(go())
    assert woken == [2, 1]
    assert [e.code for e in sink.events] == ["scheduler.on_admitted_failed"]
