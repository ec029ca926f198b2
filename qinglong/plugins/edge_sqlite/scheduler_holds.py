"""Held schedules: rows the scheduler cannot decide or commit, remembered for a bounded time and
reported within a budget, so a wall of them neither stops the round nor floods the diagnostics;
and the rate-limited report of a store that cannot be written.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from qinglong.contracts.diagnostics import DiagnosticEvent

from .queries import query
from .scheduler_read import DueRow, RoundOutcome, row_fields
from .store import translate_sqlite_error

#: How long an undecidable (trigger, revision) is first held; each further failure doubles it up
#: to :data:`HOLD_MAX_MS`. Publishing a new revision ends a hold at once (the pair changes).
HOLD_FIRST_MS = 60_000
HOLD_MAX_MS = 15 * 60_000

#: How many pairs the memory keeps (held or recently released); past it, new ones are not held.
HOLD_BOUND = 65_536

#: How many held rows one round reports one by one; the rest are summarised in one event.
DIAGNOSTICS_PER_ROUND = 10

#: How often a persisting store failure (disk full, read-only) is reported, at most.
STORE_FAILURE_REPORT_MS = 60_000


@dataclass(slots=True)
class _Hold:
    """One remembered pair: held (excluded from the scan) until ``until_ms`` while ``active``;
    once released, remembered for another ``hold_ms`` so a repeat is not reported again."""

    until_ms: int
    hold_ms: int
    active: bool = True


class HeldSchedules:
    """This process's memory of schedules that cannot be decided or committed, for a bounded time.

    Keyed by (trigger_id, trigger_revision): a new revision is a new pair, so republishing a
    trigger ends its hold at once. An active hold is mirrored in the connection's TEMP table
    ``scheduler_held``, which the page queries exclude, so a wall of undecidable rows at the front
    of the due index costs a round an index walk, not a page. When a hold expires the row is
    decided again; failing again holds it for twice as long (up to :data:`HOLD_MAX_MS`) without a
    new per-trigger diagnostic: each pair is reported once while it is remembered. A released pair
    is forgotten one hold period after it expired.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], _Hold] = {}
        self._store_failure_reported_at: int | None = None
        self._store_failures_unreported = 0

    def __len__(self) -> int:
        return sum(1 for hold in self._entries.values() if hold.active)

    def is_held(self, trigger_id: str, revision: int) -> bool:
        """True while (trigger_id, revision) is held (for tests and status)."""
        hold = self._entries.get((trigger_id, revision))
        return hold is not None and hold.active

    def sync(self, conn: sqlite3.Connection, now_ms: int) -> None:
        """Make the TEMP table match this memory: create it on a new connection (forgetting every
        hold, which lived in the old one), release expired holds, forget old released pairs."""
        if conn.execute(query("held_table_exists")).fetchone() is None:
            # Before the first TEMP object: keep it in memory, never in a temp file on the flash.
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute(query("create_held_table"))
            self._entries.clear()
        released = []
        for key, hold in list(self._entries.items()):
            # A clock that stepped back must not stretch a hold: one longer than its period ends.
            if hold.active and (hold.until_ms <= now_ms or hold.until_ms - now_ms > hold.hold_ms):
                hold.active = False
                hold.until_ms = min(hold.until_ms, now_ms)
                released.append(key)
            elif not hold.active and not now_ms - hold.hold_ms < hold.until_ms <= now_ms:
                del self._entries[key]
        if released:
            conn.executemany(query("delete_held"), released)

    def hold(self, conn: sqlite3.Connection, trigger_id: str, revision: int, now_ms: int) -> bool | None:
        """Hold a pair. True if it is newly reported, False if it was reported before (a repeat
        after its hold expired), None if the memory is full (not held; reported every time)."""
        key = (trigger_id, revision)
        hold = self._entries.get(key)
        if hold is None:
            if len(self._entries) >= HOLD_BOUND:
                self._forget_released()
                if len(self._entries) >= HOLD_BOUND:
                    return None
            self._entries[key] = _Hold(now_ms + HOLD_FIRST_MS, HOLD_FIRST_MS)
            conn.execute(query("insert_held"), key)
            return True
        if not hold.active:
            hold.hold_ms = min(hold.hold_ms * 2, HOLD_MAX_MS)
        hold.until_ms = now_ms + hold.hold_ms
        hold.active = True
        conn.execute(query("insert_held"), key)
        return False

    def _forget_released(self) -> None:
        for key in [k for k, hold in self._entries.items() if not hold.active]:
            del self._entries[key]

    def store_failure_due_for_report(self, now_ms: int) -> int | None:
        """Rate-limit reports of a failing store: the number of failures since the last report
        when one is due now, else None (and this failure is counted for the next)."""
        last = self._store_failure_reported_at
        if last is None or now_ms - last >= STORE_FAILURE_REPORT_MS or now_ms < last:
            count = self._store_failures_unreported + 1
            self._store_failure_reported_at = now_ms
            self._store_failures_unreported = 0
            return count
        self._store_failures_unreported += 1
        return None

    def store_recovered(self) -> None:
        """A commit succeeded: the next store failure is reported at once."""
        self._store_failure_reported_at = None
        self._store_failures_unreported = 0


