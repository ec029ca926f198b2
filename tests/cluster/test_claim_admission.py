"""Claim and admission against a real PostgreSQL: order, leases in database time, the full fence,
atomic writes and refusals."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from tests.support.cluster import arun, claim, commit, seed, set_cursor
from qinglong.contracts.errors import FenceLost
from qinglong.contracts.records import DecisionKind, MisfirePolicy, TriggerDefinition
from qinglong.plugins.cluster_postgres.db import AdmissionRefused
from tests.support.aio import closing

FAR_FUTURE_CLOCK = lambda: int(time.time() * 1000) + 86_400_000  # noqa: E731


def _totals(db):
    return db.count("runs"), db.count("attempts"), db.count("run_events"), db.count("schedule_skips")


def _schedule(db, trigger_id):
    return db.sql("SELECT next_fire_at_ms, last_scheduled_at_ms, state_version, claim_owner, "
                  "claim_token, claim_version, claim_expires_at_ms FROM qinglong.trigger_schedules "
                  "WHERE trigger_id = %s", (trigger_id,))[0]


def test_claim_takes_due_rows_in_order_and_skips_locked_ones(cluster):
    """Without the order, NULL (new) schedules could starve; without SKIP LOCKED replicas block."""
    seed(cluster, 3, project="pb", prefix="b")
    seed(cluster, 3, project="pa", prefix="a")
    set_cursor(cluster, None, -5000)
    set_cursor(cluster, "a001", None)
    set_cursor(cluster, "b002", -9000)
    set_cursor(cluster, "a000", +60_000)  # not due

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            with psycopg.connect(cluster.superuser_dsn()) as locker:
                locker.execute("SELECT 1 FROM qinglong.trigger_schedules WHERE trigger_id = 'a002' FOR UPDATE")
                # a claim that waited for the locked row would wait for ever (the lock is held
                # until after it returns): the bound turns that hang into a failure
                try:
                    first = await asyncio.wait_for(claim(backend, limit=3), 60)
                except asyncio.TimeoutError:
                    raise AssertionError("the claim waited on a locked schedule row") from None
                locker.rollback()
            second = await claim(backend, limit=10)
            return first, second

    first, second = arun(body())
    assert [c.head.trigger_id for c in first] == ["a001", "b002", "b000"]
    # a002 was locked (skipped), a000 is not due; the rest come in cursor, project, trigger order
    assert [c.head.trigger_id for c in second] == ["a002", "b001"]
    for c in first:
        assert c.fence.owner == "r1" and c.fence.expires_at_ms == c.observed_at_ms + 30_000
        assert c.cursor.state_version == 2  # the claim itself bumped it


def test_takeover_happens_only_after_database_time_expiry(cluster):
    """A replica trusting its own (fast) clock would steal a live claim and double-fire."""
    seed(cluster, 1)
    set_cursor(cluster, None, -1000)

    async def body():
        holder = cluster.backend("holder")
        rival = cluster.backend("rival", clock_ms=FAR_FUTURE_CLOCK)
        async with closing(rival), closing(holder):
            [held] = await claim(holder, lease_ms=1500)
            assert await claim(rival, lease_ms=1500) == []  # the rival's clock says "a day later"
            while cluster.db_now_ms() <= held.fence.expires_at_ms:
                time.sleep(0.05)
            [taken] = await claim(rival, lease_ms=1500)
            assert taken.observed_at_ms > held.fence.expires_at_ms
            assert taken.fence.claim_version == held.fence.claim_version + 1
            with pytest.raises(FenceLost):
                await commit(holder, held)
            result = await commit(rival, taken)
            return result

    result = arun(body())
    assert result.admission is not None
    assert _totals(cluster) == (1, 1, 2, 0)


def test_stale_owner_cannot_commit_after_takeover_by_same_owner_name(cluster):
    """ABA: with an owner-or-expiry fence alone, the old claim (same owner name) would commit too."""
    seed(cluster, 1)
    set_cursor(cluster, None, -1000)

    async def body():
        old = cluster.backend("replica-a")
        new = cluster.backend("replica-a")  # a restarted replica reusing its name
        async with closing(new), closing(old):
            [stale] = await claim(old, lease_ms=300)
            while cluster.db_now_ms() <= stale.fence.expires_at_ms:
                time.sleep(0.02)
            [fresh] = await claim(new, lease_ms=30_000)
            assert fresh.fence.owner == stale.fence.owner
            assert fresh.fence.token != stale.fence.token
            with pytest.raises(FenceLost):
                await commit(old, stale)
            await commit(new, fresh)
            with pytest.raises(FenceLost):  # and the stale one stays dead after the commit
                await commit(old, stale)

    arun(body())
    assert _totals(cluster) == (1, 1, 2, 0)


def test_admission_writes_run_attempt_events_and_clears_the_claim_atomically(cluster):
    """The admitted occurrence must be exactly one queued Run, one pristine Attempt and two events."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            [c] = await claim(backend)
            result = await commit(backend, c)
            return c, result

    c, result = arun(body())
    adm = result.admission
    assert result.kind == "fire"
    run = cluster.sql("SELECT run_id::text, state, queued_at_ms, admitted_at_ms, idempotency_key, "
                      "scheduled_for_ms, cancelled, owned_by FROM qinglong.runs")
    assert run == [(adm.run_id, "queued", adm.admitted_at_ms, adm.admitted_at_ms,
                    f"ql3:cron:v1:tr000:1:{c.cursor.next_fire_at_ms}", c.cursor.next_fire_at_ms,
                    False, "runtime")]
    attempt = cluster.sql("SELECT attempt_id::text, attempt_no, state, executor, worker_id, lease_id "
                          "FROM qinglong.attempts")
    assert attempt == [(adm.attempt_id, 1, "claimed", "remote_worker", None, None)]
    events = cluster.sql("SELECT event_type FROM qinglong.run_events ORDER BY seq")
    assert events == [("run.created",), ("run.queued",)]
    nxt, last, state_version, owner, token, claim_version, expires = _schedule(cluster, "tr000")
    assert (owner, token, expires) == (None, None, None)
    assert claim_version == c.fence.claim_version  # kept: it only grows on claim and republish
    assert state_version == c.cursor.state_version + 1
    assert last == c.cursor.next_fire_at_ms and nxt > c.observed_at_ms


