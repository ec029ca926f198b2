"""The store suite: every store behaviour of the contracts, for any scheduler backend.

Qinglong runs it on SQLite, PostgreSQL 18 and PostgreSQL 15 (``tests/conformance``); a third
party's backend runs the same tests by importing them into one of its test modules, beside a
``harness`` fixture returning its :class:`~qinglong.testing.conformance.harness.Harness` (see
:mod:`qinglong.testing.conformance`). Each test drives the backend only through
``SchedulerBackend``, ``Publisher`` and ``Reader``, plus the harness's clock and row counts. A
behaviour that only one backend has belongs beside its plugin, not here.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from qinglong.contracts import errors
from qinglong.contracts.diagnostics import RoundEvent
from qinglong.contracts.errors import (
    AlreadyExists,
    NotFound,
    SchemaNotReady,
    StoreMissing,
    TriggerSpecError,
    UnknownTriggerKind,
    UserError,
)
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.jitter import MAX_JITTER_MS, JitteredSchedule
from qinglong.contracts.records import MisfirePolicy, RoundReport, TriggerDefinition
from qinglong.contracts.store import MAX_PAYLOAD_BYTES, check_misfire_grace, skip_grace_floor_ms

from .harness import LIMITS, providers

SECOND = 1000


def every_second(trigger_id: str, *, policy: str = "fire_once", grace_ms: int = 60_000,
                 task: str = "t1", project: str = "p1", kind: str = "cron",
                 expression: str = "* * * * * *") -> TriggerDefinition:
    return TriggerDefinition(project, trigger_id, task, kind, {"expression": expression},
                             MisfirePolicy(policy), grace_ms)


async def seed(h, project: str = "p1", task: str = "t1") -> None:
    await h.publisher.create_project(project)
    await h.publisher.put_task(project, task, {"command": ["echo", "hello"]})


async def schedule(h, trigger_id: str):
    [view] = [s for s in await h.reader.list_schedules() if s.trigger_id == trigger_id]
    return view


async def initialized(h, trigger_id: str, definition: TriggerDefinition | None = None):
    """Publish (unless published) and run the round that initializes the cursor; returns the
    schedule after it."""
    if definition is not None:
        await h.publisher.put_trigger(definition)
    report = await h.run_round()
    assert report.initialized >= 1, report
    return await schedule(h, trigger_id)


async def counted_from_publish(h, trigger_id: str):
    """Assert that the schedule of ``trigger_id`` counts from its revision's publish time, and
    return it. The first occurrence after the publish is the cursor, or, when the initializing
    round only ran after it (a loaded machine), that round admitted it and every later one up to
    the cursor: each exactly once, none before the publish."""
    view = await schedule(h, trigger_id)
    first = (view.published_at_ms // SECOND + 1) * SECOND
    admitted = sorted(r.scheduled_for_ms
                      for r in await h.reader.recent_runs(limit=1000, trigger_id=trigger_id)
                      if r.trigger_revision == view.trigger_revision)
    assert admitted + [view.next_fire_at_ms] == list(range(first, view.next_fire_at_ms + 1, SECOND)), (
        view, admitted)
    return view


async def runs_since(h, trigger_id: str, start_ms: int) -> list[int]:
    """The occurrences admitted for ``trigger_id`` at or after ``start_ms``, oldest first (an
    initializing round may already have admitted an owed occurrence before it)."""
    return sorted(r.scheduled_for_ms for r in await h.reader.recent_runs(limit=1000, trigger_id=trigger_id)
                  if r.scheduled_for_ms >= start_ms)


def refusal(exc_info) -> tuple[type, str]:
    return type(exc_info.value), str(exc_info.value)


# ---- publishing and its refusals ------------------------------------------------------------

async def test_a_project_created_twice_is_refused_with_the_contract_wording(harness):
    """Two wordings of one refusal make scripts and operators match on a backend, not the rule."""
    await harness.publisher.create_project("p1")
    with pytest.raises(AlreadyExists) as raised:
        await harness.publisher.create_project("p1")
    assert str(raised.value) == str(errors.project_exists("p1"))
    assert [p.project_id for p in await harness.reader.list_projects()] == ["p1"]


async def test_unknown_project_task_and_trigger_are_refused_alike_and_write_nothing(harness):
    """A refusal worded or typed differently per backend breaks the CLI's exit codes; a refusal
    that wrote something would leave half a publish behind."""
    pub = harness.publisher
    with pytest.raises(NotFound) as raised:
        await pub.put_task("nope", "t1", {"command": ["true"]})
    assert refusal(raised) == (NotFound, str(errors.project_not_found("nope")))
    with pytest.raises(NotFound) as raised:
        await pub.put_trigger(every_second("a", project="nope"))
    assert refusal(raised) == (NotFound, str(errors.project_not_found("nope")))
    await seed(harness)
    with pytest.raises(NotFound) as raised:
        await pub.put_trigger(every_second("a", task="missing"))
    assert refusal(raised) == (NotFound, str(errors.task_not_found("p1", "missing")))
    with pytest.raises(NotFound) as raised:
        await pub.set_trigger_enabled("p1", "ghost", False)
    assert refusal(raised) == (NotFound, str(errors.trigger_not_found("p1", "ghost")))
    with pytest.raises(NotFound) as raised:
        await pub.delete_trigger("p1", "ghost")
    assert refusal(raised) == (NotFound, str(errors.trigger_not_found("p1", "ghost")))
    assert await harness.reader.list_triggers() == []
    assert await harness.reader.list_schedules() == []


async def test_a_trigger_id_of_another_project_is_refused_alike(harness):
    """Trigger ids are unique across projects on every backend, with one refusal."""
    await seed(harness)
    await seed(harness, project="p2")
    await harness.publisher.put_trigger(every_second("a"))
    with pytest.raises(AlreadyExists) as raised:
        await harness.publisher.put_trigger(every_second("a", project="p2"))
    assert refusal(raised) == (AlreadyExists, str(errors.trigger_id_taken("a", "p1")))
    with pytest.raises(NotFound) as raised:
        await harness.publisher.delete_trigger("p2", "a")
    assert refusal(raised) == (NotFound, str(errors.trigger_not_found("p2", "a")))


async def test_a_bad_misfire_policy_or_enabled_flag_is_refused_alike(harness):
    """Bad input must be named the same way whichever store the profile uses."""
    await seed(harness)
    bad_policy = TriggerDefinition("p1", "a", "t1", "cron", {"expression": "* * * * * *"}, "later")
    with pytest.raises(UserError) as raised:
        await harness.publisher.put_trigger(bad_policy)
    assert str(raised.value) == str(errors.bad_misfire_policy("later"))
    bad_enabled = TriggerDefinition("p1", "a", "t1", "cron", {"expression": "* * * * * *"},
                                    enabled="yes")
    with pytest.raises(UserError) as raised:
        await harness.publisher.put_trigger(bad_enabled)
    assert str(raised.value) == str(errors.bad_enabled_flag("yes"))
    await harness.publisher.put_trigger(every_second("a"))
    with pytest.raises(UserError) as raised:
        await harness.publisher.set_trigger_enabled("p1", "a", "no")
    assert str(raised.value) == str(errors.bad_enabled_flag("no"))
    assert [t.trigger_revision for t in await harness.reader.list_triggers()] == [1]


async def test_a_skip_grace_at_the_floor_is_refused_and_one_above_is_accepted(harness):
    """A 'skip' grace the scheduler cannot meet would skip on-time occurrences (lost Runs); the
    floor is the cadence on edge and cadence plus lease on the cluster, refused in one wording."""
    await seed(harness)
    floor = skip_grace_floor_ms(LIMITS, leased=harness.leased)
    at_floor = every_second("a", policy="skip", grace_ms=floor)
    with pytest.raises(TriggerSpecError) as raised:
        await harness.publisher.put_trigger(at_floor)
    with pytest.raises(TriggerSpecError) as expected:
        check_misfire_grace(at_floor, LIMITS, leased=harness.leased)
    assert str(raised.value) == str(expected.value)
    assert await harness.reader.list_triggers() == []
    head = await harness.publisher.put_trigger(every_second("a", policy="skip", grace_ms=floor + 1))
    assert head.trigger_revision == 1


async def test_an_unknown_trigger_kind_is_refused_at_publish(harness):
    """A trigger no loaded plugin can decide must not be stored (it would never fire)."""
    await seed(harness)
    with pytest.raises(UnknownTriggerKind) as raised:
        await harness.publisher.put_trigger(every_second("a", kind="nosuchkind"))
    assert str(raised.value) == str(UnknownTriggerKind("nosuchkind", ["cron"]))
    assert await harness.reader.list_triggers() == []


async def test_a_payload_over_the_limit_is_refused_and_writes_nothing(harness):
    """An unbounded payload written through the publisher API (not the CLI) would fill the store
    and every Run pinning it; both publishers refuse it with the same words."""
    await harness.publisher.create_project("p1")
    big = {"blob": "x" * MAX_PAYLOAD_BYTES}
    with pytest.raises(UserError) as raised:
        await harness.publisher.put_task("p1", "t1", big)
    assert "over the limit of" in str(raised.value) and "x" * 20 not in str(raised.value)
    with pytest.raises(UserError) as nan:
        await harness.publisher.put_task("p1", "t1", {"value": float("nan")})
    assert "NaN" in str(nan.value)
    with pytest.raises(UserError) as not_a_table:
        await harness.publisher.put_task("p1", "t1", ["echo"])
    assert str(not_a_table.value) == str(errors.payload_not_a_table("t1", ["echo"]))
    with pytest.raises(NotFound):
        await harness.publisher.put_trigger(every_second("a"))  # the task was never written


async def test_an_unchanged_publish_is_not_a_new_revision(harness):
    """A republish of the same content must not reset the cursor (that would re-initialize it
    and could drop an owed occurrence)."""
    await seed(harness)
    first = await harness.publisher.put_trigger(every_second("a"))
    again = await harness.publisher.put_trigger(every_second("a"))
    assert again == first
    task = await harness.publisher.put_task("p1", "t1", {"command": ["echo", "hello"]})
    assert task.task_revision == 1



async def test_a_trigger_jitter_is_stored_and_a_new_one_is_a_new_revision(harness):
    """A jitter dropped on the way into the store would start every occurrence at once; a changed
    jitter that is no new revision would keep the old delays; a bad one must write nothing."""
    await seed(harness)
    plain = await harness.publisher.put_trigger(every_second("a"))
    assert plain.jitter_ms == 0
    jittered = await harness.publisher.put_trigger(replace(every_second("a"), jitter_ms=5_000))
    assert (jittered.trigger_revision, jittered.jitter_ms) == (plain.trigger_revision + 1, 5_000)
    assert await harness.publisher.put_trigger(replace(every_second("a"), jitter_ms=5_000)) == jittered
    [head] = await harness.reader.list_triggers()
    assert head == jittered
    assert (await schedule(harness, "a")).jitter_ms == 5_000
    for bad in (-1, MAX_JITTER_MS + 1, True):
        with pytest.raises(TriggerSpecError) as raised:
            await harness.publisher.put_trigger(replace(every_second("a"), jitter_ms=bad))
        assert raised.value.field == "jitter_ms"
    assert await harness.reader.list_triggers() == [jittered]


async def test_a_jittered_trigger_starts_each_occurrence_at_its_delay_once(harness):
    """Every occurrence is admitted once, at its jittered time (the contract's, the same on
    every backend), with the delay it drew recorded on its Run: a backend that admitted the
    nominal time, or drew its own delay, would start the jobs together or twice."""
    await seed(harness)
    definition = replace(every_second("j", expression="*/2 * * * * *"), jitter_ms=1_500)
    await harness.publisher.put_trigger(definition)
    # time passes before the first round: a store's clock moved after a jittered cursor was
    # written would move that cursor off its delay (no real clock does)
    await harness.elapse(12 * SECOND)
    await harness.run_round()
    await harness.run_round()
    jitter = JitteredSchedule(providers()["cron"], "p1", "j", 1_500)
    spec = {"expression": "*/2 * * * * *", "timezone": "UTC"}
    view = await schedule(harness, "j")
    runs = sorted(await harness.reader.recent_runs(limit=1000, trigger_id="j"),
                  key=lambda r: r.scheduled_for_ms)
    assert view.jitter_ms == 1_500
    expected = [jitter.first_after_nominal(spec, view.published_at_ms)]
    while expected[-1] < view.next_fire_at_ms:
        expected.append(jitter.next_after(spec, expected[-1]))
    assert [r.scheduled_for_ms for r in runs] + [view.next_fire_at_ms] == expected
    assert len(runs) >= 5
    for run in runs:
        nominal = jitter.nominal_of(spec, run.scheduled_for_ms)
        assert run.jitter_ms == run.scheduled_for_ms - nominal and 0 <= run.jitter_ms < 1_500
        assert nominal % (2 * SECOND) == 0
    assert len({r.jitter_ms for r in runs}) > 1  # drawn per occurrence, not once per trigger


# ---- initialize, fire, misfire ----------------------------------------------------------------

async def test_initialize_takes_the_first_occurrence_after_the_publish_time(harness):
    """Counting from a later observation would silently drop the occurrences between publish and
    the first round."""
    await seed(harness)
    await harness.publisher.put_trigger(every_second("a", expression="0 0 1 1 *"))
    before = await schedule(harness, "a")
    assert before.next_fire_at_ms is None and before.published_at_ms is not None
    report = await harness.run_round()
    assert (report.initialized, report.admitted, report.skipped) == (1, 0, 0)
    view = await schedule(harness, "a")
    assert view.next_fire_at_ms > view.published_at_ms
    # per-second: the first occurrence is the next whole second after the publish
    await harness.publisher.put_trigger(every_second("b"))
    await initialized(harness, "b")
    await counted_from_publish(harness, "b")


async def test_an_occurrence_between_publish_and_the_first_round_is_fired_in_that_round(harness):
    """An occurrence after the publish but before the scheduler's first look is owed: it must be
    admitted by the initializing round, not a round later, and not lost."""
    await seed(harness)
    await harness.publisher.put_trigger(every_second("a"))
    await harness.elapse(2 * SECOND)
    report = await harness.run_round()
    assert report.initialized == 1 and report.admitted >= 2, report
    runs = sorted(r.scheduled_for_ms for r in await harness.reader.recent_runs(trigger_id="a"))
    view = await schedule(harness, "a")
    assert runs[0] == (view.published_at_ms // SECOND + 1) * SECOND
    assert runs == list(range(runs[0], view.next_fire_at_ms, SECOND))


async def test_an_on_time_occurrence_is_admitted_exactly_once(harness):
    """One occurrence must be one Run with one Attempt and its two events, never two Runs."""
    await seed(harness)
    view = await initialized(harness, "a", every_second("a", expression="0 0 1 1 *"))
    await harness.elapse(view.next_fire_at_ms - await harness.now_ms())
    due = (await schedule(harness, "a")).next_fire_at_ms
    report = await harness.run_round()
    assert (report.admitted, report.skipped, report.errors) == (1, 0, 0), report
    [run] = await harness.reader.recent_runs(trigger_id="a")
    assert run.scheduled_for_ms == due
    assert run.idempotency_key == idempotency_key("a", 1, due, "cron")
    assert (harness.count("runs", "a"), harness.count("attempts", "a"),
            harness.count("events", "a")) == (1, 1, 2)
    again = await harness.run_round()
    assert again.admitted == 0 and harness.count("runs", "a") == 1


async def test_a_backlog_inside_the_grace_drains_in_one_round(harness):
    """On-time occurrences inside the grace are owed one by one; a backlog left for later rounds
    is delayed by a cadence per occurrence (and on a busy cluster never catches up)."""
    await seed(harness)
    await initialized(harness, "a", every_second("a"))
    await harness.elapse(6 * SECOND)
    start = (await schedule(harness, "a")).next_fire_at_ms  # read after time passed
    report = await harness.run_round()
    view = await schedule(harness, "a")
    now = await harness.now_ms()
    assert view.next_fire_at_ms > now - SECOND  # nothing due is left behind
    runs = await runs_since(harness, "a", start)
    # every occurrence from the old cursor to the new one, once each: nothing skipped
    assert runs == list(range(start, view.next_fire_at_ms, SECOND))
    assert report.admitted == len(runs) >= 6 and report.skipped == 0, report
    assert await harness.reader.recent_skips() == []


async def test_a_fire_once_misfire_admits_the_latest_and_records_the_rest(harness):
    """fire_once must never replay a backlog (a flood of Runs after an outage) and must record
    what it passed over; the round counts that skip record in ``skipped``."""
    await seed(harness)
    await initialized(harness, "a", every_second("a", grace_ms=1500))
    await harness.elapse(10 * SECOND)
    start = (await schedule(harness, "a")).next_fire_at_ms
    report = await harness.run_round()
    assert (report.admitted, report.skipped) == (1, 1), report
    [run] = [r for r in await harness.reader.recent_runs(trigger_id="a") if r.scheduled_for_ms >= start]
    [skip] = await harness.reader.recent_skips()
    assert skip.policy is MisfirePolicy.FIRE_ONCE and skip.trigger_id == "a"
    assert skip.first_skipped_ms == start
    assert skip.last_skipped_ms == run.scheduled_for_ms - SECOND
    assert skip.count == (skip.last_skipped_ms - start) // SECOND + 1 and skip.count_exact
    assert (await schedule(harness, "a")).next_fire_at_ms > run.scheduled_for_ms
    assert harness.count("skips", "a") == 1


async def test_a_skip_misfire_admits_nothing_and_records_the_range(harness):
    """skip must admit nothing for a stale backlog and record it, counted once in ``skipped``."""
    await seed(harness)
    grace = skip_grace_floor_ms(LIMITS, leased=harness.leased) + 1
    await initialized(harness, "a", every_second("a", policy="skip", grace_ms=grace))
    await harness.elapse((grace // SECOND + 5) * SECOND)
    start = (await schedule(harness, "a")).next_fire_at_ms
    report = await harness.run_round()
    assert (report.admitted, report.skipped) == (0, 1), report
    assert await runs_since(harness, "a", start) == []
    [skip] = await harness.reader.recent_skips()
    assert skip.policy is MisfirePolicy.SKIP and skip.first_skipped_ms == start
    assert skip.count == (skip.last_skipped_ms - start) // SECOND + 1
    assert (await schedule(harness, "a")).next_fire_at_ms > skip.last_skipped_ms


async def test_a_fire_once_misfire_with_nothing_older_records_no_skip(harness):
    """A single late occurrence beyond the grace is admitted; nothing was passed over, so no skip
    record and ``skipped`` stays 0 (a skip record naming no occurrence would mislead)."""
    await seed(harness)
    view = await initialized(harness, "a", every_second("a", expression="0 0 1 1 *", grace_ms=0))
    await harness.elapse(view.next_fire_at_ms - await harness.now_ms() + 3 * SECOND)
    report = await harness.run_round()
    assert (report.admitted, report.skipped) == (1, 0), report
    assert await harness.reader.recent_skips() == []


# ---- republish, races, delete -----------------------------------------------------------------

async def test_a_republish_resets_the_cursor_and_counts_from_its_own_publish(harness):
    """A new revision running on the old revision's cursor would fire the old schedule."""
    await seed(harness)
    await initialized(harness, "a", every_second("a", expression="0 0 1 1 *"))
    head = await harness.publisher.put_trigger(every_second("a"))
    assert head.trigger_revision == 2
    view = await schedule(harness, "a")
    assert (view.trigger_revision, view.next_fire_at_ms) == (2, None)
    await initialized(harness, "a")
    await counted_from_publish(harness, "a")
    disabled = await harness.publisher.set_trigger_enabled("p1", "a", False)
    assert disabled.trigger_revision == 3 and not disabled.enabled
    before = harness.count("runs", "a")
    await harness.elapse(3 * SECOND)
    report = await harness.run_round()
    assert report.admitted == 0 and harness.count("runs", "a") == before


