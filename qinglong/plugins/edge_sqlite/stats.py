"""The store-derived figures of the SQLite store (:class:`~qinglong.contracts.observe.StoreStats`).

One read transaction on the connection's thread (one hop), bounded by
:data:`~qinglong.contracts.observe.STATS_READ_TIMEOUT_MS`: a progress handler interrupts a
statement past the deadline, and the busy timeout is lowered to what is left of it for the
duration, so a scrape never waits on the file longer than the bound. An interrupted read is
:class:`~qinglong.contracts.errors.StoreUnavailable`; nothing is written either way.

Cost (``sql/stats.sql``): the backlog is a range of the due index (the due part only), the lag
percentiles, recent skips and lost Attempts read indexes on the time they were recorded (migration
0005), running Attempts the active-attempts partial index, each task's outcome figures a few seeks
of its ended Runs (migration 0009); only the totals are counts: schedules of their table, Runs by
state of the narrow state index (migration 0006).

The store's time is the process clock the backend was given (the scheduler's clock), so a status
reading and a round agree on what is due.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Callable

from qinglong.contracts.errors import StoreUnavailable
from qinglong.contracts.execution import RunState
from qinglong.contracts.observe import (
    FAILING_TASKS_SHOWN,
    FAILURE_STREAK_PERIODS,
    LAG_WINDOW_MS,
    OUTCOME_WINDOW_MS,
    QUEUED_TASKS_SHOWN,
    RECENT_WINDOW_MS,
    STATS_READ_TIMEOUT_MS,
    StoreStats,
    nearest_rank,
    task_outcomes,
)

from .queries import query
from .store import SqliteStore, named_one, named_rows

#: Virtual-machine steps between two looks at the deadline (a few microseconds of work each).
_PROGRESS_STEPS = 1_000


class _Deadline:
    """A progress handler that interrupts the statement once ``timeout_ms`` has passed."""

    def __init__(self, timeout_ms: int) -> None:
        self.at = time.monotonic() + timeout_ms / 1000
        self.hit = False

    def __call__(self) -> int:
        if time.monotonic() > self.at:
            self.hit = True
            return 1
        return 0

    def left_ms(self) -> int:
        return max(1, int((self.at - time.monotonic()) * 1000))


def _read(conn: sqlite3.Connection, now_ms: int, busy_timeout_ms: int,
          timeout_ms: int) -> tuple[sqlite3.Row, dict[str, int], dict[int, int], list[sqlite3.Row],
                                dict[str, int]]:
    """On the connection's thread: the five reads in one read transaction, within the bound."""
    deadline = _Deadline(timeout_ms)
    conn.set_progress_handler(deadline, _PROGRESS_STEPS)
    conn.execute(f"PRAGMA busy_timeout = {min(int(busy_timeout_ms), deadline.left_ms())}")
    try:
        conn.execute("BEGIN")  # deferred: a read transaction, one snapshot of the WAL
        try:
            lag_since = now_ms - LAG_WINDOW_MS
            figures = named_one(conn, query("stats_figures"), {
                "now": now_ms, "recent_since": now_ms - RECENT_WINDOW_MS, "lag_since": lag_since})
            by_state = {row["state"]: int(row["n"])
                        for row in named_rows(conn, query("stats_runs_by_state"))}
            queued = {f"{row['project_id']}/{row['task_id']}": int(row["n"])
                      for row in named_rows(conn, query("stats_queued_by_task"), {"limit": QUEUED_TASKS_SHOWN})}
            lags: dict[int, int] = {}
            admitted = int(figures["admitted_in_window"])
            if admitted:
                ranks = {"rank_a": nearest_rank(admitted, 0.5), "rank_b": nearest_rank(admitted, 0.99),
                         "lag_since": lag_since}
                lags = {int(row["rn"]): int(row["lag"])
                        for row in named_rows(conn, query("stats_lag_at_ranks"), ranks)}
            failing = list(named_rows(conn, query("stats_failing_tasks"), {
                "window_since": now_ms - OUTCOME_WINDOW_MS, "shown": FAILING_TASKS_SHOWN,
                "periods": FAILURE_STREAK_PERIODS}))
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if deadline.hit or "interrupt" in str(exc).lower():
            raise StoreUnavailable(
                f"the store's figures could not be read within {timeout_ms} ms (the database is "
                "busy or very large); the last reading stands") from None
        raise
    finally:
        conn.set_progress_handler(None, 0)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    return figures, by_state, lags, failing, queued


async def read_store_stats(store: SqliteStore, clock_ms: Callable[[], int],
                           timeout_ms: int = STATS_READ_TIMEOUT_MS) -> StoreStats:
    """One bounded reading of the store at ``clock_ms()`` (see the module docstring)."""
    now = int(clock_ms())
    figures, by_state, lags, failing, queued = await store.call(
        _read, now, store.settings.busy_timeout_ms, timeout_ms)
    admitted = int(figures["admitted_in_window"])
    p50 = lags.get(nearest_rank(admitted, 0.5)) if admitted else None
    p99 = lags.get(nearest_rank(admitted, 0.99)) if admitted else None
    runs_by_state = {state.value: 0 for state in RunState}
    runs_by_state.update(by_state)
    # The owner lock is what a running scheduler holds (this process's own, or another's).
    live = 1 if store.owner_pid() is not None else 0
    oldest = figures["oldest_due_ms"]
    return StoreStats(
        now_ms=now,
        schedules_total=int(figures["schedules_total"]),
        schedules_enabled=int(figures["schedules_enabled"]),
        schedules_due=int(figures["schedules_due"]),
        oldest_due_ms=None if oldest is None else int(oldest),
        runs_by_state=runs_by_state,
        admission_lag_p50_ms=p50,
        admission_lag_p99_ms=p99,
        admitted_in_window=admitted,
        skipped_recent=int(figures["skipped_recent"]),
        lost_recent=int(figures["lost_recent"]),
        running=int(figures["running"]),
        live_schedulers=live,
        # The edge scheduler writes nothing per round (flash wear), so no round time is stored.
        last_round_at_ms=None,
        tasks_failing=int(failing[0]["failing_total"]) if failing else 0,
        tasks_not_succeeding=int(failing[0]["not_succeeding_total"]) if failing else 0,
        failing_tasks=tuple(task_outcomes(row) for row in failing),
        queued_by_task=queued,
    )
