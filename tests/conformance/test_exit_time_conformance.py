"""An Attempt's end is its job's own exit on every store, not the moment the end was recorded
after the drain of the job's output: on SQLite the exit the local dispatcher's wrapper noted, on
PostgreSQL the worker's completion stating how long before it the job exited. So `runs show`
gives the same duration on each profile."""

from __future__ import annotations

from qinglong.contracts.capabilities import runs_of
from qinglong.testing.conformance.store import every_second, initialized

from tests.conformance.ending import end_current_after_drain, outcome

SECOND = 1000


async def test_the_attempts_duration_is_its_jobs_not_the_drain_after_its_exit(harness):
    """A store that dated the end on the report's arrival showed a 1 s job as lasting 5 s (the
    4 s drain of a helper's output included) where another store shows 1 s: the operator would
    be told two durations for one job, one of them false."""
    await harness.publisher.create_project("p1")
    await harness.publisher.put_task("p1", "t1", {"command": ["true"]})
    await initialized(harness, "a", every_second("a"))
    await harness.elapse(SECOND)
    report = await harness.run_round()
    assert report.admitted >= 1, report
    runs = await harness.reader.recent_runs(limit=100, trigger_id="a")
    run_id = min(runs, key=lambda r: r.scheduled_for_ms).run_id
    await end_current_after_drain(harness, run_id, outcome("succeeded", 0), SECOND, 4 * SECOND)
    detail = await runs_of(harness.backend).run_detail(run_id)
    (attempt,) = detail.attempts
    assert str(getattr(attempt.state, "value", attempt.state)) == "succeeded"
    # the job's second (and, on PostgreSQL, the real milliseconds the calls took), never the drain
    assert SECOND <= attempt.duration_ms < 5 * SECOND, attempt
    assert attempt.finished_at_ms <= detail.run.finished_at_ms - 4 * SECOND, (attempt, detail.run)