class RoundHolds:
    """Holds made during one round, and their bounded reporting."""

    __slots__ = ("held", "conn", "now_ms", "outcome", "new", "repeated", "unheld", "reported")

    def __init__(self, held: HeldSchedules, conn: sqlite3.Connection, now_ms: int,
                 outcome: "RoundOutcome") -> None:
        self.held, self.conn, self.now_ms, self.outcome = held, conn, now_ms, outcome
        self.new = self.repeated = self.unheld = self.reported = 0

    def undecidable(self, code: str, row: DueRow | None, exc: BaseException) -> None:
        """Count an error, hold the row's pair, report it unless reported before or over budget."""
        self.outcome.errors += 1
        state: bool | None = None
        if row is not None:
            state = self.held.hold(self.conn, row.head.trigger_id, row.head.trigger_revision,
                                   self.now_ms)
        if state is False:
            self.repeated += 1
            return
        if state is True:
            self.new += 1
        else:
            self.unheld += 1
        if self.reported < DIAGNOSTICS_PER_ROUND:
            self.reported += 1
            fields = row_fields(row, exc)
            if state:
                fields["held_ms"] = HOLD_FIRST_MS
            self.outcome.diagnostics.append(DiagnosticEvent("error", code, str(exc)[:300], fields))

    def summarise(self) -> None:
        """One event for what was held but not reported one by one this round."""
        unreported = self.new + self.unheld - self.reported
        if unreported <= 0 and not self.repeated:
            return
        self.outcome.diagnostics.append(DiagnosticEvent(
            "error", "scheduler.undecidable_held",
            f"{unreported} more schedule(s) could not be decided or committed this round and "
            f"{self.repeated} reported before still cannot; they are held (skipped by the scan) "
            f"for {HOLD_FIRST_MS // 1000} s or more, then tried again",
            {"unreported": unreported, "repeated": self.repeated, "not_held": self.unheld,
             "held_total": len(self.held)},
        ))


def report_store_failure(outcome: RoundOutcome, held: HeldSchedules, row: DueRow,
                          exc: BaseException, now_ms: int, path: str) -> None:
    outcome.errors += 1
    count = held.store_failure_due_for_report(now_ms)
    if count is None:
        return
    message = str(exc)
    if path:
        try:
            message = str(translate_sqlite_error(exc, path))
        except Exception:  # the message is best effort; the failure is reported either way
            pass
    fields = row_fields(row, exc)
    fields["failures_since_last_report"] = count
    outcome.diagnostics.append(DiagnosticEvent(
        "error", "scheduler.store_failed",
        f"the round stopped committing: {message[:300]}", fields))
