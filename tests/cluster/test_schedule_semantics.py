"""Cluster schedule semantics against a real PostgreSQL: races between claim and commit, backlog
drain, initialization from the publish time, revision identity, publish-time refusals and what a
reader can tell about the schedulers."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import psycopg
import pytest

from tests.support.cluster import arun, seed, set_cursor
from qinglong.contracts.diagnostics import RoundEvent
from qinglong.contracts.errors import TriggerSpecError
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
from qinglong.plugins.cluster_postgres import coordinator
from qinglong.plugins.cron.provider import CronProvider
from tests.support.aio import closing

EVERY_SECOND = "* * * * * *"


def _publish(db, *definitions: TriggerDefinition, lease_ms: int = 1000, project: str = "p1",
             payload=None) -> list:
    """Publish a project, its task and ``definitions`` through the real publisher, under limits
    whose lease is ``lease_ms`` (so a 'skip' grace above cadence + lease is accepted)."""
    from qinglong.contracts.errors import AlreadyExists

    async def body():
        backend = db.backend("publisher", lease_ms=lease_ms)
        async with closing(backend):
            pub = backend.publisher()
            try:
                await pub.create_project(project)
            except AlreadyExists:
                pass
            await pub.put_task(project, "task", payload or {"cmd": ["echo", "hello"]})
            return [await pub.put_trigger(d) for d in definitions]

    return arun(body())


def _trigger(trigger_id: str, expression: str, policy: str = "fire_once", grace_ms: int = 60_000,
             project: str = "p1") -> TriggerDefinition:
    return TriggerDefinition(project, trigger_id, "task", "cron", {"expression": expression},
                             misfire_policy=MisfirePolicy(policy), misfire_grace_ms=grace_ms)


def _put_task_elsewhere(db, payload) -> None:
    """Publish a new task revision from another thread (its own loop and pool), and wait for it."""
    error: list[BaseException] = []

    def work():
        async def body():
            backend = db.backend("editor")
            async with closing(backend):
                await backend.publisher().put_task("p1", "task", payload)
        try:
            asyncio.run(body())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            error.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "task edit did not finish"
    if error:
        raise error[0]


def _rounds(db, n: int, owner: str = "r1", **kw):
    backend = db.backend(owner, **kw)

    async def body():
        async with closing(backend):
            return [await backend.run_round() for _ in range(n)]

    return arun(body()), backend.context.diagnostics


def _align_cursor(db, trigger_id: str, seconds_ago: int) -> int:
    """Put a per-second trigger's cursor on the whole second ``seconds_ago`` before database now."""
    [(value,)] = db.sql(
        "UPDATE qinglong.trigger_schedules SET next_fire_at_ms = "
        "(floor(extract(epoch FROM clock_timestamp())) - %s)::bigint * 1000, claim_owner = NULL, "
        "claim_token = NULL, claim_expires_at_ms = NULL WHERE trigger_id = %s RETURNING next_fire_at_ms",
        (seconds_ago, trigger_id))
    return value


# ---- races between claim and commit -----------------------------------------------------------

def test_a_task_edit_between_claim_and_commit_gives_the_claim_back_and_fires_on_time(cluster, monkeypatch):
    """A task edit racing the admission used to leave the claim live for its whole lease: with
    'skip' and a grace shorter than the lease, the on-time occurrence was recorded as skipped
    (lost) a lease later. The claim must be given back and the occurrence admitted next round."""
    _publish(cluster, _trigger("tr000", "0 0 1 1 *", policy="skip", grace_ms=5000))
    set_cursor(cluster, "tr000", -100)  # due now, well inside the 5 s grace
    [(due_at,)] = cluster.sql("SELECT next_fire_at_ms FROM qinglong.trigger_schedules")
    real_decide = coordinator.decide
    edits = []

    def decide_while_the_task_is_edited(*args):
        if not edits:  # between this round's claim and its commit
            edits.append(True)
            _put_task_elsewhere(cluster, {"cmd": ["echo", "edited"]})
        return real_decide(*args)

    monkeypatch.setattr(coordinator, "decide", decide_while_the_task_is_edited)
    (raced, after), sink = _rounds(cluster, 2, lease_ms=30_000)
    assert raced.claimed == 1 and raced.admitted == 0 and raced.cas_misses == 1
    assert RoundEvent.TASK_CHANGED in sink.codes()
    assert after.claimed == 1 and after.admitted == 1 and after.skipped == 0
    assert cluster.sql("SELECT scheduled_for_ms, task_revision FROM qinglong.runs") == [(due_at, 2)]
    assert cluster.count("schedule_skips") == 0


