"""Ending Attempts on every backend, the way each really ends them: on SQLite the local
dispatcher's calls on the execution store, on PostgreSQL a worker's calls through the worker
protocol (the gateway role). So the store figures about ends are checked on what each
store really writes."""

from __future__ import annotations

import dataclasses
import os

from qinglong.contracts.execution import AttemptOutcome, AttemptState, ProcessHandle

HANDLE = ProcessHandle("boot", 4242, 4242, 99)


def outcome(state: str, exit_code: int | None = None) -> AttemptOutcome:
    reason = {"lost": "the process ended without a completion receipt",
              "timed_out": "the timeout passed"}.get(state)
    return AttemptOutcome(AttemptState(state), exit_code=exit_code, log_bytes=0, reason=reason)


async def _end(h, run_id: str, result: AttemptOutcome, *, stop_reason=None, ran_ms: int = 0,
               drain_ms: int | None = None) -> None:
    """Dispatch, start and end the Run's current Attempt with ``result`` (the oldest waiting Run:
    a worker claims in dispatch order). With ``stop_reason``, the one running it took up its own
    stop during the drain; with ``drain_ms``, the job exited ``ran_ms`` after its start and its
    end was reported ``drain_ms`` later. On SQLite the dispatcher's calls on the execution store,
    on PostgreSQL a worker's through the worker protocol."""
    execution = getattr(h.backend, "execution", None)
    if execution is not None:
        from qinglong.contracts.execution import Actor

        store = execution()
        attempt = (await store.run_detail(run_id)).attempts[-1]
        now = await h.now_ms()
        assert await store.begin_dispatch(attempt.attempt_id, f"/logs/{attempt.attempt_id}",
                                          now + 60_000, now)
        assert await store.record_started(attempt.attempt_id, HANDLE, await h.now_ms())
        if drain_ms is not None:
            await h.elapse(ran_ms)
            result = dataclasses.replace(result, ended_at_ms=await h.now_ms())
            await h.elapse(drain_ms)
        if stop_reason is not None:
            await store.request_cancel(run_id, stop_reason, await h.now_ms(), Actor.DISPATCHER)
        await store.record_finished(attempt.attempt_id, result, await h.now_ms(), Actor.COMPLETION)
        return
    from qinglong.contracts.worker import OwnStop
    from qinglong.plugins.cluster_postgres.worker_client import PostgresWorkerProtocol

    protocol = PostgresWorkerProtocol(h.dsn("qinglong_gateway"), "conformance worker")
    try:
        session = await protocol.open_session(f"w-{run_id[:8]}", [], 256, 600_000)
        (claimed,) = await protocol.claim(session.fence, [os.urandom(32)])
        assert claimed.run_id == run_id, "end Runs in dispatch order (oldest first)"
        await protocol.started(session.fence, claimed.lease)
        extra = {}
        if stop_reason is not None:
            extra["own_stop"] = OwnStop(stop_reason, 0)
        if drain_ms is not None:
            await h.elapse(ran_ms + drain_ms)
            extra["exit_age_ms"] = drain_ms
        await protocol.complete(session.fence, claimed.lease, result, **extra)
        await protocol.close_session(session.fence)
    finally:
        await protocol.close()


async def end_current(h, run_id: str, result: AttemptOutcome) -> None:
    """Dispatch, start and end the Run's current Attempt with ``result``."""
    await _end(h, run_id, result)


async def end_current_after_own_stop(h, run_id: str, result: AttemptOutcome, reason) -> None:
    """End the current Attempt with ``result``, the job's own exit, reported after the one running
    it took up its own stop request ``reason`` (its timeout, its shutdown) during the drain."""
    await _end(h, run_id, result, stop_reason=reason)


async def end_current_after_drain(h, run_id: str, result: AttemptOutcome, ran_ms: int, drain_ms: int) -> None:
    """End the current Attempt with ``result``: its job exits ``ran_ms`` after its start, and its
    end is reported ``drain_ms`` later (the drain of its output)."""
    await _end(h, run_id, result, ran_ms=ran_ms, drain_ms=drain_ms)
