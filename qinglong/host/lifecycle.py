"""The lifecycle of ``qinglong run``: ordered start, bounded stop, and the scheduler loop.

Start: (configuration was validated before the container was built) -> open the database ->
migrate when the backend asks for it -> schema readiness -> startup recovery (these four run again
while the store cannot be reached, up to ``[lifecycle] start_wait_ms``) -> scheduler loop ->
dispatcher (when the profile executes Runs locally; its reconciler runs first) -> ``stack``
components -> ``admission`` components (the plugins', then the HTTP surface) -> ready (systemd hears
``READY=1``). Stop, each step bounded: not ready (``STOPPING=1``) -> withdraw admission -> stop the
dispatcher (it detaches from, or terminates, the running jobs) -> stop and drain the scheduler ->
stop the stack -> close the database.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Sequence

from qinglong.contracts.capabilities import MigratesAtStart
from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.errors import QinglongError
from qinglong.contracts.hookspecs import ComponentPhase, HostContext, LifecycleComponent
from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.records import RecoveryReport, RoundReport, RoundTally
from qinglong.contracts.store import SchedulerBackend

from .readiness import Readiness
from .waiting import wait_out

#: between two attempts to reach a store that could not be reached at start
START_WAIT_INTERVAL_S = 1.0


class LifecycleError(QinglongError):
    """A start step failed or timed out; everything already started was stopped."""


@dataclass(slots=True)
class LoopStats(RoundTally):
    """Totals over the rounds of one scheduler loop (race statistics included): the contract's
    round counters summed, plus what only a loop counts."""

    rounds: int = 0
    failed_rounds: int = 0
    overlaps_prevented: int = 0
    last_round_ms: int = 0

    def add(self, report: RoundReport) -> None:
        """Fold one round's report into the totals."""
        RoundTally.add(self, report)
        self.rounds += 1
        self.last_round_ms = report.duration_ms