def test_skip_policy_advances_the_cursor_under_the_fence_without_a_run(cluster):
    """A skip that created a Run, or left the cursor behind, would replay a missed backlog."""
    seed(cluster, 1, expression="* * * * *", policy="skip", grace_ms=60_000)
    set_cursor(cluster, "tr000", -600_000)  # ten minutes of misfires

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            [c] = await claim(backend)
            result = await commit(backend, c)
            assert result.kind == DecisionKind.MISFIRE_SKIP.value and result.admission is None
            return c, await backend.reader().recent_skips()

    c, skips = arun(body())
    assert _totals(cluster)[:3] == (0, 0, 0)
    [skip] = skips
    assert skip.policy is MisfirePolicy.SKIP and skip.count >= 10 and skip.count_exact
    nxt, _last, *_ = _schedule(cluster, "tr000")
    assert nxt > c.observed_at_ms


FAULTS = {
    "runs": "INSERT ON qinglong.runs",
    "attempts": "INSERT ON qinglong.attempts",
    "run_events": "INSERT ON qinglong.run_events",
    "trigger_schedules": "UPDATE ON qinglong.trigger_schedules",
}


@pytest.mark.parametrize("target", sorted(FAULTS))
def test_a_write_fault_at_any_statement_of_admission_rolls_back_everything(cluster, target):
    """A partial admission (Run without events, cursor advanced without Run) is a lost or
    duplicated occurrence."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)
    cluster.sql("CREATE FUNCTION public.injected_fault() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN IF TG_TABLE_NAME = 'trigger_schedules' THEN "
                "  IF NEW.claim_owner IS NOT NULL THEN RETURN NEW; END IF; "  # let the claim through
                "END IF; "
                "RAISE EXCEPTION 'injected fault on %', TG_TABLE_NAME; END $$")
    cluster.sql(f"CREATE TRIGGER injected_fault BEFORE {FAULTS[target]} FOR EACH ROW "
                "EXECUTE FUNCTION public.injected_fault()")
    before = _schedule(cluster, "tr000")

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            [c] = await claim(backend)  # the claim itself sets claim_owner, so it is not faulted
            with pytest.raises(psycopg.errors.RaiseException, match="injected fault"):
                await commit(backend, c)
            return c

    c = arun(body())
    assert _totals(cluster) == (0, 0, 0, 0)
    after = _schedule(cluster, "tr000")
    assert after[0] == before[0] and after[1] == before[1]  # cursor untouched
    assert after[3] == "r1" and str(after[4]) == c.fence.token  # the claim is still as the claim left it
    cluster.sql(f"DROP TRIGGER injected_fault ON qinglong.{target}")

    async def retry():
        backend = cluster.backend("r1")
        async with closing(backend):
            return await commit(backend, c)  # the same claim can still commit, exactly once

    assert arun(retry()).admission is not None
    assert _totals(cluster) == (1, 1, 2, 0)


def test_a_corrupted_execution_revision_digest_is_refused(cluster):
    """Admitting against a tampered execution revision would hand workers something unpinned."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)
    cluster.sql("UPDATE qinglong.execution_revisions SET spec_json = replace(spec_json, 'remote_worker', 'evil')")

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            [c] = await claim(backend)
            with pytest.raises(AdmissionRefused, match="execution revision"):
                await commit(backend, c)
            report = await backend.run_round()  # the coordinator counts it as an error, too
            return report, backend.context.diagnostics.codes()

    report, codes = arun(body())
    assert _totals(cluster) == (0, 0, 0, 0)
    assert report.admitted == 0
    cluster.sql("UPDATE qinglong.execution_revisions SET content_digest = 'sha256:0'")


