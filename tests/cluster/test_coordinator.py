"""The coordinator round: bounded claims, identities allocated at admission, race statistics."""

from __future__ import annotations

import asyncio
import time

from tests.support.cluster import arun, claim, seed, set_cursor
from qinglong.plugins.cluster_postgres.claim import CLAIM_BUDGET_HARD_CAP
from qinglong.plugins.cron.provider import CronProvider
from tests.support.aio import closing


def _bulk_triggers(db, n: int) -> None:
    """``n`` extra triggers on the seeded task, inserted directly (publishing 300 would be slow)."""
    db.sql("""
        INSERT INTO qinglong.triggers (trigger_id, project_id, task_id, trigger_revision, kind,
            spec_json, misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms)
        SELECT 'bulk' || lpad(i::text, 4, '0'), 'p1', 'task', 1, 'cron',
               '{"expression": "0 0 1 1 *", "timezone": "UTC"}', 'fire_once', 60000, true, 'd', 0
        FROM generate_series(1, %(n)s) i;
        """, {"n": n})
    db.sql("""
        INSERT INTO qinglong.trigger_schedules (trigger_id, project_id, trigger_revision,
            state_version, claim_version, updated_at_ms)
        SELECT trigger_id, project_id, 1, 1, 0, 0 FROM qinglong.triggers WHERE trigger_id LIKE 'bulk%%'
        """)


def test_a_round_never_claims_more_than_the_hard_cap(cluster):
    """An unbounded claim would hold hundreds of leases it cannot admit before they expire."""
    seed(cluster, 1)
    _bulk_triggers(cluster, 300)

    async def body():
        backend = cluster.backend("r1", claim_budget=10_000)
        async with closing(backend):
            first = await backend.run_round()
            second = await backend.run_round()
            return first, second

    first, second = arun(body())
    assert first.claimed == CLAIM_BUDGET_HARD_CAP == 256 and first.more_due
    assert first.initialized == 256 and first.errors == 0
    assert second.claimed == 301 - 256 and not second.more_due


def test_the_budget_doubles_while_claims_come_back_full_and_starts_again_from_the_configured_one(cluster):
    """The configured budget bounds the first claim; each full claim lets the next take twice as
    many rows. If the budget never grew, a burst would need a claim and a transaction per 16 rows
    and its last Run would be admitted seconds late; if it did not go back to the configured
    budget once a claim is not full, the next burst would start with one replica's claim taking
    a large page and leaving its peers idle."""
    seed(cluster, 40)

    async def body():
        backend = cluster.backend("r1", claim_budget=4)
        async with closing(backend):
            first = [await backend.run_round() for _ in range(5)]  # initialize all 40
            set_cursor(cluster, None, -1000)  # all 40 due: the next burst
            return first, [await backend.run_round() for _ in range(5)]

    for reports in arun(body()):
        assert [r.claimed for r in reports] == [4, 8, 16, 12, 0]
        assert [r.more_due for r in reports] == [True, True, True, False, False]
        assert all(r.errors == 0 for r in reports)
    assert cluster.count("runs") == 40


def test_a_growing_budget_never_passes_the_hard_cap(cluster):
    """A budget doubled without bound would let one round hold more leases than it can admit
    before they expire."""
    seed(cluster, 1)
    _bulk_triggers(cluster, 500)

    async def body():
        backend = cluster.backend("r1", claim_budget=200)
        async with closing(backend):
            return [await backend.run_round() for _ in range(3)]

    reports = arun(body())
    assert [r.claimed for r in reports] == [200, CLAIM_BUDGET_HARD_CAP, 501 - 200 - 256]
    assert [r.more_due for r in reports] == [True, True, False]


def test_run_identity_is_allocated_only_by_admission(cluster):
    """Identities minted at claim time would name Runs that never existed after a lost claim."""
    seed(cluster, 3)

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            init = await backend.run_round()  # initialization: claims, no Runs
            assert init.initialized == 3 and init.admitted == 0
            assert cluster.count("runs") == 0
            set_cursor(cluster, None, -500)
            fire = await backend.run_round()
            return fire, backend.last_round.admissions

    fire, admissions = arun(body())
    assert fire.admitted == 3
    stored = cluster.sql("SELECT run_id::text, admitted_at_ms FROM qinglong.runs ORDER BY run_id")
    assert sorted(a.run_id for a in admissions) == [r[0] for r in stored]
    assert len({a.attempt_id for a in admissions}) == 3
    # the schedule row has no place for a run identity: nothing is reserved before admission
    columns = {r[0] for r in cluster.sql("SELECT column_name FROM information_schema.columns "
                                         "WHERE table_schema = 'qinglong' AND table_name = 'trigger_schedules'")}
    assert not any("run" in c for c in columns)