class SchedulerLoop:
    """Runs ``run_round`` at a cadence: rounds never overlap; errors are reported, never fatal.

    A round that reports ``more_due`` (a full page) is followed at once by the next, so a backlog
    drains page by page. Otherwise the next round starts at the next wall-clock multiple of the
    cadence (plus a few ms): occurrences fall on whole seconds and minutes, so an aligned round
    admits them a few ms late instead of up to a whole cadence late.
    """

    #: How long after a cadence boundary a round starts, so the boundary's occurrence is due.
    ALIGN_OFFSET_S = 0.005

    def __init__(
        self,
        run_round: Callable[[], Awaitable[RoundReport]],
        cadence_ms: int,
        diagnostics: DiagnosticSink,
        on_admitted: Callable[[RoundReport], None] | None = None,
    ) -> None:
        """``on_admitted`` is called after every round that admitted a Run (the dispatcher's
        wake-up); its errors are reported, never fatal to the loop."""
        self._run_round = run_round
        self._on_admitted = on_admitted
        self._cadence_s = cadence_ms / 1000
        self._diagnostics = diagnostics
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_round = asyncio.Lock()
        self.stats = LoopStats()
        #: Called after every round with its report (None: the round failed) and its wall time
        #: in ms (the HTTP surface's metrics); an observer's error is reported, never fatal.
        self.observers: list[Callable[[RoundReport | None, int], None]] = []

    @property
    def alive(self) -> bool:
        """The loop task runs (started, not ended)."""
        return self._task is not None and not self._task.done()

    def _observe(self, report: RoundReport | None, elapsed_ms: int) -> None:
        for observer in self.observers:
            try:
                observer(report, elapsed_ms)
            except Exception as exc:
                self._diagnostics.emit(DiagnosticEvent(
                    "error", "scheduler.observer_failed",
                    f"a round observer failed: {exc.__class__.__name__}: {exc}"))

    def start(self) -> None:
        """Start the loop task (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="qinglong-scheduler")

    async def run_once(self) -> RoundReport | None:
        """Run one round now unless one is in progress (then return None: no overlap)."""
        if self._in_round.locked():
            self.stats.overlaps_prevented += 1
            return None
        async with self._in_round:
            started = time.monotonic()
            try:
                report = await self._run_round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.failed_rounds += 1
                self._observe(None, int((time.monotonic() - started) * 1000))
                self._diagnostics.emit(
                    DiagnosticEvent(
                        "error",
                        "scheduler.round_failed",
                        f"scheduler round failed: {exc.__class__.__name__}: {exc}",
                        {"elapsed_ms": int((time.monotonic() - started) * 1000)},
                    )
                )
                return None
            self.stats.add(report)
            self._observe(report, report.duration_ms)
            if report.admitted and self._on_admitted is not None:
                try:
                    self._on_admitted(report)
                except Exception as exc:
                    self._diagnostics.emit(DiagnosticEvent(
                        "error", "scheduler.on_admitted_failed",
                        f"the admitted-runs callback failed: {exc.__class__.__name__}: {exc}"))
            if report.errors or report.fence_lost:
                self._diagnostics.emit(
                    DiagnosticEvent(
                        "warning",
                        "scheduler.round_incomplete",
                        "a scheduler round finished with errors or lost fences",
                        {"errors": report.errors, "fence_lost": report.fence_lost,
                         "cas_misses": report.cas_misses},
                    )
                )
            return report

    async def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            report = await self.run_once()
            if self._stopping.is_set():
                break
            if report is not None and report.more_due:
                await asyncio.sleep(0)  # let stop requests and other tasks in between pages
                continue
            if time.monotonic() - started >= self._cadence_s:
                await asyncio.sleep(0)  # a round that overran its cadence: the next starts now
                continue
            delay = self._cadence_s - (time.time() % self._cadence_s) + self.ALIGN_OFFSET_S
            if delay > 0:
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except asyncio.TimeoutError:
                    pass

    async def stop(self, timeout_s: float) -> bool:
        """Let the current round finish, start no other; cancel after ``timeout_s``.

        Returns True when the loop drained within the bound.
        """
        self._stopping.set()
        if self._task is None or self._task.done():  # never started, or ended already: nothing to drain
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            return True
        except asyncio.TimeoutError:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._diagnostics.emit(
                DiagnosticEvent(
                    "warning",
                    "scheduler.drain_timeout",
                    f"the scheduler round did not finish within {timeout_s:.1f} s and was cancelled",
                )
            )
            return False


@dataclass
class Lifecycle:
    """Starts and stops one profile's pieces in the documented order."""

    profile: str
    settings: Any
    backend: SchedulerBackend
    diagnostics: DiagnosticSink
    providers: Mapping[str, TriggerProvider]
    components_factory: Callable[[HostContext], Sequence[LifecycleComponent]]
    cadence_ms: int
    start_step_timeout_ms: int
    stop_timeout_ms: int
    #: how long the steps that reach the store (open, migrate, readiness, recovery) wait out a
    #: store that cannot be reached (the contracts' ``outage`` rule) before the start fails
    start_wait_ms: int = 0
    #: ``backend -> Dispatcher | None``: the profile's dispatcher, None when it does not execute
    #: Runs locally (no factory: never).
    dispatcher_factory: Callable[[SchedulerBackend], Any] | None = None
    #: ``lifecycle -> components`` of the host's own admission phase (the HTTP surface): built
    #: before the scheduler loop, started after the plugins' admission components.
    admission_factory: Callable[["Lifecycle"], Sequence[LifecycleComponent]] | None = None
    readiness: Readiness = field(default_factory=Readiness)
    #: What the host's admission components (built before the first round, so they miss none)
    #: observe: every round's report, every process started (its dispatch lag in ms), every
    #: Attempt end recorded here (its state); wired into the loop and the dispatcher as they are
    #: created.
    round_observers: list[Callable[[RoundReport | None, int], None]] = field(default_factory=list)
    dispatch_observers: list[Callable[[int], None]] = field(default_factory=list)
    finish_observers: list[Callable[[str], None]] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    loop: SchedulerLoop | None = None
    dispatcher: Any = None
    last_stats: LoopStats | None = None
    _started: list[LifecycleComponent] = field(default_factory=list)
    _opened: bool = False
    _admission_open: bool = False

    def _note(self, step: str, **fields: Any) -> None:
        self.steps.append(step)
        self.diagnostics.emit(DiagnosticEvent("info", f"lifecycle.{step}", step.replace("_", " "), fields))

    async def _bounded(self, step: str, awaitable: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.start_step_timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise LifecycleError(
                f"start step '{step}' did not finish within {self.start_step_timeout_ms} ms "
                "(lifecycle.start_step_timeout_ms)"
            ) from None

    async def _reach_store(self) -> RecoveryReport:
        """The start steps that reach the store, in order; run again from the first whose store
        could not be reached (each is idempotent: an open backend stays open, migrating applies
        only what is pending, readiness and recovery only read)."""
        if not self._opened:
            self.readiness.starting("opening the database")
            await self._bounded("open_database", self.backend.open())
            self._opened = True
            self._note("database_opened", backend=self.backend.name)
        if isinstance(self.backend, MigratesAtStart) and self.backend.auto_migrate:
            await self._bounded("migrate", self.backend.migrate())
            self._note("migrated")
        self.readiness.starting("checking schema readiness")
        await self._bounded("schema_readiness", self.backend.check_readiness())
        self._note("schema_ready")
        check_secrets = getattr(self.backend, "check_secrets", None)
        if check_secrets is not None:  # every stored sealed value's key is loaded, or no start
            await self._bounded("secrets", check_secrets())
        self.readiness.starting("startup recovery")
        return await self._bounded("startup_recovery", self.backend.recover())

    def _waiting(self, exc: BaseException, attempt: int, left_s: float) -> None:
        """One refused attempt to reach the store, as a diagnostic (the message is the error's,
        redacted by the backend and again by the sink; never a DSN)."""
        self.readiness.starting("waiting for the store")
        self.diagnostics.emit(DiagnosticEvent(
            "warning", "lifecycle.store_waiting",
            f"store not reachable: {' '.join(str(exc).split())}",
            {"attempt": attempt, "wait_left_ms": int(left_s * 1000)}))

    async def start(self) -> None:
        """Run every start step in order; on failure stop what was started and re-raise."""
        try:
            report = await wait_out(self._reach_store, timeout_s=self.start_wait_ms / 1000,
                                    interval_s=START_WAIT_INTERVAL_S, waiting=self._waiting)
            self._note(
                "recovered",
                pristine_queued=report.pristine_queued,
                candidates=len(report.candidates),
                worker_held=report.worker_held,
            )
            for candidate in report.candidates:
                self.diagnostics.emit(
                    DiagnosticEvent("warning", "recovery.candidate", "in-flight work needs recovery",
                                    {"what": candidate})
                )
            admission = list(self.admission_factory(self)) if self.admission_factory is not None else []
            dispatcher = self.dispatcher_factory(self.backend) if self.dispatcher_factory else None
            if dispatcher is not None:
                dispatcher.on_started.extend(self.dispatch_observers)
                dispatcher.on_finished.extend(self.finish_observers)
            self.loop = SchedulerLoop(self.backend.run_round, self.cadence_ms, self.diagnostics,
                                      on_admitted=dispatcher.wake if dispatcher is not None else None)
            self.loop.observers.extend(self.round_observers)
            self.loop.start()
            self._note("scheduler_started", cadence_ms=self.cadence_ms)
            if dispatcher is not None:
                self.readiness.starting("starting the dispatcher")
                self.dispatcher = dispatcher
                reconciled = await self._bounded("start dispatcher", dispatcher.start())
                self._note("dispatcher_started", **reconciled.as_fields())
            context = HostContext(self.profile, self.settings, self.backend, self.diagnostics, self.providers)
            components = list(self.components_factory(context)) + admission
            if dispatcher is not None:
                # a component that wants to hear of each Run end (the event delivery loop)
                dispatcher.on_finished.extend(
                    c.on_run_finished for c in components if callable(getattr(c, "on_run_finished", None)))
            # a component that watches the rounds (the scheduler's operator events)
            self.loop.observers.extend(
                c.observe_round for c in components if callable(getattr(c, "observe_round", None)))
            self.readiness.starting("opening the admission phase")
            for phase in (ComponentPhase.STACK, ComponentPhase.ADMISSION):
                for component in components:
                    if component.phase is phase:
                        await self._bounded(f"start {component.name}", component.start())
                        self._started.append(component)
            self._admission_open = True
            self.readiness.mark_ready()
            self._note("admission_open", components=len(self._started))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Withdraw admission, stop the dispatcher, drain the scheduler, stop the stack, close the
        database; each bounded."""
        bound = self.stop_timeout_ms / 1000
        self.readiness.mark_stopping()
        for component in reversed([c for c in self._started if c.phase is ComponentPhase.ADMISSION]):
            await self._stop_component(component, bound)
        if self._admission_open:
            self._admission_open = False
            self._note("admission_withdrawn")
        await self._stop_dispatcher(bound)
        await self._stop_loop(bound)
        for component in reversed([c for c in self._started if c.phase is ComponentPhase.STACK]):
            await self._stop_component(component, bound)
        self._started.clear()
        if self._opened:
            try:
                await asyncio.wait_for(self.backend.close(), bound)
            except (asyncio.TimeoutError, Exception) as exc:
                self.diagnostics.emit(
                    DiagnosticEvent("error", "lifecycle.close_failed",
                                    f"closing the database failed: {exc.__class__.__name__}")
                )
            self._opened = False
            self._note("database_closed")

    async def _stop_dispatcher(self, bound: float) -> None:
        if self.dispatcher is None:
            return
        dispatcher, self.dispatcher = self.dispatcher, None
        watched = dispatcher.watched
        try:
            await asyncio.wait_for(dispatcher.stop(bound), bound)
        except (asyncio.TimeoutError, Exception) as exc:
            self.diagnostics.emit(
                DiagnosticEvent("error", "lifecycle.stop_failed",
                                f"stopping the dispatcher failed: {exc.__class__.__name__}")
            )
        self._note("dispatcher_stopped", jobs=watched)

    async def _stop_loop(self, bound: float) -> None:
        if self.loop is not None:
            drained = await self.loop.stop(bound)
            self._note("scheduler_drained", drained=drained, rounds=self.loop.stats.rounds,
                       admitted=self.loop.stats.admitted)
            self.last_stats = self.loop.stats
            self.loop = None

    async def _stop_component(self, component: LifecycleComponent, bound: float) -> None:
        try:
            await asyncio.wait_for(component.stop(), bound)
        except (asyncio.TimeoutError, Exception) as exc:
            self.diagnostics.emit(
                DiagnosticEvent("error", "lifecycle.stop_failed",
                                f"stopping {component.name} failed: {exc.__class__.__name__}")
            )