def test_a_republish_racing_the_claim_statement_never_hands_out_a_mixed_claim(cluster):
    """A republish committing while the claim statement runs could hand out a claim whose schedule
    row is the new revision and whose head the old one: the decision raised and the new revision
    waited a whole lease. The claim statement is paused deterministically (a test trigger blocks
    on an advisory lock while it writes the first row, before it locks the second) and the second
    trigger is republished in that window; no mixed claim may come out, and the next round must
    initialize the new revision."""
    _publish(cluster, _trigger("tr000", "0 0 1 1 *"), _trigger("tr001", "0 0 1 1 *"))
    set_cursor(cluster, "tr000", -5000)
    set_cursor(cluster, "tr001", -4000)
    # a plan that writes each claimed row before it locks the next (nested loops only), so the
    # pause below falls between the two rows; hash joins would lock them all before writing any
    cluster.sql(f'ALTER ROLE qinglong_runtime IN DATABASE "{cluster.dbname}" SET enable_hashjoin = off')
    cluster.sql(f'ALTER ROLE qinglong_runtime IN DATABASE "{cluster.dbname}" SET enable_mergejoin = off')
    cluster.sql("CREATE FUNCTION public.pause_claim() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$")
    cluster.sql("CREATE TRIGGER pause_claim BEFORE UPDATE ON qinglong.trigger_schedules FOR EACH ROW "
                "WHEN (NEW.trigger_id = 'tr000' AND NEW.claim_owner = 'racer' "
                "AND OLD.claim_owner IS DISTINCT FROM 'racer') EXECUTE FUNCTION public.pause_claim()")
    reports: list = []
    backend = cluster.backend("racer", lease_ms=30_000)

    def racing_round():
        async def body():
            async with closing(backend):
                reports.append(await backend.run_round())
                reports.append(await backend.run_round())
        asyncio.run(body())

    with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(4242)")
        thread = threading.Thread(target=racing_round)
        thread.start()
        deadline = time.monotonic() + 60
        while not cluster.sql("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"):
            assert time.monotonic() < deadline, "the claim statement never reached the pause"
            time.sleep(0.02)
        # the claim statement holds tr000 and has not locked tr001 yet: republish tr001 now
        _publish(cluster, _trigger("tr001", "0 0 1 1 *", grace_ms=61_000))
        holder.execute("SELECT pg_advisory_unlock(4242)")
        thread.join(60)
    assert not thread.is_alive()
    raced, after = reports
    codes = backend.context.diagnostics.codes()
    assert RoundEvent.DECIDE_FAILED not in codes and raced.errors == 0
    assert raced.admitted == 1  # tr000, claimed before the republish
    # the republished trigger is initialized by the next round, not a lease later
    assert after.initialized == 1 and after.errors == 0
    [(revision, cursor, owner)] = cluster.sql(
        "SELECT trigger_revision, next_fire_at_ms, claim_owner FROM qinglong.trigger_schedules "
        "WHERE trigger_id = 'tr001'")
    assert revision == 2 and cursor is not None and owner is None


class _FailingOnce(CronProvider):
    """The real cron provider, failing its first computation (a provider bug that went away)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def next_after(self, spec, after_ms):
        if not self.failed:
            self.failed = True
            raise RuntimeError("provider fault")
        return super().next_after(spec, after_ms)


def test_a_claim_whose_decision_failed_is_given_back_and_decided_next_round(cluster):
    """A decision that raised used to leave its claim live for a lease: the occurrence was a whole
    lease late (or, past the grace, lost). It must be given back and decided the next round."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -100)
    backend = cluster.backend("r1", lease_ms=30_000)
    backend.context.providers["cron"] = _FailingOnce()

    async def body():
        async with closing(backend):
            return await backend.run_round(), await backend.run_round()

    failed, after = arun(body())
    assert failed.errors == 1 and backend.last_round is not None
    assert RoundEvent.DECIDE_FAILED in backend.context.diagnostics.codes()
    assert after.claimed == 1 and after.admitted == 1 and after.errors == 0


