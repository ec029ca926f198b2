"""The control plane's own work on the workers' Attempts, in every ``qinglong run`` replica.

Four lifecycle components (``stack`` phase: they start after the scheduler and stop after it):

* :class:`ExpiryLoop` ends the workers' Attempts whose time ran out, about once a second, at most
  a page at a time: it reads the candidates (an expired lease, or a running Attempt whose deadline
  is past by its session's lease, in database time), decides each here through the contracts
  (:func:`expiry_decision`: an Attempt leased but never started goes back to the queue, or ends
  ``cancelled`` when a cancel was requested; a started one is ``lost``, a long-past deadline
  ``timed_out``, and :func:`~qinglong.contracts.execution.retry_decision` says whether Attempt N+1
  follows), and hands each decision to ``qinglong.expire_attempt``, which only checks the
  Attempt's fence and state under its row locks. Every replica runs it, leaderless: a decision
  made for an Attempt another replica ended first, or that a worker's heartbeat saved, writes
  nothing. A full page is followed at once by the next, so a backlog drains page by page.
* :class:`LogRetention` calls ``qinglong.prune_attempt_logs`` at a slow cadence (a tenth of the
  retention, between 1 s and 5 min), deleting the shipped logs of Attempts that ended more than
  ``[execution] log_retention_days`` ago, in bounded batches; the Attempt keeps a tombstone.
* :class:`SkipRetention` calls ``qinglong.prune_skips`` at the same cadence, deleting skip
  records older than ``[execution] skip_retention_days`` (never the last hour's), in bounded
  batches.
* :class:`StrandedRunsWatch` writes the ``queue.stalled`` operator event once per episode of queued
  Runs no live worker can take, and ``queue.resumed`` when it ends.

None ever raises out of its loop: an error is reported as a diagnostic (secret-free) and the
work is tried again at the next tick, so a database that goes away stops nothing. Each call is
bounded on the client side as the scheduler's round is: a connection still waiting after the
bound is severed and discarded, never handed back to the pool in an unknown state. ``stop`` lets
the current call finish (briefly) and cancels it otherwise.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any, Awaitable, Callable

from qinglong.contracts.frozen import record
from qinglong.contracts.errors import QinglongError
from qinglong.contracts.execution import (
    AttemptOutcome,
    AttemptState,
    CancelReason,
    RetryAt,
    cancel_words,
    retry_decision,
)
from qinglong.contracts.execution.skips import MAX_SKIP_PRUNE_BATCH
from qinglong.contracts.hookspecs import ComponentPhase
from qinglong.contracts.reasons import reason
from qinglong.contracts.stored_spec import MISSING, stored_retry_policy

from .db import describe_error, sever_after
from .runs import prune_skips_params
from .sql import query

#: Attempts one expiry call may handle (the function's ``p_limit``).
EXPIRY_PAGE = 64
#: Seconds between expiry calls when the last one was not full.
EXPIRY_INTERVAL_S = 1.0
#: Most pages one tick may run before it waits for the next (a backlog keeps its cadence fair).
MAX_PAGES_PER_TICK = 50
#: Longest and shortest pause between retention passes, seconds.
RETENTION_MAX_INTERVAL_S = 300.0
RETENTION_MIN_INTERVAL_S = 1.0
#: How long ``stop`` waits for the current call before cancelling it, seconds.
STOP_WAIT_S = 2.0


def retention_interval_s(retention_ms: int) -> float:
    """A tenth of the retention, clamped: a log is deleted at most ~10 % after its time."""
    return min(RETENTION_MAX_INTERVAL_S, max(RETENTION_MIN_INTERVAL_S, retention_ms / 10_000))


class _Periodic:
    """A loop calling ``tick`` every ``interval_s``; a tick that returns True (a full page) is
    followed at once by another, up to :data:`MAX_PAGES_PER_TICK`."""

    name = "cluster_postgres.periodic"
    phase = ComponentPhase.STACK
    failure_code = "cluster_postgres.periodic_failed"

    def __init__(self, backend: Any, interval_s: float) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self._stopping = asyncio.Event()
        self._task: asyncio.Task | None = None
        #: Ticks run and ticks that failed (read by tests and diagnostics).
        self.ticks = 0
        self.failures = 0

    async def tick(self) -> bool:
        raise NotImplementedError

    async def start(self) -> None:
        """Start the loop task (returns at once)."""
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        """Let the current call finish for up to :data:`STOP_WAIT_S`, then cancel it."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)
        except asyncio.TimeoutError:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            for _ in range(MAX_PAGES_PER_TICK):
                if self._stopping.is_set():
                    return
                self.ticks += 1
                try:
                    more = await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # reported and retried next tick: never fatal
                    self.failures += 1
                    text = str(exc) if isinstance(exc, QinglongError) else describe_error(
                        exc, self.backend.secrets)
                    self.backend._emit("error", self.failure_code, f"{self.name}: {text}")
                    more = False
                if not more:
                    break
                await asyncio.sleep(0)
            try:
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass

    async def _call(self, body: Callable[[Any], Awaitable[Any]]) -> Any:
        """``body(conn)`` on a runtime connection, severed if it outlives the statement timeout
        plus the pool's (a silent peer must not stall the loop)."""
        import psycopg

        settings = self.backend.settings
        bound_s = (settings.statement_timeout_ms + settings.pool_timeout_ms) / 1000 + 1.0
        deadline = time.monotonic() + bound_s
        pool = await self.backend.runtime_pool()
        async with asyncio.timeout(bound_s + 15.0):  # the last resort if severing did not end it
            async with pool.connection(timeout=settings.pool_timeout_ms / 1000) as conn:
                with sever_after(conn, deadline - time.monotonic()) as cut:
                    try:
                        return await body(conn)
                    except psycopg.Error:
                        if cut.severed:
                            raise TimeoutError(f"no answer from the database within {bound_s:.0f} s; "
                                               "the connection was discarded") from None
                        raise
                    finally:
                        if cut.severed:
                            await conn.close()  # the pool discards a closed connection