async def test_a_republish_between_decision_and_commit_admits_nothing_stale(harness):
    """A decision made from revision 1 committed after revision 2 was published would admit a
    Run of a schedule that no longer exists."""
    await seed(harness)
    view = await initialized(harness, "a", every_second("a", expression="0 0 1 1 *"))
    await harness.elapse(view.next_fire_at_ms - await harness.now_ms())

    def republish():
        async def body(other):
            await other.publisher().put_trigger(every_second("a", expression="*/2 * * * * *"))
        harness.elsewhere(body)

    report = await harness.run_round(between=republish)
    assert (report.admitted, report.cas_misses, report.fence_lost) == (0, 1, 0), report
    assert harness.count("runs", "a") == 0
    view = await schedule(harness, "a")
    assert (view.trigger_revision, view.next_fire_at_ms) == (2, None)


async def test_a_task_edit_between_decision_and_commit_runs_the_new_task(harness):
    """A Run admitted after its task was republished must pin the task revision current at its
    admission, and the occurrence must still be admitted (not lost to the race)."""
    await seed(harness)
    view = await initialized(harness, "a", every_second("a", expression="0 0 1 1 *",
                                                        grace_ms=30_000))
    await harness.elapse(view.next_fire_at_ms - await harness.now_ms())

    def edit_task():
        async def body(other):
            await other.publisher().put_task("p1", "t1", {"command": ["echo", "edited"]})
        harness.elsewhere(body)

    first = await harness.run_round(between=edit_task)
    later = await harness.run_round()
    assert first.admitted + later.admitted == 1, (first, later)
    assert harness.task_revisions_of_runs("a") == [2]