def test_a_round_that_made_no_progress_does_not_ask_to_run_again_at_once(cluster):
    """A full page of claims that all fail must not set more_due: the host would start the next
    round at once and spin on the same failing page."""
    seed(cluster, 2)
    set_cursor(cluster, None, -100)

    class AlwaysFailing(CronProvider):
        def next_after(self, spec, after_ms):
            raise RuntimeError("provider fault")

    backend = cluster.backend("r1", claim_budget=2)
    backend.context.providers["cron"] = AlwaysFailing()

    async def body():
        async with closing(backend):
            return await backend.run_round()

    report = arun(body())
    assert report.claimed == 2 and report.errors == 2 and report.more_due is False


# ---- backlog and initialization ---------------------------------------------------------------

def test_a_backlog_inside_the_grace_drains_in_one_round(cluster):
    """After a stall, a per-second trigger used to admit one occurrence per round and stay late by
    the stall for as long as it ran; edge drains it in one round. Every owed occurrence, once."""
    _publish(cluster, _trigger("tr000", EVERY_SECOND, grace_ms=60_000))
    first = _align_cursor(cluster, "tr000", 10)  # a ten-second stall
    (report,), _sink = _rounds(cluster, 1)
    [(cursor,)] = cluster.sql("SELECT next_fire_at_ms FROM qinglong.trigger_schedules")
    scheduled = [r[0] for r in cluster.sql("SELECT scheduled_for_ms FROM qinglong.runs ORDER BY 1")]
    [(last_admitted,)] = cluster.sql("SELECT max(admitted_at_ms) FROM qinglong.runs")
    assert report.admitted >= 11 and report.errors == 0 and report.more_due is False
    assert scheduled == list(range(first, cursor, 1000))  # consecutive, none twice
    assert cursor > last_admitted  # caught up: nothing was still due when the round let go


def test_a_backlog_beyond_the_per_row_bound_asks_for_another_round(cluster):
    """One trigger must not take a whole round, and the rest of its backlog must not wait a cadence:
    at the bound the round says more is due, and the next round goes on where it stopped."""
    _publish(cluster, _trigger("tr000", EVERY_SECOND, grace_ms=600_000))
    first = _align_cursor(cluster, "tr000", 100)
    (one, two), _sink = _rounds(cluster, 2)
    assert one.admitted == coordinator.BACKLOG_FIRES_PER_ROW and one.more_due is True
    assert two.admitted >= 100 - coordinator.BACKLOG_FIRES_PER_ROW
    scheduled = [r[0] for r in cluster.sql("SELECT scheduled_for_ms FROM qinglong.runs ORDER BY 1")]
    assert scheduled == [first + 1000 * i for i in range(len(scheduled))]