class ExpiryLoop(_Periodic):
    """Ends expired leases and long-past deadlines of the workers' Attempts (module docstring)."""

    name = "cluster_postgres.expiry"
    failure_code = "cluster_postgres.expiry_failed"

    def __init__(self, backend: Any, *, interval_s: float = EXPIRY_INTERVAL_S,
                 page: int = EXPIRY_PAGE) -> None:
        super().__init__(backend, interval_s)
        self.page = page
        #: Attempts this replica expired, by action.
        self.expired: dict[str, int] = {}

    async def tick(self) -> bool:
        rows, read = await self._call(lambda conn: expire_page(conn, self.page))
        for attempt_id, run_id, action in rows:
            self.expired[action] = self.expired.get(action, 0) + 1
            level = "info" if action == "requeued" else "warning"
            message = {
                "requeued": "an Attempt leased to a worker that never started it went back to the queue",
                "cancelled": "an Attempt leased to a worker that never started it ended cancelled "
                             "(a cancel was requested)",
                "lost": "a started Attempt's lease expired with no completion: it is lost "
                        "(the retry policy decides whether it runs again)",
                "timed_out": "a running Attempt's deadline is long past with no completion: it "
                             "ended timed_out",
            }.get(action, f"an Attempt expired ({action})")
            self.backend._emit(level, "cluster_postgres.attempt_expired", message,
                               attempt_id=attempt_id, run_id=run_id, action=action)
        # a full page read means more may wait; a page of which this replica ended nothing was
        # another replica's, which goes on with it
        return read >= self.page and bool(rows)


@record
class ExpiryDecision:
    """What the control plane decided for one expired Attempt (``qinglong.expire_attempt``'s
    arguments): the action, the Attempt's reason, and a successor (its number and delay) or the
    stop's words when the Run's reason shows them."""

    action: str
    reason: str | None = None
    next_attempt_no: int | None = None
    retry_after_ms: int | None = None
    stop_words: str | None = None