def _latest_claim_expiry(cluster) -> int:
    [(expiry,)] = cluster.sql("SELECT max(claim_expires_at_ms) FROM qinglong.trigger_schedules")
    assert expiry is not None, "no claim is held"
    return expiry


async def _until_database_time_passes(cluster, at_ms: int, timeout_s: float = 60) -> None:
    """Wait until the database clock (the one leases are judged by) is past ``at_ms``."""
    deadline = time.monotonic() + timeout_s
    while cluster.db_now_ms() <= at_ms:
        assert time.monotonic() < deadline, f"database time did not pass {at_ms} within {timeout_s:.0f} s"
        await asyncio.sleep(0.02)


class SlowProvider(CronProvider):
    """A cron provider whose decision outlives a short lease, and that records overlap."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.active = 0
        self.max_active = 0

    def next_after(self, spec, after_ms):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        time.sleep(self.delay_s)
        self.active -= 1
        return super().next_after(spec, after_ms)


def test_a_round_that_outlives_its_lease_commits_nothing_and_says_so(cluster):
    """A round whose decisions outlive the lease can no longer commit any of its claims; if it
    went on waiting, a stalled database wait would stall the replica, and if it committed, a
    takeover could admit the same occurrence again. Operators see it as a timed-out round (or a
    lost fence, when the late admission reached the server first)."""
    seed(cluster, 2)
    backend = cluster.backend("r1", lease_ms=200)
    backend.context.providers["cron"] = SlowProvider(0.3)

    async def body():
        async with closing(backend):
            cut = await backend.run_round()
            backend.context.providers["cron"] = SlowProvider(0.0)
            codes = list(backend.context.diagnostics.codes())
            later = []
            # a fast round may still outlive a 200 ms lease on a loaded machine: that one too
            # commits nothing, and the next takes over again (bounded by rounds, not by time)
            while not later or (later[-1].errors and len(later) < 20):
                await _until_database_time_passes(cluster, _latest_claim_expiry(cluster))  # the claims lapse
                later.append(await backend.run_round())
            return cut, codes, later

    cut, codes, later = arun(body())
    assert cut.claimed == 2 and cut.initialized == 0 and cut.admitted == 0
    assert cut.errors + cut.fence_lost >= 1
    assert (cut.errors == 1) == ("cluster_postgres.round_timed_out" in codes)
    # a later round gets a working connection (the cut one was discarded) and, the claims having
    # lapsed, takes them over; every schedule is initialized exactly once, by the first round
    # that completes (a round cut again initialized nothing)
    after = later[-1]
    assert after.errors == 0 and after.claimed == 2 and after.initialized == 2, later
    assert [r.initialized for r in later[:-1]] == [0] * (len(later) - 1), later


def test_round_reports_cas_misses_and_serialization_retries(cluster):
    """Without these counters a replica losing every race looks healthy."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)
    cluster.sql("CREATE SEQUENCE public.fault_seq")
    cluster.sql("CREATE FUNCTION public.serialization_fault() RETURNS trigger LANGUAGE plpgsql "
                "SECURITY DEFINER AS $$ BEGIN IF nextval('public.fault_seq') <= 1 THEN "
                "RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$")
    cluster.sql("CREATE TRIGGER serialization_fault BEFORE INSERT ON qinglong.runs FOR EACH ROW "
                "EXECUTE FUNCTION public.serialization_fault()")

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            return await backend.run_round()

    report = arun(body())
    assert report.admitted == 1 and report.serialization_retries == 1 and report.errors == 0


