"""Every execution-store behaviour of the contracts, on every backend that executes Runs itself.

The tests drive a store only through ``ExecutionStore`` (``backend.execution()``), ``Publisher``
and the harness's clock (see ``conftest.py``); the one thing the protocols do not show, a Run's
events, is read by :func:`events_of`. Today the edge SQLite store is the only one that executes;
a backend joins by adding its harness name to :data:`EXECUTION_BACKENDS` (and a branch to
:func:`events_of`).
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from qinglong.contracts.errors import NotFound, UserError
from qinglong.contracts.execution import (
    RUN_TRANSITIONS,
    ActiveRun,
    Actor,
    AttemptOutcome,
    AttemptState,
    CancelReason,
    ConcurrencyMode,
    ConcurrencyPolicy,
    IllegalTransition,
    MAX_SKIP_PRUNE_BATCH,
    MIN_SKIP_RETENTION_MS,
    ProcessHandle,
    PrunesSkips,
    Receipt,
    RetryAt,
    RunState,
    SkipPruneReport,
    classify_outcome,
    overlap_decision,
    skip_cutoff_ms,
)
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

from tests.conformance.harnesses import CollectingSink, SqliteHarness, providers
from tests.support.aio import closing

SECOND = 1000

#: Every backend whose ``execution()`` is not None, by harness name.
EXECUTION_BACKENDS = ["sqlite"]


@pytest.fixture(params=EXECUTION_BACKENDS)
def harness(request, tmp_path):
    """A harness of each executing backend (started and stopped by the conftest's runner)."""
    if request.param == "sqlite":
        yield SqliteHarness(tmp_path / "qinglong.db")
        return
    raise LookupError(f"no harness for executing backend {request.param!r}")


def events_of(h, run_id: str) -> list[tuple[int, str]]:
    """The Run's events as (seq, type), in seq order (backend SQL: no protocol lists events)."""
    if h.name == "sqlite":
        return [tuple(r) for r in h._sql(
            "SELECT seq, type FROM run_events WHERE run_id = ? ORDER BY seq", (run_id,))]
    raise LookupError(f"no event reader for {h.name!r}")


HANDLE = ProcessHandle("boot", 4242, 4242, 99)
NOTHING = SkipPruneReport(0, 0)


def store(h):
    return h.backend.execution()


async def publish(h, task_id: str = "t1", **spec) -> None:
    if not [p for p in await h.reader.list_projects() if p.project_id == "p1"]:
        await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", task_id, {"command": ["true"], **spec})


def retrying(max_attempts: int, **more) -> dict:
    return {"retry": {"max_attempts": max_attempts, "initial_backoff_ms": SECOND, "jitter": 0,
                      **more}}


async def manual(h, task_id: str = "t1", key: str | None = None) -> str:
    run_id, created = await store(h).admit_manual_run("p1", task_id, key or uuid.uuid4().hex,
                                                      await h.now_ms())
    assert created
    return run_id


async def detail(h, run_id: str):
    return await store(h).run_detail(run_id)


async def state_of(h, run_id: str) -> RunState:
    return (await detail(h, run_id)).run.state


async def current(h, run_id: str):
    return (await detail(h, run_id)).attempts[-1]


async def dispatch(h, run_id: str) -> str:
    """claimed -> dispatching for the Run's current Attempt; returns its id."""
    attempt = await current(h, run_id)
    now = await h.now_ms()
    assert await store(h).begin_dispatch(attempt.attempt_id, f"/logs/{attempt.attempt_id}",
                                         now + 60 * SECOND, now)
    return attempt.attempt_id


async def start(h, run_id: str) -> str:
    """Dispatch and record the process started; returns the Attempt's id."""
    attempt_id = await dispatch(h, run_id)
    assert await store(h).record_started(attempt_id, HANDLE, await h.now_ms())
    return attempt_id


def exited(code: int, at_ms: int, log_bytes: int = 5) -> AttemptOutcome:
    return classify_outcome(Receipt(code, None, at_ms, log_bytes), None)


async def finish(h, attempt_id: str, outcome: AttemptOutcome, actor: Actor = Actor.COMPLETION):
    return await store(h).record_finished(attempt_id, outcome, await h.now_ms(), actor)


# ---- dispatch ---------------------------------------------------------------------------------

async def test_candidates_come_in_scheduled_time_then_admission_order_and_respect_the_limit(harness):
    """A dispatcher that started Runs in admission order would run a trigger's late backlog after
    a newer manual Run, and one that ignored the limit would read the whole backlog at once."""
    h = harness
    await publish(h)
    await publish(h, "t2")
    await h.publisher.put_trigger(TriggerDefinition("p1", "tr", "t2", "cron",
                                                    {"expression": "* * * * * *"},
                                                    MisfirePolicy.FIRE_ONCE, 60_000))
    await h.run_round()  # initializes the cursor
    await h.elapse(3 * SECOND)
    first_manual = await manual(h)  # admitted before the backlog, scheduled after most of it
    await h.elapse(SECOND)
    second_manual = await manual(h)
    report = await h.run_round()
    assert report.admitted >= 3
    candidates = await store(h).dispatch_candidates(await h.now_ms(), 100)
    keys = [(c.scheduled_for_ms, c.admitted_at_ms, c.run_id) for c in candidates]
    assert keys == sorted(keys) and len(keys) == report.admitted + 2
    by_id = {c.run_id: c for c in candidates}
    manual_position = [c.run_id for c in candidates].index(first_manual)
    assert any(c.admitted_at_ms > by_id[first_manual].admitted_at_ms
               for c in candidates[:manual_position]), "a later admission scheduled earlier goes first"
    assert {c.run_id for c in candidates} >= {first_manual, second_manual}
    assert all(c.run_state is RunState.QUEUED and c.attempt_no == 1 for c in candidates)
    assert all(c.spec is not None and c.spec.command == ("true",) for c in candidates)
    assert [c.run_id for c in await store(h).dispatch_candidates(await h.now_ms(), 2)] == \
        [c.run_id for c in candidates[:2]]


async def test_a_task_without_a_command_is_a_candidate_without_a_spec(harness):
    """Admission must not depend on the spec: a Run of a task with no command is offered with no
    spec (to fail at dispatch, saying so) rather than left queued for ever."""
    h = harness
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", {"note": "nothing to run"})
    run_id = await manual(h)
    [candidate] = await store(h).dispatch_candidates(await h.now_ms(), 10)
    assert (candidate.run_id, candidate.spec) == (run_id, None)
    assert "no command" in candidate.spec_error
    attempt_id = await dispatch(h, run_id)
    result = await store(h).record_finished(
        attempt_id, AttemptOutcome(AttemptState.FAILED, reason=candidate.spec_error),
        await h.now_ms(), Actor.DISPATCHER, started=False)
    assert (result.recorded, result.run_state) == (True, RunState.FAILED)
    assert "no command" in (await detail(h, run_id)).run.reason


async def test_two_dispatchers_racing_for_one_attempt_find_exactly_one_winner(harness):
    """Two winners would start one Attempt's process twice (a job run twice)."""
    h = harness
    await publish(h)
    run_ids = [await manual(h) for _ in range(5)]
    other = h.create_backend(CollectingSink(), providers())
    await other.open()
    async with closing(other):
        for run_id in run_ids:
            attempt = await current(h, run_id)
            now = await h.now_ms()
            results = await asyncio.gather(*(
                s.begin_dispatch(attempt.attempt_id, f"/logs/{attempt.attempt_id}", now + SECOND, now)
                for s in (store(h), other.execution())))
            assert sorted(results) == [False, True], results
            assert await state_of(h, run_id) is RunState.DISPATCHING
            assert [t for _, t in events_of(h, run_id)].count("run.dispatching") == 1
    assert await store(h).dispatch_candidates(await h.now_ms(), 10) == []


async def test_begin_dispatch_refuses_an_attempt_that_is_not_claimed_and_due(harness):
    """Dispatching a retry before its backoff, or an ended Attempt, would start a process that
    the policy did not allow."""
    h = harness
    await publish(h, **retrying(2))
    run_id = await manual(h)
    attempt_id = await start(h, run_id)
    now = await h.now_ms()
    assert not await store(h).begin_dispatch(attempt_id, "/logs/x", now, now)  # running
    result = await finish(h, attempt_id, exited(1, now))
    assert isinstance(result.next_attempt, RetryAt) and result.run_state is RunState.RETRY_WAIT
    retry = await current(h, run_id)
    assert retry.not_before_ms == now + SECOND
    assert not await store(h).begin_dispatch(retry.attempt_id, "/logs/y", now + 5, now + 5)
    assert await store(h).dispatch_candidates(now + SECOND - 1, 10) == []
    [due] = await store(h).dispatch_candidates(now + SECOND, 10)
    assert (due.attempt_id, due.attempt_no, due.run_state) == (retry.attempt_id, 2, RunState.RETRY_WAIT)
    assert await store(h).begin_dispatch(retry.attempt_id, "/logs/y", now + 2 * SECOND, now + SECOND)
    assert not await store(h).begin_dispatch(attempt_id, "/logs/x", now + SECOND, now + SECOND)


async def test_begin_dispatches_moves_what_begin_dispatch_would_in_one_transaction(harness):
    """A pass begins its starts together. If the batch moved an Attempt begin_dispatch refuses
    (running, waiting out its backoff, begun already), a second process would start for one Run;
    if it left out one begin_dispatch moves, a startable Run would wait; a payload missing or
    another Run's would hand a job the wrong event (tests/execution: an event's job reads its
    payload through the dispatcher)."""
    h = harness
    await publish(h, **retrying(2))
    now = await h.now_ms()
    fresh = [await manual(h) for _ in range(3)]
    running_run = await manual(h)
    running_attempt = await start(h, running_run)
    backoff_run = await manual(h)
    ended = await start(h, backoff_run)
    await finish(h, ended, exited(1, now))
    backoff = (await current(h, backoff_run)).attempt_id
    begun_run = await manual(h)
    begun = await dispatch(h, begun_run)
    firsts = [(await current(h, r)).attempt_id for r in fresh]
    asked = [*firsts, running_attempt, backoff, begun, "no-such-attempt", firsts[0]]
    before = {r: await state_of(h, r) for r in [*fresh, running_run, backoff_run, begun_run]}
    began = await store(h).begin_dispatches([(a, f"/logs/{a}", now + SECOND) for a in asked], now)
    assert set(began) == set(firsts), began
    assert all(payload is None for payload in began.values())
    for run_id in fresh:
        assert await state_of(h, run_id) is RunState.DISPATCHING
        assert [t for _, t in events_of(h, run_id)].count("run.dispatching") == 1
        assert (await current(h, run_id)).attempt_dir == f"/logs/{(await current(h, run_id)).attempt_id}"
    for run_id in (running_run, backoff_run, begun_run):
        assert await state_of(h, run_id) is before[run_id]
    # the same asks one by one, on what is left: nothing more moves
    assert not [a for a in asked if await store(h).begin_dispatch(a, "/logs/again", now + SECOND, now)]
    assert await store(h).begin_dispatches([], now) == {}


async def test_record_started_moves_only_a_dispatching_attempt(harness):
    """A start recorded on a claimed or ended Attempt would name a process for a Run that has
    none (it would be waited on, or signalled, for ever)."""
    h = harness
    await publish(h)
    run_id = await manual(h)
    attempt = await current(h, run_id)
    assert not await store(h).record_started(attempt.attempt_id, HANDLE, await h.now_ms())
    assert await state_of(h, run_id) is RunState.QUEUED
    await dispatch(h, run_id)
    assert await store(h).record_started(attempt.attempt_id, HANDLE, await h.now_ms())
    assert not await store(h).record_started(attempt.attempt_id, HANDLE, await h.now_ms())
    [active] = await store(h).active_attempts()
    assert (active.attempt_id, active.state, active.handle) == (attempt.attempt_id,
                                                                AttemptState.RUNNING, HANDLE)
    assert active.attempt_dir == f"/logs/{attempt.attempt_id}" and active.deadline_ms is not None
    await finish(h, attempt.attempt_id, exited(0, await h.now_ms()))
    assert not await store(h).record_started(attempt.attempt_id, HANDLE, await h.now_ms())
    assert await store(h).active_attempts() == []


async def test_a_start_that_never_happened_goes_back_to_the_queue_unless_cancelled(harness):
    """A dispatching Attempt whose process never started would be stranded (never run) if it
    could not be queued again, and a cancelled one would run after all if it were."""
    h = harness
    await publish(h)
    run_id, cancelled_id = await manual(h), await manual(h)
    attempt_id = await dispatch(h, run_id)
    assert await store(h).return_to_queue(attempt_id, await h.now_ms())
    assert not await store(h).return_to_queue(attempt_id, await h.now_ms())
    assert await state_of(h, run_id) is RunState.QUEUED
    assert (await current(h, run_id)).attempt_id == attempt_id
    other = await dispatch(h, cancelled_id)
    assert await store(h).request_cancel(cancelled_id, CancelReason.OPERATOR,
                                         await h.now_ms()) is RunState.DISPATCHING
    assert await store(h).return_to_queue(other, await h.now_ms())
    assert await state_of(h, cancelled_id) is RunState.CANCELLED
    assert [c.run_id for c in await store(h).dispatch_candidates(await h.now_ms(), 10)] == [run_id]


# ---- completion and retries --------------------------------------------------------------------

async def test_an_outcome_is_recorded_exactly_once(harness):
    """A second completion (a reconciler and a waiter both seeing the end) must not overwrite the
    first exit code, add an Attempt or end the Run twice."""
    h = harness
    await publish(h, **retrying(3))
    run_id = await manual(h)
    attempt_id = await start(h, run_id)
    now = await h.now_ms()
    first = await finish(h, attempt_id, exited(0, now, log_bytes=7))
    assert (first.recorded, first.run_state, first.next_attempt) == (True, RunState.SUCCEEDED, None)
    before = (await detail(h, run_id), events_of(h, run_id))
    again = await finish(h, attempt_id, exited(3, now + 1))
    lost = await store(h).record_finished(attempt_id, AttemptOutcome(AttemptState.LOST, reason="x"),
                                          now + 2, Actor.RECONCILER)
    assert (again.recorded, again.run_state) == (False, RunState.SUCCEEDED)
    assert (lost.recorded, lost.run_state) == (False, RunState.SUCCEEDED)
    assert (await detail(h, run_id), events_of(h, run_id)) == before
    view = before[0].attempts[0]
    assert (view.exit_code, view.log_bytes, len(before[0].attempts)) == (0, 7, 1)


@pytest.mark.parametrize("max_attempts", [1, 2, 3])
async def test_failing_attempts_are_retried_up_to_the_policy_and_never_beyond(harness, max_attempts):
    """More Attempts than the policy allows run a failing job again; fewer give up early."""
    h = harness
    await publish(h, **retrying(max_attempts))
    run_id = await manual(h)
    for number in range(1, max_attempts + 1):
        attempt_id = await start(h, run_id)
        await h.elapse(2 * SECOND)
        result = await finish(h, attempt_id, exited(2, await h.now_ms()))
        if number < max_attempts:
            assert result.run_state is RunState.RETRY_WAIT
            assert result.next_attempt.attempt_no == number + 1
            await h.elapse(result.next_attempt.at_ms - await h.now_ms())
        else:
            assert (result.run_state, result.next_attempt) == (RunState.FAILED, None)
    run = await detail(h, run_id)
    assert [a.attempt_no for a in run.attempts] == list(range(1, max_attempts + 1))
    assert all(a.state is AttemptState.FAILED and a.exit_code == 2 for a in run.attempts)
    assert (run.run.attempts, run.run.exit_code, run.run.duration_ms) == (max_attempts, 2, 2 * SECOND)
    assert run.run.finished_at_ms is not None and "exit status 2" in run.run.reason
    assert await store(h).dispatch_candidates(await h.now_ms() + 10**9, 10) == []
    types = [t for _, t in events_of(h, run_id)]
    assert types.count("run.retry_scheduled") == max_attempts - 1
    assert types.count("run.finished") == 1 and types[-1] == "run.finished"


async def test_a_run_that_succeeds_on_retry_reports_the_last_attempt_and_no_failure(harness):
    """`runs` showing the first Attempt's failure (exit code, reason) for a Run that succeeded
    on its retry would send an operator after a problem that solved itself."""
    h = harness
    await publish(h, **retrying(2))
    run_id = await manual(h)
    result = await finish(h, await start(h, run_id), exited(1, await h.now_ms()))
    await h.elapse(result.next_attempt.at_ms - await h.now_ms())
    second = await start(h, run_id)
    await h.elapse(SECOND)
    assert (await finish(h, second, exited(0, await h.now_ms()))).run_state is RunState.SUCCEEDED
    run = (await detail(h, run_id)).run
    assert (run.state, run.attempts, run.exit_code, run.duration_ms, run.reason) == (
        RunState.SUCCEEDED, 2, 0, SECOND, None)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_lost_attempt_is_retried_only_for_an_idempotent_task(harness, idempotent):
    """A lost Attempt may have run to its end: retrying a non-idempotent job could do its work
    twice; not retrying an idempotent one gives up a job that could safely run again."""
    h = harness
    await publish(h, idempotent=idempotent, **retrying(3))
    run_id = await manual(h)
    attempt_id = await start(h, run_id)
    result = await store(h).record_finished(
        attempt_id, classify_outcome(None, None), await h.now_ms(), Actor.RECONCILER)
    run = await detail(h, run_id)
    if idempotent:
        assert result.run_state is RunState.RETRY_WAIT and len(run.attempts) == 2
    else:
        assert result.run_state is RunState.LOST and len(run.attempts) == 1
        assert "completion receipt" in run.run.reason
    assert run.attempts[0].state is AttemptState.LOST


async def test_a_cancelled_or_unstartable_attempt_is_never_retried(harness):
    """A retry after `runs cancel` would run the job the operator stopped; a retry of a missing
    program fails the same way again."""
    h = harness
    await publish(h, **retrying(3))
    cancelled, unstartable = await manual(h), await manual(h)
    attempt_id = await start(h, cancelled)
    await store(h).request_cancel(cancelled, CancelReason.OPERATOR, await h.now_ms())
    outcome = classify_outcome(Receipt(None, 15, await h.now_ms(), 0), CancelReason.OPERATOR)
    result = await finish(h, attempt_id, outcome)
    assert (result.run_state, result.next_attempt) == (RunState.CANCELLED, None)
    attempt_id = await dispatch(h, unstartable)
    result = await store(h).record_finished(
        attempt_id, AttemptOutcome(AttemptState.FAILED, reason="no such program: nope"),
        await h.now_ms(), Actor.DISPATCHER, started=False)
    assert (result.run_state, result.next_attempt) == (RunState.FAILED, None)
    for run_id in (cancelled, unstartable):
        assert len((await detail(h, run_id)).attempts) == 1


# ---- cancel and skip --------------------------------------------------------------------------

async def test_cancelling_a_queued_run_ends_it_and_a_running_one_only_requests_it(harness):
    """A queued Run must end at once (no process to stop, it must never start); a running one
    must keep its state until its process is gone, with the request durable so a restart still
    stops it, and the first reason kept."""
    h = harness
    await publish(h)
    queued, running = await manual(h), await manual(h)
    attempt_id = await start(h, running)
    now = await h.now_ms()
    assert await store(h).request_cancel(queued, CancelReason.OPERATOR, now) is RunState.CANCELLED
    assert not await store(h).begin_dispatch((await current(h, queued)).attempt_id, "/l", now, now)
    assert await store(h).request_cancel(running, CancelReason.TIMEOUT, now) is RunState.RUNNING
    assert await store(h).request_cancel(running, CancelReason.OPERATOR, now + 1) is RunState.RUNNING
    [active] = await store(h).active_attempts()
    assert (active.run_id, active.cancel_reason, active.cancel_requested_at_ms) == (
        running, CancelReason.TIMEOUT, now)
    outcome = classify_outcome(Receipt(None, 9, now + 2, 0), active.cancel_reason)
    assert (await finish(h, attempt_id, outcome)).run_state is RunState.TIMED_OUT
    assert await store(h).request_cancel(running, CancelReason.OPERATOR, now + 3) is RunState.TIMED_OUT
    assert await store(h).request_cancel(queued, CancelReason.OPERATOR, now + 3) is RunState.CANCELLED
    assert [t for _, t in events_of(h, running)].count("run.cancel_requested") == 1
    with pytest.raises(NotFound):
        await store(h).request_cancel("no-such-run", CancelReason.OPERATOR, now)


async def test_a_skipped_run_becomes_a_skip_record_with_its_reason_and_only_while_claimed(harness):
    """A skip that hit a started Attempt would end a Run whose process still runs; a skip
    without its reason leaves the operator guessing why the job did not run; a skip kept as a
    `cancelled` Run hides it from `skips` (which showed 0 while 97 Runs were skipped)."""
    h = harness
    await publish(h)
    skipped, started = await manual(h), await manual(h)
    attempt = await current(h, skipped)
    scheduled_for = (await detail(h, skipped)).run.scheduled_for_ms
    now = await h.now_ms()
    assert not await store(h).skip_run(started, attempt.attempt_id, "wrong run", now)
    assert await store(h).skip_run(skipped, attempt.attempt_id, "skipped: forbid", now)
    assert not await store(h).skip_run(skipped, attempt.attempt_id, "skipped: forbid", now)
    with pytest.raises(NotFound):
        await detail(h, skipped)
    (record,) = await store(h).recent_run_skips()
    assert (record.run_id, record.project_id, record.task_id, record.trigger_id, record.scheduled_for_ms,
            record.reason, record.recorded_at_ms) == (skipped, "p1", "t1", "", scheduled_for,
                                                      "skipped: forbid", now)
    assert [r.run_id for r in await store(h).list_runs(limit=10)] == [started]
    attempt_id = await dispatch(h, started)
    assert not await store(h).skip_run(started, attempt_id, "too late", now)
    assert await state_of(h, started) is RunState.DISPATCHING


# ---- manual Runs and retention -----------------------------------------------------------------

async def test_a_manual_key_admits_one_run_even_after_that_run_was_pruned(harness):
    """A retried `task run --idempotency-key K` (a script re-run after a timeout) must not run
    the job twice, also once the first Run's rows are gone."""
    h = harness
    await publish(h)
    first, created = await store(h).admit_manual_run("p1", "t1", "nightly-1", await h.now_ms())
    again = await store(h).admit_manual_run("p1", "t1", "nightly-1", await h.now_ms())
    assert created and again == (first, False)
    run = await detail(h, first)
    assert run.idempotency_key == "ql3:manual:v1:nightly-1" and run.run.trigger_id == ""
    assert h.count("runs") == 1
    attempt_id = await start(h, first)
    await finish(h, attempt_id, exited(0, await h.now_ms()))
    await store(h).mark_log_deleted(attempt_id, await h.now_ms())
    await h.elapse(SECOND)
    assert (await store(h).prune(await h.now_ms(), 10)).runs == 1
    with pytest.raises(NotFound):
        await detail(h, first)
    assert await store(h).admit_manual_run("p1", "t1", "nightly-1", await h.now_ms()) == (first, False)
    assert h.count("runs") == 0 and await store(h).dispatch_candidates(await h.now_ms(), 10) == []
    with pytest.raises(NotFound):
        await store(h).admit_manual_run("p1", "missing", "k2", await h.now_ms())
    with pytest.raises(NotFound):
        await store(h).admit_manual_run("nope", "t1", "k3", await h.now_ms())
    assert h.count("runs") == 0


async def test_one_manual_key_admitted_by_two_stores_at_once_is_one_run(harness):
    """Two `task run --idempotency-key K` at the same moment (a retried script, two operators)
    must admit one Run, not one each."""
    h = harness
    await publish(h)
    other = h.create_backend(CollectingSink(), providers())
    await other.open()
    async with closing(other):
        now = await h.now_ms()
        for number in range(5):
            key = f"together-{number}"
            results = await asyncio.gather(*(s.admit_manual_run("p1", "t1", key, now)
                                             for s in (store(h), other.execution())))
            assert sorted(created for _, created in results) == [False, True], results
            assert results[0][0] == results[1][0]
    assert h.count("runs") == 5


async def test_prune_deletes_bounded_batches_of_old_finished_runs_and_nothing_in_flight(harness):
    """An unbounded prune holds the write lock over a round; one that deleted a queued, running
    or recent Run, or a Run whose log is still on disk, loses work or leaks the file."""
    h = harness
    await publish(h)
    finished = []
    for _ in range(5):
        run_id = await manual(h)
        attempt_id = await start(h, run_id)
        await finish(h, attempt_id, exited(0, await h.now_ms()))
        finished.append((run_id, attempt_id))
    queued, running = await manual(h), await manual(h)
    await start(h, running)
    await h.elapse(10 * SECOND)
    recent = await manual(h)
    await store(h).request_cancel(recent, CancelReason.OPERATOR, await h.now_ms())
    cutoff = await h.now_ms() - SECOND
    assert (await store(h).prune(cutoff, 10)).runs == 0, "logs still on disk"
    logs = await store(h).finished_logs(cutoff, 100)
    assert sorted(logs) == sorted((a, f"/logs/{a}") for _, a in finished)
    assert await store(h).finished_logs(cutoff, 2) == logs[:2]
    for attempt_id, _ in logs:
        await store(h).mark_log_deleted(attempt_id, await h.now_ms())
    assert await store(h).finished_logs(cutoff, 100) == []
    assert (await detail(h, finished[0][0])).attempts[0].log_deleted
    events_before = h.count("events")
    reports = [await store(h).prune(cutoff, 2) for _ in range(4)]
    assert [r.runs for r in reports] == [2, 2, 1, 0]
    assert sum(r.attempts for r in reports) == 5
    assert sum(r.events for r in reports) == events_before - h.count("events") > 0
    left = {r.run_id for r in await store(h).list_runs(limit=100)}
    assert left == {queued, running, recent}


async def test_listings_show_state_attempts_exit_code_and_duration_newest_first(harness):
    """`qinglong runs` reads these fields; a wrong attempt count or the exit code of another
    Attempt misreports what ran."""
    h = harness
    await publish(h, **retrying(2))
    await publish(h, "t2")
    older = await manual(h)
    attempt_id = await start(h, older)
    await h.elapse(3 * SECOND)
    await finish(h, attempt_id, exited(4, await h.now_ms()))
    await h.elapse(SECOND)
    newer = await manual(h, "t2")
    runs = await store(h).list_runs()
    assert [r.run_id for r in runs] == [newer, older]
    older_view = runs[1]
    assert (older_view.state, older_view.attempts, older_view.exit_code, older_view.duration_ms) == (
        RunState.RETRY_WAIT, 2, 4, 3 * SECOND)
    assert (runs[0].state, runs[0].attempts, runs[0].exit_code) == (RunState.QUEUED, 1, None)
    assert [r.run_id for r in await store(h).list_runs(state=RunState.RETRY_WAIT)] == [older]
    assert [r.run_id for r in await store(h).list_runs(project_id="p1", task_id="t2")] == [newer]
    assert [r.run_id for r in await store(h).list_runs(limit=1)] == [newer]
    assert await store(h).list_runs(state=RunState.SUCCEEDED) == []
    with pytest.raises(UserError, match="unknown run state"):
        await store(h).list_runs(state="finished")


# ---- events and the state machine --------------------------------------------------------------

async def test_events_follow_each_step_with_consecutive_sequence_numbers(harness):
    """Events out of order or with gaps would make a Run's history unreadable (and a reader
    following by seq would miss or repeat one)."""
    h = harness
    await publish(h, **retrying(2))
    run_id = await manual(h)
    attempt_id = await start(h, run_id)
    result = await finish(h, attempt_id, exited(1, await h.now_ms()))
    await h.elapse(result.next_attempt.at_ms - await h.now_ms())
    second = await start(h, run_id)
    await store(h).request_cancel(run_id, CancelReason.OPERATOR, await h.now_ms())
    await finish(h, second, classify_outcome(Receipt(None, 15, await h.now_ms(), 0),
                                             CancelReason.OPERATOR))
    events = events_of(h, run_id)
    assert [seq for seq, _ in events] == list(range(1, len(events) + 1))
    assert [t for _, t in events] == [
        "run.created", "run.queued", "run.dispatching", "run.started", "run.retry_scheduled",
        "run.dispatching", "run.started", "run.cancel_requested", "run.finished"]


async def test_every_state_change_is_a_legal_transition_and_an_illegal_one_writes_nothing(harness):
    """A store that moved a Run along a path the state machine forbids could end it twice or
    report `succeeded` without proof; a refused step that wrote half of itself corrupts it."""
    h = harness
    await publish(h, idempotent=True, **retrying(3, exit_codes=[3], on_timeout=False))
    s = store(h)
    paths = [await manual(h) for _ in range(6)]
    seen: dict[str, list[RunState]] = {run_id: [RunState.QUEUED] for run_id in paths}

    async def act(call):
        """Run one store call, then note every Run's state (each call is one step)."""
        result = await call
        for run_id in paths:
            try:
                state = await state_of(h, run_id)
            except NotFound:  # a skipped Run leaves the Runs as a skip record, its end noted first
                continue
            if seen[run_id][-1] is not state:
                seen[run_id].append(state)
        return result

    async def begin(run_id: str) -> str:
        attempt = await current(h, run_id)
        now = await h.now_ms()
        assert await act(s.begin_dispatch(attempt.attempt_id, "/logs/x", now + SECOND, now))
        return attempt.attempt_id

    async def run(run_id: str, actor: Actor = Actor.DISPATCHER) -> str:
        attempt_id = await begin(run_id)
        assert await act(s.record_started(attempt_id, HANDLE, await h.now_ms(), actor))
        return attempt_id

    a, b, c, d, e, f = paths
    now = await h.now_ms()
    # a succeeds; b exits 3 (a retried code), then 4 (not retried) and fails
    await act(s.record_finished(await run(a), exited(0, now), now, Actor.COMPLETION))
    await act(s.record_finished(await run(b), exited(3, now), now, Actor.COMPLETION))
    await h.elapse(10 * SECOND)
    now = await h.now_ms()
    await act(s.record_finished(await run(b), exited(4, now), now, Actor.COMPLETION))
    # c is lost while dispatching (reconciler), retried as idempotent, cancelled while it waits
    await act(s.record_finished(await begin(c), classify_outcome(None, None), now, Actor.RECONCILER))
    await act(s.request_cancel(c, CancelReason.OPERATOR, now))
    # d is skipped; e times out; f is re-adopted by the reconciler, which records its success
    await act(s.skip_run(d, (await current(h, d)).attempt_id, "skipped", now))
    e_attempt = await run(e)
    await act(s.request_cancel(e, CancelReason.TIMEOUT, now))
    await act(s.record_finished(e_attempt, classify_outcome(Receipt(None, 9, now, 0),
                                                            CancelReason.TIMEOUT),
                                now, Actor.COMPLETION))
    f_attempt = await run(f, Actor.RECONCILER)
    # illegal: a dispatcher may not end an Attempt as lost, nor anyone a claimed one
    f_before = (await detail(h, f), events_of(h, f))
    with pytest.raises(IllegalTransition):
        await s.record_finished(f_attempt, classify_outcome(None, None), now, Actor.DISPATCHER)
    queued = await manual(h)
    q_before = (await detail(h, queued), events_of(h, queued))
    with pytest.raises(IllegalTransition):
        await s.record_finished((await current(h, queued)).attempt_id, exited(0, now), now,
                                Actor.COMPLETION)
    assert (await detail(h, f), events_of(h, f)) == f_before
    assert (await detail(h, queued), events_of(h, queued)) == q_before
    await act(s.record_finished(f_attempt, exited(0, now), now, Actor.RECONCILER))

    for run_id, states in seen.items():
        for before, after in zip(states, states[1:]):
            assert (before, after) in RUN_TRANSITIONS, (run_id, states)
    assert (await detail(h, a)).run.reason is None
    assert [seen[r][-1] for r in paths] == [RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED,
                                            RunState.QUEUED, RunState.TIMED_OUT, RunState.SUCCEEDED]
    assert [k.run_id for k in await s.recent_run_skips()] == [d]
    assert seen[b] == [RunState.QUEUED, RunState.DISPATCHING, RunState.RUNNING, RunState.RETRY_WAIT,
                       RunState.DISPATCHING, RunState.RUNNING, RunState.FAILED]
    assert len((await detail(h, b)).attempts) == 2


# ---- reading and cancelling Runs, wherever they are executed ------------------------------------
#
# The cluster executes no Run itself (its workers are remote): its Runs are read and cancelled
# through ``backend.run_control()`` (RunControl) instead of ``backend.execution()``. What the
# operator's commands read of a Run and what cancelling a queued one does are the same contract on
# both, so these tests run on every backend.

RUN_READING_BACKENDS = ["sqlite", "pg18", "pg15"]


@pytest.fixture(params=RUN_READING_BACKENDS)
def reading_harness(request, tmp_path):
    """A harness of each backend that records Runs (started and stopped by the test itself)."""
    from tests.conformance.harnesses import PostgresHarness, _db_counter
    from tests.support.pg import create_database, drop_database

    if request.param == "sqlite":
        yield SqliteHarness(tmp_path / "qinglong.db")
        return
    server, template = request.getfixturevalue("servers")(request.param)
    name = f"qlc_{os.getpid()}_{next(_db_counter)}"
    create_database(server, name, template=template)
    yield PostgresHarness(server, name)
    drop_database(server, name)


def runs_reader(h):
    """The backend's reader of Runs: its execution store, or its run control (cluster)."""
    execution = getattr(h.backend, "execution", None)
    return execution() if execution is not None else h.backend.run_control()


async def operator_cancel(h, run_id: str) -> RunState:
    """``runs cancel RUN`` on either side."""
    execution = getattr(h.backend, "execution", None)
    if execution is not None:
        return await execution().request_cancel(run_id, CancelReason.OPERATOR, await h.now_ms(),
                                                Actor.OPERATOR)
    return await h.backend.run_control().request_cancel(run_id, CancelReason.OPERATOR)


async def admitted_by_rounds(h, **t1_spec) -> None:
    """Queued Runs of two tasks admitted by real rounds (every backend admits scheduled Runs);
    ``t1_spec``: more of the first task's spec."""
    await h.publisher.create_project("p1")
    for task_id in ("t1", "t2"):
        await h.publisher.put_task("p1", task_id, {"command": ["true"], **(t1_spec if task_id == "t1" else {})})
        await h.publisher.put_trigger(TriggerDefinition("p1", f"tr-{task_id}", task_id, "cron",
                                                        {"expression": "* * * * * *"},
                                                        MisfirePolicy.FIRE_ONCE, 60_000))
    await h.run_round()  # initializes the cursors
    await h.elapse(3 * SECOND)
    report = await h.run_round()
    assert report.admitted >= 2, report


def _value(state):
    return getattr(state, "value", state)


async def test_run_listings_and_details_read_alike_where_runs_are_executed_and_where_workers_run_them(
        reading_harness):
    """`qinglong runs` and `runs show` read these on every profile; a cluster listing in another
    order, with another attempt count or missing a filter would misreport what is waiting."""
    h = reading_harness
    await h.start()
    try:
        await admitted_by_rounds(h)
        reader = runs_reader(h)
        runs = await reader.list_runs(limit=100)
        assert len(runs) == h.count("runs") >= 2
        keys = [(r.scheduled_for_ms, r.admitted_at_ms) for r in runs]
        assert keys == sorted(keys, reverse=True), "newest first"
        assert all((_value(r.state), r.attempts, r.exit_code, r.duration_ms, r.finished_at_ms)
                   == ("queued", 1, None, None, None) for r in runs)
        assert {r.task_id for r in runs} == {"t1", "t2"}
        assert [r.run_id for r in await reader.list_runs(state=RunState.QUEUED, limit=100)] == \
            [r.run_id for r in runs]
        assert await reader.list_runs(state=RunState.SUCCEEDED) == []
        of_t2 = await reader.list_runs(project_id="p1", task_id="t2", limit=100)
        assert of_t2 and [r.run_id for r in of_t2] == [r.run_id for r in runs if r.task_id == "t2"]
        assert [r.run_id for r in await reader.list_runs(limit=1)] == [runs[0].run_id]
        with pytest.raises(UserError, match="unknown run state"):
            await reader.list_runs(state="finished")

        detail = await reader.run_detail(runs[0].run_id)
        assert detail.run == runs[0]
        assert detail.task_revision == 1
        assert detail.idempotency_key.startswith(f"ql3:cron:v1:tr-{runs[0].task_id}:")
        (attempt,) = detail.attempts
        assert (attempt.attempt_no, _value(attempt.state), attempt.started_at_ms, attempt.exit_code) == (
            1, "claimed", None, None)
        for unknown in ("no-such-run", str(uuid.uuid4())):
            with pytest.raises(NotFound):
                await reader.run_detail(unknown)
    finally:
        await h.stop()


async def test_cancelling_a_queued_run_ends_it_and_its_attempt_at_once_wherever_runs_are_executed(
        reading_harness):
    """A queued Run left queued by `runs cancel` would still be started (by the local dispatcher
    or a worker); a second cancel that changed an ended Run would rewrite history."""
    h = reading_harness
    await h.start()
    try:
        await admitted_by_rounds(h)
        reader = runs_reader(h)
        victim, *others = await reader.list_runs(limit=100)
        assert await operator_cancel(h, victim.run_id) is RunState.CANCELLED
        detail = await reader.run_detail(victim.run_id)
        assert _value(detail.run.state) == "cancelled" and detail.run.finished_at_ms is not None
        assert "operator" in detail.run.reason
        (attempt,) = detail.attempts
        assert (_value(attempt.state), _value(attempt.cancel_reason)) == ("cancelled", "operator")
        assert attempt.started_at_ms is None
        assert await operator_cancel(h, victim.run_id) is RunState.CANCELLED
        assert (await reader.run_detail(victim.run_id)).run == detail.run
        assert [r.run_id for r in await reader.list_runs(state=RunState.CANCELLED)] == [victim.run_id]
        assert {r.run_id for r in await reader.list_runs(state=RunState.QUEUED, limit=100)} == \
            {r.run_id for r in others}
        with pytest.raises(NotFound):
            await operator_cancel(h, str(uuid.uuid4()))
    finally:
        await h.stop()


async def skip_by_forbid(h, first, later) -> str:
    """Start ``first`` and have the store's own start path skip the ``later`` Runs of its
    'forbid' task: the local dispatcher's store calls on SQLite, a worker's claim on PostgreSQL.
    The reason."""
    reason = overlap_decision(ConcurrencyPolicy(ConcurrencyMode.FORBID), [ActiveRun(first.run_id, 0)]).reason
    if h.name == "sqlite":
        await start(h, first.run_id)
        for run in later:
            attempt = await current(h, run.run_id)
            assert await store(h).skip_run(run.run_id, attempt.attempt_id, reason, await h.now_ms())
        return reason
    import psycopg

    def claim() -> list:
        with psycopg.connect(h.dsn("qinglong_gateway"), autocommit=True) as conn:
            session, generation, _, _ = conn.execute(
                "SELECT * FROM qinglong.worker_open_session('w1', '{}'::text[], 64, 30000)").fetchone()
            return [r for (r,) in conn.execute(
                "SELECT run_id::text FROM qinglong.worker_claim('w1', %s, %s, %s::bytea[])",
                (session, generation, [os.urandom(32)] * 64)).fetchall()]

    claimed = await asyncio.to_thread(claim)  # (t2's Runs start too: 'allow')
    assert first.run_id in claimed and not {r.run_id for r in later} & set(claimed)
    return reason


async def test_a_run_skipped_before_it_started_is_a_skip_record_alike_wherever_runs_are_executed(
        reading_harness):
    """A 'forbid' skip kept as a cancelled Run hid it from `skips` (0 shown while 97 Runs were
    skipped) on the cluster as on edge: on every store the skipped Run leaves the Runs and
    becomes a skip record with its reason, which `skips` and the status figures read."""
    h = reading_harness
    await h.start()
    try:
        await admitted_by_rounds(h, concurrency="forbid")
        reader = runs_reader(h)
        first, *later = sorted((r for r in await reader.list_runs(task_id="t1", limit=100)),
                               key=lambda r: (r.scheduled_for_ms, r.admitted_at_ms))
        assert later
        before = await h.now_ms()
        reason = await skip_by_forbid(h, first, later)
        after = await h.now_ms()
        assert not {r.run_id for r in later} & {r.run_id for r in await reader.list_runs(limit=100)}
        with pytest.raises(NotFound):
            await reader.run_detail(later[0].run_id)
        records = await reader.recent_run_skips()
        assert [(k.run_id, k.project_id, k.task_id, k.trigger_id, k.scheduled_for_ms, k.reason) for k in records] \
            == [(r.run_id, "p1", "t1", "tr-t1", r.scheduled_for_ms, reason) for r in reversed(later)], "newest first"
        assert all(before <= k.recorded_at_ms <= after for k in records)
        assert (await h.reader.store_stats()).skipped_recent == len(later)
    finally:
        await h.stop()


async def test_skip_records_of_both_kinds_age_out_in_bounded_batches_and_the_last_hour_stays(
        reading_harness):
    """Skip records grew without bound (~86,000 a day for a per-second 'forbid' task that runs
    long); deleting the last hour's would empty the recent-skips figures, and an unbounded delete
    would hold the store's write lock over a round."""
    h = reading_harness
    await h.start()
    try:
        await admitted_by_rounds(h, concurrency="forbid")
        reader = runs_reader(h)
        assert isinstance(reader, PrunesSkips)
        first, *later = sorted((r for r in await reader.list_runs(task_id="t1", limit=100)),
                               key=lambda r: (r.scheduled_for_ms, r.admitted_at_ms))
        await skip_by_forbid(h, first, later)
        await h.elapse(2 * 60 * SECOND)  # past the triggers' grace: a fire_once misfire each
        report = await h.run_round()
        assert report.skipped == 2, (report, [e.message for e in h.sink.events])
        old_runs, old_occurrences = len(later), h.count("skips")
        assert old_runs >= 2 and old_occurrences == 2

        async def records() -> tuple[int, int]:
            return h.count("skips"), len(await reader.recent_run_skips(100))

        # the shortest retention keeps the last hour
        cut = skip_cutoff_ms(await h.now_ms(), 1)
        assert await reader.prune_skips(cut, MAX_SKIP_PRUNE_BATCH) == NOTHING
        assert await records() == (old_occurrences, old_runs)
        for limit in (0, MAX_SKIP_PRUNE_BATCH + 1):
            with pytest.raises(UserError):
                await reader.prune_skips(cut, limit)

        await h.elapse(MIN_SKIP_RETENTION_MS + 60 * SECOND)
        assert (await h.run_round()).skipped == 2  # recent ones, which stay
        recent = (await h.reader.store_stats()).skipped_recent
        assert recent > 0
        now = await h.now_ms()
        assert await reader.prune_skips(skip_cutoff_ms(now, 2 * MIN_SKIP_RETENTION_MS), 100) == NOTHING
        reports = [await reader.prune_skips(skip_cutoff_ms(now, 1), 1) for _ in range(old_runs + 1)]
        assert all(r.occurrences <= 1 and r.runs <= 1 for r in reports), reports
        assert sum(r.occurrences for r in reports) == old_occurrences
        assert sum(r.runs for r in reports) == old_runs
        assert reports[-1] == NOTHING
        assert await records() == (2, 0)
        assert (await h.reader.store_stats()).skipped_recent == recent
    finally:
        await h.stop()


async def test_logs_for_space_leave_out_the_newest_of_each_task_and_other_directories(harness):
    """A free-space floor that could pick a task's newest logs, or a log outside the directory it
    guards, would erase the only evidence of what a task did (and free nothing there)."""
    h = harness
    await publish(h, "t1")
    await publish(h, "t2")
    ended = {"t1": [], "t2": []}
    for task_id, count in (("t1", 4), ("t2", 2)):
        for _ in range(count):
            run_id = await manual(h, task_id)
            attempt_id = await start(h, run_id)
            await h.elapse(SECOND)
            await finish(h, attempt_id, exited(0, await h.now_ms()))
            ended[task_id].append(attempt_id)
    logs = await store(h).logs_for_space(2, "/logs", 100)
    assert logs == [(a, f"/logs/{a}") for a in ended["t1"][:2]]
    assert await store(h).logs_for_space(2, "/logs/", 1) == logs[:1]
    assert await store(h).logs_for_space(0, "/logs", 100) != []
    assert await store(h).logs_for_space(0, "/elsewhere", 100) == []
    assert await store(h).logs_for_space(0, "/log", 100) == [], "a sibling named by a prefix"
    await store(h).mark_log_deleted(ended["t1"][0], await h.now_ms())
    assert await store(h).logs_for_space(2, "/logs", 100) == logs[1:]


async def test_a_note_on_a_running_attempt_is_shown_until_its_end_replaces_it(harness):
    """A Run that cannot be stopped must say so in its record while it runs; a note that
    outlived the end (or landed on an ended Attempt) would misreport how it ended."""
    h = harness
    await publish(h)
    run_id = await manual(h)
    attempt_id = await start(h, run_id)
    assert await store(h).note_attempt(attempt_id, "cannot be stopped: ...")
    assert (await current(h, run_id)).reason == "cannot be stopped: ..."
    await finish(h, attempt_id, exited(0, await h.now_ms()))
    assert (await current(h, run_id)).reason is None
    assert not await store(h).note_attempt(attempt_id, "too late")


# ---- ending Runs, wherever they are executed -----------------------------------------------------
#
# The local dispatcher ends an Attempt through ``ExecutionStore`` (begin_dispatch, record_started,
# record_finished); a worker through its protocol (claim, started, complete). The Run an outcome
# leaves behind is the same contract on both, read back through each backend's reader of Runs.


class LocalDispatcher:
    """Takes, starts and ends Attempts the way ``qinglong run`` does (the edge store)."""

    def __init__(self, h) -> None:
        self.h = h

    async def take_and_start(self) -> tuple[str, str]:
        """Start the oldest queued Run's Attempt: ``(run_id, attempt_id)``."""
        oldest = (await store(self.h).list_runs(state=RunState.QUEUED, limit=100))[-1]
        return oldest.run_id, await start(self.h, oldest.run_id)

    async def finish(self, attempt_id: str, outcome: AttemptOutcome) -> str:
        done = await finish(self.h, attempt_id, outcome)
        return "accepted" if done.recorded else "unchanged"

    async def close(self) -> None:
        pass


class Worker:
    """Takes, starts and ends Attempts the way ``qinglong worker`` does (the cluster's protocol)."""

    def __init__(self, h) -> None:
        self.h = h
        self.protocol = None
        self.fence = None
        self.leases: dict[str, object] = {}

    async def _session(self):
        if self.protocol is None:
            from qinglong.plugins.cluster_postgres import qinglong_worker_protocols

            (spec,) = qinglong_worker_protocols()
            self.protocol = await spec.create_gateway(self.h.dsn("qinglong_gateway"), "conformance", 1)
            self.fence = (await self.protocol.open_session("conformance", [], 4, 30_000)).fence
        return self.protocol

    async def take_and_start(self) -> tuple[str, str]:
        from qinglong.contracts.worker import new_lease_token

        protocol = await self._session()
        (claimed,) = await protocol.claim(self.fence, [new_lease_token()])
        await protocol.started(self.fence, claimed.lease)
        self.leases[claimed.attempt_id] = claimed.lease
        return claimed.run_id, claimed.attempt_id

    async def finish(self, attempt_id: str, outcome: AttemptOutcome) -> str:
        from qinglong.contracts.worker import FenceRefused

        try:
            reply = await self.protocol.complete(self.fence, self.leases[attempt_id], outcome)
        except FenceRefused:
            return "unchanged"
        return "accepted" if reply.result.value == "accepted" else "unchanged"

    async def close(self) -> None:
        if self.protocol is not None:
            await self.protocol.close()


def executor_of(h):
    return LocalDispatcher(h) if getattr(h.backend, "execution", None) is not None else Worker(h)


def ended(code: int) -> AttemptOutcome:
    """An exit with ``code``; no log bytes (a worker ships none here)."""
    return classify_outcome(Receipt(code, None, None, 0), None)


async def test_an_outcome_ends_the_run_once_and_a_repeat_changes_nothing_wherever_runs_are_executed(
        reading_harness):
    """The dispatcher's waiter and its reconciler, or a worker repeating a completion whose reply
    was lost, both report one end: a second report that rewrote the exit code, added an Attempt
    or ended the Run again would make `runs` show what did not happen."""
    h = reading_harness
    await h.start()
    executor = executor_of(h)
    try:
        await admitted_by_rounds(h)
        reader = runs_reader(h)
        run_id, attempt_id = await executor.take_and_start()
        assert _value((await reader.run_detail(run_id)).run.state) == "running"
        assert await executor.finish(attempt_id, ended(0)) == "accepted"
        detail = await reader.run_detail(run_id)
        assert (_value(detail.run.state), detail.run.exit_code, detail.run.attempts) == ("succeeded", 0, 1)
        assert detail.run.finished_at_ms is not None
        (attempt,) = detail.attempts
        assert (_value(attempt.state), attempt.exit_code) == ("succeeded", 0)
        assert await executor.finish(attempt_id, ended(0)) == "unchanged"
        assert await executor.finish(attempt_id, ended(3)) == "unchanged"
        assert await reader.run_detail(run_id) == detail
        assert [r.run_id for r in await reader.list_runs(state=RunState.SUCCEEDED)] == [run_id]
    finally:
        await executor.close()
        await h.stop()


async def test_a_failed_attempt_ends_the_run_failed_with_its_exit_code_wherever_runs_are_executed(
        reading_harness):
    """Without a retry policy a failed Attempt is the Run's end: a Run left running or queued
    would be run again, and a listing without the exit code hides why it failed."""
    h = reading_harness
    await h.start()
    executor = executor_of(h)
    try:
        await admitted_by_rounds(h)
        reader = runs_reader(h)
        run_id, attempt_id = await executor.take_and_start()
        assert await executor.finish(attempt_id, ended(7)) == "accepted"
        detail = await reader.run_detail(run_id)
        assert (_value(detail.run.state), detail.run.exit_code, detail.run.attempts) == ("failed", 7, 1)
        (attempt,) = detail.attempts
        assert (_value(attempt.state), attempt.exit_code) == ("failed", 7)
        assert [r.run_id for r in await reader.list_runs(state=RunState.FAILED)] == [run_id]
        assert run_id not in {r.run_id for r in await reader.list_runs(state=RunState.QUEUED, limit=100)}
    finally:
        await executor.close()
        await h.stop()
