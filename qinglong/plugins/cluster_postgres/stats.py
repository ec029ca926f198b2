"""The store-derived figures of the PostgreSQL store (:class:`~qinglong.contracts.observe.StoreStats`).

The database clock, then one statement of every figure at that instant and one of the failing
tasks' outcome figures (``sql/stats.sql``: ``stats_clock``, ``store_stats``, ``failing_tasks``; the instant is a bound value, so the planner reads each range
through its index), in a READ ONLY transaction whose
``statement_timeout`` is :data:`~qinglong.contracts.observe.STATS_READ_TIMEOUT_MS` (``SET LOCAL``:
it ends with the transaction, the pooled session keeps its own), on the runtime role's pool, in
database time. Waiting for a pooled connection is bounded by the same time. So a scrape, whatever
else the database is doing (a lock held by a migration, a slow disk), either answers within about
the bound or raises :class:`~qinglong.contracts.errors.StoreUnavailable`; the caller keeps its
last reading. Every replica reads the same figures.

Workers are read from their sessions (``workers_by_state``: live, expired, closed;
``worker_free_slots``; ``runs_without_worker``), and ended Attempts from the attempts table
(``attempts_finished`` by outcome, ``lost_recent``), as the workers reported them.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row
from psycopg_pool import PoolTimeout

from qinglong.contracts.errors import StoreUnavailable
from qinglong.contracts.execution import RunState
from qinglong.contracts.observe import (
    ENDED_OUTCOMES,
    FAILING_TASKS_SHOWN,
    FAILURE_STREAK_PERIODS,
    OUTCOME_WINDOW_MS,
    task_outcomes,
    LAG_WINDOW_MS,
    QUEUED_TASKS_SHOWN,
    RECENT_WINDOW_MS,
    STATS_READ_TIMEOUT_MS,
    StoreStats,
)

from .db import describe_error
from .sql import query


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


async def read_store_stats(pool_factory: Callable[[], Awaitable[Any]], live_window_ms: int,
                           timeout_ms: int = STATS_READ_TIMEOUT_MS) -> StoreStats:
    """One bounded reading of the store (see the module docstring). ``live_window_ms``: how
    recent a replica's last completed round must be for it to count as live."""
    params = {"lag_window_ms": LAG_WINDOW_MS, "recent_window_ms": RECENT_WINDOW_MS,
              "queued_tasks": QUEUED_TASKS_SHOWN,
              "live_window_ms": int(live_window_ms)}
    try:
        pool = await pool_factory()
        async with pool.connection(timeout=timeout_ms / 1000) as conn:
            async with conn.transaction():
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute("SET TRANSACTION READ ONLY")
                    await cur.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
                    await cur.execute(query("stats_clock"))
                    params["now_ms"] = (await cur.fetchone())["now_ms"]
                    await cur.execute(query("store_stats"), params)
                    row = await cur.fetchone()
                    await cur.execute(query("failing_tasks"), {
                        "now_ms": params["now_ms"], "window_ms": OUTCOME_WINDOW_MS,
                        "shown": FAILING_TASKS_SHOWN, "periods": FAILURE_STREAK_PERIODS})
                    failing = await cur.fetchall()
    except pg_errors.QueryCanceled:
        raise StoreUnavailable(
            f"the store's figures could not be read within {timeout_ms} ms (the statement timeout: "
            "a lock or a busy database); the last reading stands") from None
    except PoolTimeout:
        raise StoreUnavailable(
            f"no database connection within {timeout_ms} ms to read the store's figures (the pool "
            "is busy or the server does not answer); the last reading stands") from None
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"the store's figures could not be read: {describe_error(exc)}") from None
    runs_by_state = {state.value: 0 for state in RunState}
    runs_by_state.update({str(k): int(v) for k, v in (row["runs_by_state"] or {}).items()})
    attempts_finished = {state: 0 for state in ENDED_OUTCOMES}
    attempts_finished.update({str(k): int(v) for k, v in (row["attempts_finished"] or {}).items()})
    return StoreStats(
        now_ms=int(row["now_ms"]),
        schedules_total=int(row["schedules_total"]),
        schedules_enabled=int(row["schedules_enabled"]),
        schedules_due=int(row["schedules_due"]),
        oldest_due_ms=_int_or_none(row["oldest_due_ms"]),
        runs_by_state=runs_by_state,
        admission_lag_p50_ms=_int_or_none(row["admission_lag_p50_ms"]),
        admission_lag_p99_ms=_int_or_none(row["admission_lag_p99_ms"]),
        admitted_in_window=int(row["admitted_in_window"]),
        skipped_recent=int(row["skipped_recent"]),
        lost_recent=int(row["lost_recent"]),
        running=int(row["running"]),
        live_schedulers=int(row["live_schedulers"]),
        last_round_at_ms=_int_or_none(row["last_round_at_ms"]),
        workers_by_state={"live": int(row["workers_live"]), "expired": int(row["workers_expired"]),
                          "closed": int(row["workers_closed"])},
        worker_free_slots=int(row["worker_free_slots"]),
        runs_without_worker=int(row["runs_without_worker"]),
        attempts_finished=attempts_finished,
        tasks_failing=int(failing[0]["failing_total"]) if failing else 0,
        tasks_not_succeeding=int(failing[0]["not_succeeding_total"]) if failing else 0,
        failing_tasks=tuple(task_outcomes(r) for r in failing),
        queued_by_task={str(k): int(v) for k, v in (row["queued_by_task"] or {}).items()},
    )