async def test_a_trigger_deleted_and_created_again_never_reuses_a_revision(harness):
    """A reused revision would give a new trigger the identity (idempotency keys) of the old."""
    await seed(harness)
    await harness.publisher.put_trigger(every_second("a"))
    await harness.publisher.put_trigger(every_second("a", expression="*/2 * * * * *"))
    await harness.publisher.delete_trigger("p1", "a")
    assert await harness.reader.list_triggers() == []
    assert await harness.reader.list_schedules() == []
    head = await harness.publisher.put_trigger(every_second("a"))
    assert head.trigger_revision == 3


# ---- recovery ---------------------------------------------------------------------------------

async def test_recovery_leaves_pristine_queued_work_and_names_drift(harness):
    """A pristine queued Attempt treated as failed would be retried (a duplicate execution); a
    drifted one left unnamed would hide damage."""
    await seed(harness)
    view = await initialized(harness, "a", every_second("a", expression="0 0 1 1 *"))
    await harness.publisher.put_trigger(every_second("b", expression="0 0 1 1 *"))
    await harness.run_round()
    await harness.elapse(view.next_fire_at_ms - await harness.now_ms())
    assert (await harness.run_round()).admitted == 2
    report = await harness.backend.recover()
    assert (report.pristine_queued, report.candidates) == (2, ())
    [drifted] = await harness.reader.recent_runs(trigger_id="b")
    harness.drift_run(drifted.run_id)
    await harness.restart()
    report = await harness.backend.recover()
    assert report.pristine_queued == 1
    assert len(report.candidates) == 1 and drifted.run_id in report.candidates[0]