def test_rounds_of_one_backend_never_overlap(cluster, monkeypatch):
    """Overlapping rounds of one replica would race each other for their own claims."""
    from qinglong.plugins.cluster_postgres import backend as backend_module

    seed(cluster, 4)
    backend = cluster.backend("r1", claim_budget=2)
    original = backend_module.run_round
    state = {"active": 0, "max": 0}

    async def observed_round(*args, **kwargs):
        state["active"] += 1
        state["max"] = max(state["max"], state["active"])
        try:
            await asyncio.sleep(0.05)  # yield: another round could start here if not excluded
            return await original(*args, **kwargs)
        finally:
            state["active"] -= 1

    monkeypatch.setattr(backend_module, "run_round", observed_round)

    async def body():
        async with closing(backend):
            return await asyncio.gather(*(backend.run_round() for _ in range(3)))

    reports = arun(body())
    assert state["max"] == 1
    assert [r.claimed for r in reports] == [2, 2, 0]
    assert sum(r.initialized for r in reports) == 4


def test_an_admission_that_exhausts_its_retries_gives_its_claim_back_and_is_admitted_next_round(cluster):
    """Serialization failures that outlast the retries used to leave the claim held until its
    lease expired (30 s by default): the occurrence was late by a whole lease. Released under the
    full fence, it must be claimed and admitted by the very next round, exactly once."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)
    # persistent conflict: the first 3 admissions of a Run fail with SQLSTATE 40001
    cluster.sql("CREATE SEQUENCE public.fault_seq")
    cluster.sql("CREATE FUNCTION public.serialization_fault() RETURNS trigger LANGUAGE plpgsql "
                "SECURITY DEFINER AS $$ BEGIN IF nextval('public.fault_seq') <= 3 THEN "
                "RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$")
    cluster.sql("CREATE TRIGGER serialization_fault BEFORE INSERT ON qinglong.runs FOR EACH ROW "
                "EXECUTE FUNCTION public.serialization_fault()")
    backend = cluster.backend("r1", lease_ms=30_000,
                              settings=cluster.settings(serialization_retries=2))

    async def body():
        async with closing(backend):
            gave_up = await backend.run_round()
            released = backend.last_round.claims_released
            schedule = cluster.sql("SELECT claim_owner, claim_expires_at_ms FROM qinglong.trigger_schedules")[0]
            runs_between = cluster.count("runs")
            admitted = await backend.run_round()
            return gave_up, released, schedule, runs_between, admitted

    # database time before the first claim: its lease expires no earlier than this plus 30 s
    first_claim_not_before_ms = cluster.db_now_ms()
    gave_up, released, schedule, runs_between, admitted = arun(body())
    codes = backend.context.diagnostics.codes()
    assert gave_up.claimed == 1 and gave_up.admitted == 0 and gave_up.errors == 1
    assert gave_up.serialization_retries == 2 and released == 1
    assert "cluster_postgres.serialization_exhausted" in codes
    assert schedule == (None, None) and runs_between == 0  # given back at once, nothing written
    # the next round, not a lease later, claims it again and admits it once
    assert admitted.claimed == 1 and admitted.admitted == 1 and admitted.errors == 0
    # admitted before the first claim's lease would have expired: it was given back, not waited out
    [(admitted_at_ms,)] = cluster.sql("SELECT admitted_at_ms FROM qinglong.runs")
    assert admitted_at_ms < first_claim_not_before_ms + 30_000
    assert cluster.count("runs") == 1 and cluster.count("attempts") == 1 and cluster.count("run_events") == 2


def test_a_released_claim_cannot_be_released_by_its_old_owner_after_a_takeover(cluster):
    """Giving a claim back with less than the whole fence would let a replica whose lease already
    lapsed clear a newer owner's claim, and two replicas could then hold the same occurrence."""
    from qinglong.plugins.cluster_postgres.claim import release_claim

    seed(cluster, 1)
    set_cursor(cluster, "tr000", -1000)

    async def body():
        old, new = cluster.backend("r1"), cluster.backend("r2")
        async with closing(new), closing(old):
            [mine] = await claim(old, lease_ms=200)
            await _until_database_time_passes(cluster, mine.fence.expires_at_ms)
            [theirs] = await claim(new)
            pool = await old.runtime_pool()
            async with pool.connection() as conn:
                stale = await release_claim(conn, mine)
            pool = await new.runtime_pool()
            async with pool.connection() as conn:
                current = await release_claim(conn, theirs)
            return stale, current

    stale, current = arun(body())
    assert stale is False and current is True
    assert cluster.sql("SELECT claim_owner FROM qinglong.trigger_schedules") == [(None,)]
