"""The conformance harness: one backend under test, driven through the contracts' protocols.

The shared suites (:mod:`.store`, :mod:`.paging`) drive a backend only through
``SchedulerBackend``, ``Publisher`` and ``Reader``. What the protocols cannot express is in
:class:`Harness`, kept small, one method per backend difference; a backend author subclasses it:

* ``create_backend(sink, providers)`` builds a backend of the store under test (not opened);
  ``missing_store_backend()`` one whose store does not exist (not created, not migrated);
* ``now_ms()`` is the store's clock (an injected process clock, :class:`Clock`, or the
  database's);
* ``elapse(ms)`` makes ``ms`` pass for the store: an injected clock moves; a store whose clock
  cannot be moved moves every stored instant back by ``ms`` instead, which is the same thing as far
  as any decision can tell. The suites elapse whole seconds and use per-second crons, so
  occurrences stay aligned;
* ``run_round(between=...)`` runs one round, optionally calling ``between()`` after the round's
  first decision and before its commits (a test seam of the backend, or a patched ``decide``);
* ``count(table, trigger_id)``, ``task_revisions_of_runs(trigger_id)`` and ``drift_run(run_id)``
  inspect and damage rows directly (tables by neutral name: ``runs``, ``attempts``, ``events``,
  ``skips``).

``leased`` says whether the backend claims schedules under a lease (it raises the floor of a
``skip`` grace, :func:`~qinglong.contracts.store.skip_grace_floor_ms`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable

from qinglong.contracts.store import SchedulerLimits
# The suites publish cron triggers: the built-in kind, shipped in the same distribution.
from qinglong.plugins.cron.provider import CronProvider

#: Limits of every harness backend: a one-second cadence and a short lease, so a leased backend's
#: skip grace floor (cadence + lease) stays small.
LIMITS = SchedulerLimits(page_size=32, claim_budget=16, lease_ms=4000, cadence_ms=1000)

#: Where an injected clock starts: minute-aligned (2023-11-14T22:13:00Z) plus 300 ms, so publishing
#: does not fall on an occurrence, as on a store whose clock is real.
CLOCK_T0 = 1_699_999_980_300


class OtherKindProvider(CronProvider):
    """A second, real trigger kind (cron maths under another name), for the unknown-kind tests."""

    kind = "othercron"


class BrokenOtherKindProvider(OtherKindProvider):
    """The second kind's plugin with a bug: it validates specs but cannot compute occurrences."""

    def next_after(self, spec, after_ms):
        raise RuntimeError("occurrence computation failed")

    def latest_at_or_before(self, spec, at_ms):
        raise RuntimeError("occurrence computation failed")


def providers(*, other_kind: bool = False, broken_other_kind: bool = False) -> dict:
    """The trigger providers a harness backend gets: ``cron``, and for the unknown-kind tests a
    second kind ``othercron``, working or broken."""
    found: dict = {"cron": CronProvider()}
    if other_kind:
        found["othercron"] = OtherKindProvider()
    if broken_other_kind:
        found["othercron"] = BrokenOtherKindProvider()
    return found


class CollectingSink:
    """A diagnostic sink that keeps every event, for assertions."""

    def __init__(self) -> None:
        self.events: list = []

    def emit(self, event) -> None:
        self.events.append(event)

    def codes(self) -> list[str]:
        return [e.code for e in self.events]


class Clock:
    """An injected process clock (epoch ms) that only moves when told to."""

    def __init__(self, ms: int = CLOCK_T0) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


class Harness:
    """One backend under test, opened, migrated and ready; see the module docstring."""

    name: str
    leased: bool
    backend: Any
    sink: CollectingSink

    # ---- protocol access -----------------------------------------------------------------
    @property
    def publisher(self):
        return self.backend.publisher()

    @property
    def reader(self):
        return self.backend.reader()

    async def start(self) -> None:
        """Create, open, migrate and check the backend (the runner calls it before each test)."""
        self.sink = CollectingSink()
        self.backend = self.create_backend(self.sink, providers())
        await self.backend.open()
        await self.backend.migrate()
        await self.backend.check_readiness()

    async def stop(self) -> None:
        """Close the backend (the runner calls it after each test)."""
        await self.backend.close()

    async def restart(self, found: dict | None = None) -> None:
        """Close the backend and open a new one on the same store (a process restart), with
        other providers if ``found``."""
        await self.backend.close()
        self.backend = self.create_backend(self.sink, found or providers())
        await self.backend.open()

    # ---- what a backend author implements ------------------------------------------------
    def create_backend(self, sink, found: dict):
        """A backend of the store under test (created, not opened), with these providers."""
        raise NotImplementedError

    def missing_store_backend(self):
        """A backend whose store does not exist (not created, not migrated)."""
        raise NotImplementedError

    async def run_round(self, between: Callable[[], None] | None = None):
        """One round; ``between()`` after its first decision, before its commits."""
        raise NotImplementedError

    async def now_ms(self) -> int:
        """The store's clock."""
        raise NotImplementedError

    async def elapse(self, ms: int) -> None:
        """Make ``ms`` pass for the store."""
        raise NotImplementedError

    def count(self, table: str, trigger_id: str | None = None) -> int:
        """Rows of ``runs``, ``attempts``, ``events`` or ``skips`` (of one trigger's Runs)."""
        raise NotImplementedError

    def drift_run(self, run_id: str) -> None:
        """Change a queued Run so that it is no longer exactly as admission left it."""
        raise NotImplementedError

    def task_revisions_of_runs(self, trigger_id: str) -> list[int]:
        """The task revision of each Run of ``trigger_id``, by scheduled time."""
        raise NotImplementedError

    # ---- helpers built on the above ------------------------------------------------------
    def elsewhere(self, body: Callable[[Any], Awaitable[Any]], *, found: dict | None = None) -> Any:
        """Run ``body(backend)`` on a second backend of the same store, in its own thread and
        event loop, and wait for it (used between a round's decisions and its commits, and to
        run a round with other providers)."""
        result: dict = {}

        def work() -> None:
            async def main():
                other = self.create_backend(CollectingSink(), found or providers())
                await other.open()
                try:
                    return await body(other)
                finally:
                    await other.close()
            try:
                result["value"] = asyncio.run(main())
            except BaseException as exc:  # re-raised in the caller
                result["error"] = exc

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(120)
        if thread.is_alive():
            raise TimeoutError("the second backend did not finish within 120 s")
        if "error" in result:
            raise result["error"]
        return result["value"]


__all__ = ["BrokenOtherKindProvider", "CLOCK_T0", "Clock", "CollectingSink", "Harness", "LIMITS",
           "OtherKindProvider", "providers"]