# ---- rounds: accounting and diagnostics ---------------------------------------------------------

async def test_an_idle_round_reports_nothing_and_does_not_ask_for_more(harness):
    """A round with nothing to do that asked to run again at once would spin a core."""
    report = await harness.run_round()
    assert isinstance(report, RoundReport)
    assert (report.initialized, report.admitted, report.skipped, report.errors,
            report.cas_misses, report.fence_lost, report.more_due) == (0, 0, 0, 0, 0, 0, False)


async def test_a_trigger_of_a_kind_without_provider_is_named_with_the_shared_code(harness):
    """A trigger whose kind's plugin is not loaded never fires; if the backends named it by
    different codes, an alert written for one would miss it on the other."""
    await seed(harness)

    async def publish(other):
        await other.publisher().put_trigger(every_second("x", kind="othercron"))
    harness.elsewhere(publish, found=providers(other_kind=True))
    await harness.publisher.put_trigger(every_second("a", expression="0 0 1 1 *"))
    await harness.backend.recover()
    report = await harness.run_round()
    assert report.initialized == 1 and report.admitted == 0
    named = [e for e in harness.sink.events if e.code == RoundEvent.UNKNOWN_TRIGGER_KIND]
    assert named and all(e.fields.get("kind") == "othercron" for e in named), harness.sink.codes()
    assert RoundEvent.DECIDE_FAILED not in harness.sink.codes()
    assert harness.count("runs", "x") == 0