def expiry_decision(row: dict, rng: random.Random | None = None) -> ExpiryDecision:
    """The decision for one row of ``control_expired_attempts``, through the contracts: a start
    that never happened is requeued (cancelled if a cancel was requested); a started Attempt whose
    lease expired is lost, one whose deadline is long past timed out; then
    :func:`retry_decision` under the pinned spec's policy, no successor after a cancel request
    other than a timeout, and the stop's words in the Run's reason only when retries were
    configured (the edge store's words)."""
    cancel = row["cancel_reason"]
    if row["expired"] == "lease" and row["state"] == AttemptState.DISPATCHING.value:
        if cancel is None:
            return ExpiryDecision("requeued")
        outcome = AttemptOutcome(AttemptState.CANCELLED, reason=reason(
            "cancelled_before_start", cancel=cancel_words(cancel)))
        started = False
    elif row["expired"] == "lease":
        outcome = AttemptOutcome(AttemptState.LOST, reason=reason(
            "lease_expired", worker_id=row["worker_id"], generation=row["session_generation"]))
        started = True
    else:
        outcome = AttemptOutcome(AttemptState.TIMED_OUT, reason=reason("deadline_unreported"))
        started = True
        cancel = cancel or CancelReason.TIMEOUT.value
    spec = MISSING if row["spec"] is None else json.loads(row["spec"])
    policy, idempotent = stored_retry_policy(spec)
    decision = retry_decision(policy, idempotent, row["attempt_no"], outcome, row["now_ms"], rng,
                              started=started)
    if isinstance(decision, RetryAt):
        if cancel is not None and cancel != CancelReason.TIMEOUT.value:
            return ExpiryDecision(outcome.state.value, outcome.reason)  # cancelled on purpose
        return ExpiryDecision(outcome.state.value, outcome.reason, decision.attempt_no,
                              decision.at_ms - row["now_ms"])
    return ExpiryDecision(outcome.state.value, outcome.reason,
                          stop_words=decision.reason if policy.max_attempts > 1 else None)


async def expire_page(conn: Any, limit: int) -> tuple[list[tuple[str, str, str]], int]:
    """One expiry page on ``conn`` (the runtime role, autocommit): ``(attempt_id, run_id,
    action)`` of every Attempt this call ended, at most ``limit`` (an Attempt that moved on since
    it was read, or that another replica holds, is left out), and how many were read."""
    from psycopg.rows import dict_row

    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(query("control_expired_attempts"), {"limit": limit})
    done = []
    rows = await cur.fetchall()
    for row in rows:
        decision = expiry_decision(row)
        await cur.execute(query("control_expire_attempt"), {
            "attempt_id": row["attempt_id"], "lease_version": row["lease_version"],
            "action": decision.action, "reason": decision.reason,
            "next_attempt_no": decision.next_attempt_no, "retry_after_ms": decision.retry_after_ms,
            "stop_words": decision.stop_words})
        action = (await cur.fetchone())["action"]
        if action is not None:
            done.append((row["attempt_id"], row["run_id"], action))
    return done, len(rows)


class LogRetention(_Periodic):
    """Deletes the shipped logs of Attempts ended longer ago than the retention."""

    name = "cluster_postgres.log_retention"
    failure_code = "cluster_postgres.log_retention_failed"

    def __init__(self, backend: Any, *, retention_ms: int, batch: int,
                 interval_s: float | None = None) -> None:
        super().__init__(backend, interval_s if interval_s is not None else retention_interval_s(retention_ms))
        self.retention_ms = retention_ms
        self.batch = batch
        self.pruned = 0

    async def tick(self) -> bool:
        async def body(conn):
            cur = await conn.execute(query("control_prune_logs"), {
                "retention_ms": self.retention_ms, "limit": self.batch})
            return (await cur.fetchone())[0] or 0

        pruned = await self._call(body)
        if pruned:
            self.pruned += pruned
            self.backend._emit("info", "cluster_postgres.logs_pruned",
                               f"pruned shipped logs past the log retention ({pruned} deleted)",
                               pruned=pruned, retention_ms=self.retention_ms)
        return pruned >= self.batch