def test_an_occurrence_between_publish_and_the_first_round_is_admitted(cluster):
    """Initializing from the first claim instead of the publish lost the occurrence between the two
    (a daily job edited at 01:59:59.7 would not run at 02:00). The first occurrence after the
    publish, in database time, must be admitted by the scheduler's first round."""
    _publish(cluster, _trigger("tr000", EVERY_SECOND, grace_ms=60_000))
    [(published,)] = cluster.sql("SELECT published_at_ms FROM qinglong.trigger_schedules")
    owed = (published // 1000 + 1) * 1000
    deadline = time.monotonic() + 30
    while cluster.db_now_ms() <= owed + 300:  # the scheduler's first look comes after it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (report,), _sink = _rounds(cluster, 1)
    assert report.initialized == 1 and report.admitted >= 1
    scheduled = [r[0] for r in cluster.sql("SELECT scheduled_for_ms FROM qinglong.runs ORDER BY 1")]
    assert scheduled[0] == owed


def test_a_republish_records_its_own_publish_time(cluster):
    """A new revision initialized from the first revision's publish time would replay occurrences
    from before it was published; the reader shows each revision's publish time."""
    _publish(cluster, _trigger("tr000", "0 0 1 1 *"))
    [(first,)] = cluster.sql("SELECT published_at_ms FROM qinglong.trigger_schedules")
    _publish(cluster, _trigger("tr000", "0 0 1 1 *", grace_ms=61_000))
    [(second, revision)] = cluster.sql("SELECT published_at_ms, trigger_revision FROM qinglong.trigger_schedules")
    assert revision == 2 and second >= first

    async def body():
        backend = cluster.backend("reader")
        async with closing(backend):
            return await backend.reader().list_schedules()

    [view] = arun(body())
    assert view.published_at_ms == second


# ---- integrity and publish-time refusals ------------------------------------------------------

def test_a_task_head_cannot_point_at_a_missing_revision(cluster):
    """A head naming a revision that does not exist made its triggers silently never fire."""
    seed(cluster, 1)
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        cluster.sql("UPDATE qinglong.tasks SET task_revision = 99")


def test_a_dangling_task_head_is_refused_with_an_error_naming_the_trigger(cluster):
    """Were the key bypassed (replication role, a dropped constraint), the admission counted a
    lost fence every round and said nothing: the trigger never fired and nobody knew."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -100)
    with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE qinglong.tasks SET task_revision = 99")
    (report,), sink = _rounds(cluster, 1)
    assert report.fence_lost == 0 and report.errors == 1 and report.admitted == 0
    [event] = [e for e in sink.events if e.code == "cluster_postgres.admission_refused"]
    assert event.level == "error" and event.fields["trigger_id"] == "tr000"
    assert "revision 99" in event.message and "does not exist" in event.message


def test_skip_with_a_grace_the_lease_cannot_meet_is_refused_at_publish(cluster):
    """A 'skip' grace at or below cadence + lease is accepted and then never fires (every on-time
    occurrence may be observed later than that): refuse it, naming trigger, grace and floor."""
    seed(cluster, 0)
    backend = cluster.backend("publisher", lease_ms=30_000)  # cadence 1000: floor 31000

    async def body():
        async with closing(backend):
            pub = backend.publisher()
            with pytest.raises(TriggerSpecError) as refused:
                await pub.put_trigger(_trigger("tr_low", "* * * * *", policy="skip", grace_ms=31_000))
            accepted = await pub.put_trigger(_trigger("tr_ok", "* * * * *", policy="skip", grace_ms=31_001))
            return str(refused.value), accepted

    message, accepted = arun(body())
    assert "tr_low" in message and "31000" in message and "30000" in message
    assert accepted.trigger_id == "tr_ok"
    assert cluster.sql("SELECT trigger_id FROM qinglong.triggers") == [("tr_ok",)]
    assert cluster.sql("SELECT trigger_id FROM qinglong.trigger_schedules") == [("tr_ok",)]


def test_enabling_a_stored_skip_trigger_below_the_floor_is_refused(cluster):
    """A head stored before the floor was enforced (or edited by hand) must not be switched on to
    skip its on-time occurrences in silence; the refusal writes nothing."""
    seed(cluster, 0)
    backend = cluster.backend("publisher", lease_ms=30_000)  # cadence 1000: floor 31000

    async def publish():
        async with closing(backend):
            await backend.publisher().put_trigger(dataclasses.replace(
                _trigger("old", "* * * * *", policy="skip", grace_ms=60_000), enabled=False))

    arun(publish())
    cluster.sql("UPDATE qinglong.triggers SET misfire_grace_ms = 200 WHERE trigger_id = 'old'")
    before = cluster.sql("SELECT trigger_revision, enabled FROM qinglong.triggers")
    backend = cluster.backend("publisher", lease_ms=30_000)

    async def enable():
        async with closing(backend):
            with pytest.raises(TriggerSpecError, match="'old'.*200 ms"):
                await backend.publisher().set_trigger_enabled("p1", "old", True)

    arun(enable())
    assert cluster.sql("SELECT trigger_revision, enabled FROM qinglong.triggers") == before


def test_a_trigger_deleted_and_created_again_never_reuses_a_revision(cluster):
    """Restarting at revision 1 made (trigger_id, trigger_revision) name two definitions: old Runs
    mixed with new ones, and an old occurrence's idempotency key could block a new one."""
    _publish(cluster, _trigger("tr000", "0 0 1 1 *"))
    _publish(cluster, _trigger("tr000", "0 0 1 1 *", grace_ms=61_000))

    async def delete():
        backend = cluster.backend("publisher")
        async with closing(backend):
            await backend.publisher().delete_trigger("p1", "tr000")

    arun(delete())
    [head] = _publish(cluster, _trigger("tr000", "0 0 1 1 *"))
    assert head.trigger_revision == 3
    assert cluster.sql("SELECT trigger_revision FROM qinglong.trigger_schedules") == [(3,)]


# ---- reader -----------------------------------------------------------------------------------

def test_scheduler_status_follows_the_replicas_rounds(cluster):
    """Without it a reader cannot tell a stopped scheduler from a working one, and shows the lag of
    a stopped scheduler as if it kept growing."""
    seed(cluster, 1)

    async def status():
        backend = cluster.backend("reader", lease_ms=30_000)
        async with closing(backend):
            return await backend.reader().scheduler_status()

    before = arun(status())
    assert before.running is False and before.replicas == 0 and before.last_round_at_ms is None
    started = cluster.db_now_ms()
    _rounds(cluster, 2, owner="r1")
    _rounds(cluster, 1, owner="r2")
    ended = cluster.db_now_ms()
    live = arun(status())
    assert live.running is True and live.replicas == 2
    assert started <= live.last_round_at_ms <= ended
    assert cluster.sql("SELECT owner, rounds FROM qinglong.scheduler_replicas ORDER BY owner") == [
        ("r1", 2), ("r2", 1)]
    # silent for longer than 3 cadences + a lease: stopped
    cluster.sql("UPDATE qinglong.scheduler_replicas SET last_round_at_ms = last_round_at_ms - 34000")
    stopped = arun(status())
    assert stopped.running is False and stopped.replicas == 0 and stopped.last_round_at_ms is not None


def test_reader_lists_are_bounded_by_a_limit(cluster):
    """Listing a store of many triggers must not have to read them all."""
    seed(cluster, 5)

    async def body():
        backend = cluster.backend("reader")
        async with closing(backend):
            reader = backend.reader()
            return (await reader.list_schedules(limit=2), await reader.list_triggers(limit=3),
                    await reader.list_triggers("p1", limit=None), await reader.list_schedules())

    two, three, every, schedules = arun(body())
    assert len(two) == 2 and len(three) == 3 and len(every) == 5 and len(schedules) == 5
    assert all(s.published_at_ms is not None for s in schedules)


def test_triggers_of_a_kind_without_provider_are_left_alone_and_named_at_start(cluster):
    """A replica without a trigger kind's plugin used to claim those triggers and strand each for
    a lease (or, given back, take the page from healthy triggers every round). It must leave them
    to a replica that can decide them, say so at start, and still admit the healthy ones."""
    seed(cluster, 2)
    set_cursor(cluster, None, -100)
    cluster.sql("UPDATE qinglong.triggers SET kind = 'gone' WHERE trigger_id = 'tr000'")
    backend = cluster.backend("r1", claim_budget=1)

    async def body():
        async with closing(backend):
            await backend.recover()
            return await backend.run_round()

    report = arun(body())
    [warning] = [e for e in backend.context.diagnostics.events
                 if e.code == RoundEvent.UNKNOWN_TRIGGER_KIND]
    assert "'gone' (1 enabled trigger(s))" in warning.message
    assert report.claimed == 1 and report.admitted == 1 and report.errors == 0
    assert cluster.sql("SELECT trigger_id FROM qinglong.runs") == [("tr001",)]
    assert cluster.sql("SELECT claim_owner FROM qinglong.trigger_schedules WHERE trigger_id = 'tr000'") == [(None,)]
