"""A stop request the executing side makes itself (its timeout, its shutdown) that lands after
the job's own exit, while its output drains: every store keeps the job's exit as the outcome and
the request beside it, so ``runs show`` and ``runs --json`` say the same on each. On SQLite the
local dispatcher writes the request to the store before signalling; on PostgreSQL the worker
states it in its completion (the gateway role's ``worker_complete``)."""

from __future__ import annotations

from qinglong.contracts.capabilities import runs_of
from qinglong.contracts.execution import CancelReason
from qinglong.testing.conformance.store import every_second, initialized

from tests.conformance.ending import end_current_after_own_stop, outcome

SECOND = 1000


async def _one_run(h, retry: dict | None = None) -> str:
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", {"command": ["true"], **({"retry": retry} if retry else {})})
    await initialized(h, "a", every_second("a"))
    await h.elapse(SECOND)
    report = await h.run_round()
    assert report.admitted >= 1, report
    runs = await h.reader.recent_runs(limit=100, trigger_id="a")
    return min(runs, key=lambda r: r.scheduled_for_ms).run_id


def _events(h, run_id: str) -> list[str]:
    if h.name == "sqlite":
        return [r[0] for r in h._sql("SELECT type FROM run_events WHERE run_id = ? ORDER BY seq", (run_id,))]
    return [r[0] for r in h._sql("SELECT event_type FROM qinglong.run_events WHERE run_id = %s ORDER BY seq",
                                 (run_id,))]


async def test_a_timeout_taken_up_after_the_jobs_exit_0_is_kept_beside_its_success(harness):
    """Without the request in the store, `runs show` on the cluster could not say the timeout
    fired after the job's end (the local side does): the fact would be hidden, and the two
    profiles would tell one story two ways."""
    run_id = await _one_run(harness)
    await end_current_after_own_stop(harness, run_id, outcome("succeeded", 0), CancelReason.TIMEOUT)
    detail = await runs_of(harness.backend).run_detail(run_id)
    (attempt,) = detail.attempts
    assert (str(getattr(detail.run.state, "value", detail.run.state)), detail.run.exit_code) == ("succeeded", 0)
    assert (str(getattr(attempt.state, "value", attempt.state)), attempt.exit_code,
            attempt.cancel_reason) == ("succeeded", 0, "timeout")
    events = _events(harness, run_id)
    assert events.count("run.cancel_requested") == 1, events
    assert events.index("run.cancel_requested") < events.index("run.finished"), events


async def test_a_shutdown_after_a_failed_exit_stops_the_retries_on_every_store(harness):
    """A stop on purpose (the executing side shutting down) is never followed by a retry: a
    store that ignored it would run the job again after the operator stopped its host."""
    run_id = await _one_run(harness, {"max_attempts": 3, "initial_backoff_ms": SECOND, "jitter": 0})
    await end_current_after_own_stop(harness, run_id, outcome("failed", 3), CancelReason.SHUTDOWN)
    detail = await runs_of(harness.backend).run_detail(run_id)
    (attempt,) = detail.attempts
    assert str(getattr(detail.run.state, "value", detail.run.state)) == "failed", detail.run
    assert (attempt.exit_code, attempt.cancel_reason) == (3, "shutdown")