class SkipRetention(_Periodic):
    """Deletes skip records (skipped occurrences, Runs skipped before they started) recorded
    longer ago than the retention, in database time."""

    name = "cluster_postgres.skip_retention"
    failure_code = "cluster_postgres.skip_retention_failed"

    def __init__(self, backend: Any, *, retention_ms: int, batch: int,
                 interval_s: float | None = None) -> None:
        super().__init__(backend, interval_s if interval_s is not None else retention_interval_s(retention_ms))
        self.retention_ms = retention_ms
        self.batch = min(batch, MAX_SKIP_PRUNE_BATCH)
        self.pruned = 0

    async def tick(self) -> bool:
        async def body(conn):
            cur = await conn.execute(query("control_prune_skips"), prune_skips_params(
                retention_ms=self.retention_ms, limit=self.batch))
            return tuple(await cur.fetchone())

        occurrences, runs = await self._call(body)
        if occurrences or runs:
            self.pruned += occurrences + runs
            self.backend._emit("info", "cluster_postgres.skips_pruned",
                               f"pruned skip records past the skip retention ({occurrences} skipped "
                               f"occurrences, {runs} skipped runs)",
                               occurrences=occurrences, runs=runs, retention_ms=self.retention_ms)
        return max(occurrences, runs) >= self.batch


class StrandedRunsWatch(_Periodic):
    """Opens the ``queue.stalled`` episode (one outbox event) while queued Runs that waited past
    the grace have no live worker able to take them, and closes it (``queue.resumed``) when none
    is left, through ``qinglong.check_stranded_runs``. Every replica runs it; the episode's key
    in the store makes each event once."""

    name = "cluster_postgres.stranded_runs"
    failure_code = "cluster_postgres.stranded_runs_failed"

    def __init__(self, backend: Any, *, grace_ms: int, interval_s: float | None = None) -> None:
        super().__init__(backend, interval_s if interval_s is not None
                         else min(5.0, max(0.2, grace_ms / 4000)))
        self.grace_ms = grace_ms
        #: The count of the last check (read by tests and diagnostics).
        self.stranded: int | None = None

    async def tick(self) -> bool:
        async def body(conn):
            cur = await conn.execute(query("events_stranded_runs"), {"grace_ms": self.grace_ms})
            return int((await cur.fetchone())[0])

        self.stranded = await self._call(body)
        return False


def control_components(backend: Any, settings: Any) -> list[_Periodic]:
    """The components of one replica: expiry, log and skip retention (``[execution]``'s
    ``log_retention_days``, ``skip_retention_days`` and ``prune_batch``), and the watch on Runs no worker can take
    (``[notifications] queue_stalled_after_ms``)."""
    execution = getattr(settings, "execution", None)
    days = float(getattr(execution, "log_retention_days", 7.0))
    batch = int(getattr(execution, "prune_batch", 200))
    notifications = getattr(settings, "notifications", None)
    stalled_ms = int(getattr(notifications, "queue_stalled_after_ms", 120_000))
    skip_days = float(getattr(execution, "skip_retention_days", 7.0))
    return [ExpiryLoop(backend),
            LogRetention(backend, retention_ms=max(1, int(days * 86_400_000)), batch=batch),
            SkipRetention(backend, retention_ms=max(1, int(skip_days * 86_400_000)), batch=batch),
            StrandedRunsWatch(backend, grace_ms=stalled_ms)]


__all__ = ["ExpiryDecision", "ExpiryLoop", "LogRetention", "SkipRetention", "StrandedRunsWatch",
           "control_components", "expire_page",
           "expiry_decision", "retention_interval_s"]