def test_a_corrupted_task_digest_is_refused(cluster):
    """A task payload changed behind the publisher's back must not be admitted."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)
    cluster.sql("UPDATE qinglong.task_revisions SET payload_json = '{\"cmd\":\"rm -rf /\"}'")

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            [c] = await claim(backend)
            with pytest.raises(AdmissionRefused, match="digest"):
                await commit(backend, c)

    arun(body())
    assert _totals(cluster) == (0, 0, 0, 0)


def test_republish_during_the_decision_loses_the_fence_and_admits_nothing(cluster):
    """A decision made from the old revision must never commit after a new revision was published."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            [c] = await claim(backend)
            head = await backend.publisher().put_trigger(TriggerDefinition(
                "p1", "tr000", "task", "cron", {"expression": "0 12 1 1 *"}))
            assert head.trigger_revision == 2
            with pytest.raises(FenceLost):
                await commit(backend, c)
            return c

    c = arun(body())
    assert _totals(cluster) == (0, 0, 0, 0)
    nxt, last, state_version, owner, token, claim_version, _ = _schedule(cluster, "tr000")
    assert (nxt, last, owner, token) == (None, None, None, None)
    assert claim_version == c.fence.claim_version + 1 and state_version == c.cursor.state_version + 1


def test_serialization_failures_are_retried_and_still_admit_exactly_once(cluster):
    """Without bounded retries a transient conflict drops the occurrence; without the fence a
    retry could create a second Run."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)
    cluster.sql("CREATE SEQUENCE public.fault_seq")
    cluster.sql("CREATE FUNCTION public.serialization_fault() RETURNS trigger LANGUAGE plpgsql "
                "SECURITY DEFINER AS $$ BEGIN IF nextval('public.fault_seq') <= 2 THEN "
                "RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$")
    cluster.sql("CREATE TRIGGER serialization_fault BEFORE INSERT ON qinglong.runs FOR EACH ROW "
                "EXECUTE FUNCTION public.serialization_fault()")

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            [c] = await claim(backend)
            return await commit(backend, c, retries=5)

    result = arun(body())
    assert result.serialization_retries == 2 and result.admission is not None
    assert _totals(cluster) == (1, 1, 2, 0)


def test_admission_prepares_its_statement_again_when_the_session_lost_it(cluster):
    """The admission runs a per-session prepared statement; a session that lost it (DEALLOCATE,
    DISCARD ALL by a pooler) must prepare it again instead of failing every admission, which
    would leave each occurrence to wait for its lease and then fail again."""
    from qinglong.plugins.cluster_postgres.admission import PREPARED_NAME

    seed(cluster, 2)
    set_cursor(cluster, None, -1000)

    async def body():
        backend = cluster.backend("r1", settings=cluster.settings(pool_min_size=1, pool_max_size=1))
        async with closing(backend):
            first, second = await claim(backend)
            assert (await commit(backend, first)).admission is not None
            pool = await backend.runtime_pool()
            async with pool.connection() as conn:
                await conn.execute(f"DEALLOCATE {PREPARED_NAME}")
            return await commit(backend, second)

    assert arun(body()).admission is not None
    assert _totals(cluster) == (2, 2, 4, 0)