async def test_one_round_counts_each_kind_of_decision_once(harness):
    """RoundReport is what operators graph; a field counting different things per backend (or a
    decision counted twice) misreports the same schedule."""
    await seed(harness)
    grace = skip_grace_floor_ms(LIMITS, leased=harness.leased) + 1
    for definition in (every_second("fire", grace_ms=3_600_000),
                       every_second("once", grace_ms=1500),
                       every_second("skip", policy="skip", grace_ms=grace)):
        await harness.publisher.put_trigger(definition)
    assert (await harness.run_round()).initialized == 3
    await harness.elapse((grace // SECOND + 5) * SECOND)
    starts = {s.trigger_id: s.next_fire_at_ms for s in await harness.reader.list_schedules()}
    await harness.publisher.put_trigger(every_second("new", expression="0 0 1 1 *"))
    report = await harness.run_round()
    fired = await runs_since(harness, "fire", starts["fire"])
    assert fired == list(range(starts["fire"], (await schedule(harness, "fire")).next_fire_at_ms, SECOND))
    assert (report.initialized, report.admitted, report.skipped) == (1, len(fired) + 1, 2), (
        report, [(e.code, e.message) for e in harness.sink.events])
    assert (report.cas_misses, report.fence_lost, report.errors) == (0, 0, 0), report
    assert len(await runs_since(harness, "once", starts["once"])) == 1
    assert await runs_since(harness, "skip", starts["skip"]) == []
    assert harness.count("skips") == 2 == len(await harness.reader.recent_skips())
    assert harness.count("events") == 2 * harness.count("runs") == 2 * harness.count("attempts")


async def test_a_provider_that_fails_is_named_with_the_shared_code_and_others_fire(harness):
    """A plugin bug in one trigger must not stop the others' occurrences, and must be reported
    under one code on every backend."""
    await seed(harness)

    async def publish(other):
        await other.publisher().put_trigger(every_second("x", kind="othercron"))
    harness.elsewhere(publish, found=providers(other_kind=True))
    await harness.publisher.put_trigger(every_second("a"))
    await harness.restart(providers(broken_other_kind=True))
    report = await harness.run_round()
    assert report.initialized == 1 and report.errors == 1, report
    failed = [e for e in harness.sink.events if e.code == RoundEvent.DECIDE_FAILED]
    assert failed and failed[0].fields.get("trigger_id") == "x", harness.sink.codes()
    await harness.elapse(2 * SECOND)
    assert (await harness.run_round()).admitted >= 2
    assert harness.count("runs", "x") == 0


# ---- reader views and opening -------------------------------------------------------------------

async def test_reader_views_show_schedules_runs_and_status_alike(harness):
    """The CLI's listings read these views on either backend; a field meaning different things
    would show operators a wrong schedule."""
    await seed(harness)
    status = await harness.reader.scheduler_status()
    assert not status.running and status.replicas == 0
    await harness.publisher.put_trigger(every_second("b", expression="0 0 1 1 *"))
    await harness.publisher.put_trigger(every_second("a", expression="0 0 1 1 *"))
    [first, second] = await harness.reader.list_schedules()
    assert [first.trigger_id, second.trigger_id] == ["a", "b"]  # uninitialized, then by id
    assert first.kind == "cron" and first.enabled and first.misfire_policy is MisfirePolicy.FIRE_ONCE
    assert first.spec["expression"] == "0 0 1 1 *" and first.published_at_ms is not None
    await harness.backend.recover()
    await harness.run_round()
    view = await schedule(harness, "a")
    await harness.elapse(view.next_fire_at_ms - await harness.now_ms())
    await harness.run_round()
    runs = await harness.reader.recent_runs()
    assert sorted(r.trigger_id for r in runs) == ["a", "b"]
    assert all(r.state == "queued" and r.lag_ms >= 0 and r.trigger_revision == 1 for r in runs)
    assert [r.trigger_id for r in await harness.reader.recent_runs(trigger_id="b")] == ["b"]
    assert len(await harness.reader.recent_runs(limit=1)) == 1
    assert len({r.idempotency_key for r in runs}) == 2
    status = await harness.reader.scheduler_status()
    assert status.running and status.replicas == 1


async def test_listing_limits_follow_one_rule_on_every_backend(harness):
    """A negative or non-integer limit was a ValueError on one backend and an empty list on the
    other: the same CLI call must not mean two things. Both refuse it alike, and a limit caps
    every listing, skips included."""
    await seed(harness)
    for trigger_id in ("a", "b", "c"):
        await harness.publisher.put_trigger(every_second(trigger_id, expression="0 0 1 1 *"))
    reader = harness.reader
    for bad in (-1, True, 2.5):
        for listing in (lambda: reader.list_schedules(limit=bad), lambda: reader.list_triggers(limit=bad),
                        lambda: reader.list_projects(limit=bad), lambda: reader.recent_runs(limit=bad),
                        lambda: reader.recent_skips(limit=bad)):
            with pytest.raises(UserError, match="invalid listing limit"):
                await listing()
    assert [s.trigger_id for s in await reader.list_schedules(limit=2)] == ["a", "b"]
    assert [t.trigger_id for t in await reader.list_triggers(limit=1)] == ["a"]
    assert len(await reader.list_schedules(limit=None)) == 3
    assert await reader.list_schedules(limit=0) == []


async def test_opening_a_missing_store_without_create_creates_nothing(harness):
    """A read command must not create (or migrate) a store it was pointed at by mistake."""
    for _ in range(2):  # the second look proves the first created nothing
        backend = harness.missing_store_backend()
        try:
            try:
                await backend.open(create=False)
            except StoreMissing:
                continue
            states = await backend.migrate()
            assert states and all(s.status != "applied" for s in states)
            with pytest.raises(SchemaNotReady):
                await backend.check_readiness()
        finally:
            await backend.close()


#: What ``from qinglong.testing.conformance.store import *`` brings into a test module: the tests.
__all__ = sorted(name for name in dict(globals()) if name.startswith("test_"))
