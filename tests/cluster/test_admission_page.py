"""A claimed page admitted in one SERIALIZABLE statement: each row under its own fence and
decision, the passing rows together, the failing ones reported one by one, never a partial
occurrence; a serialization failure retried whole, then split, so a hot row cannot starve the page."""

from __future__ import annotations

import dataclasses

import psycopg

from tests.support.cluster import arun, claim, seed, set_cursor
from qinglong.contracts.decision import decide
from qinglong.contracts.errors import FenceLost
from qinglong.plugins.cluster_postgres.admission import PageItem, commit_page
from qinglong.plugins.cluster_postgres.db import AdmissionRefused
from tests.support.aio import closing


def _totals(db):
    return db.count("runs"), db.count("attempts"), db.count("run_events"), db.count("schedule_skips")


async def _commit_page(backend, claims, retries: int = 5, tamper=None):
    provider = backend.context.providers["cron"]
    items = []
    for c in claims:
        decision = decide(c.head, c.cursor, c.observed_at_ms, provider)
        if tamper is not None:
            c = tamper(c)
        items.append(PageItem(c, decision, False))
    pool = await backend.runtime_pool()
    async with pool.connection() as conn:
        return await commit_page(conn, items, retries=retries)


def _claim_all(cluster, n):
    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            return backend, await claim(backend, limit=n)

    return arun(body())


def test_a_page_admits_its_passing_rows_together_and_refuses_the_others_one_by_one(cluster):
    """If one stale row failed the whole page, a single lost fence would drop a page of
    occurrences; if a failing row wrote anything, it would be a partial or a second admission."""
    seed(cluster, 5)
    set_cursor(cluster, None, -1000)

    def tamper(c):
        if c.head.trigger_id == "tr001":  # a fence this replica no longer holds
            return dataclasses.replace(c, fence=dataclasses.replace(c.fence, token="00000000-0000-4000-8000-000000000000"))
        if c.head.trigger_id == "tr003":  # a task digest that does not verify
            return dataclasses.replace(c, task_digest="sha256:" + "0" * 64)
        return c

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            claims = await claim(backend, limit=5)
            return claims, await _commit_page(backend, claims, tamper=tamper)

    claims, page = arun(body())
    by_id = {c.head.trigger_id: o for c, o in zip(claims, page.outcomes)}
    assert isinstance(by_id["tr001"], FenceLost)
    assert isinstance(by_id["tr003"], AdmissionRefused)
    admitted = {t: o for t, o in by_id.items() if not isinstance(o, BaseException)}
    assert sorted(admitted) == ["tr000", "tr002", "tr004"]
    assert all(o.admission is not None for o in admitted.values())
    assert _totals(cluster) == (3, 3, 6, 0)
    # one statement: every Run of the page carries the same database clock
    assert cluster.sql("SELECT count(DISTINCT admitted_at_ms) FROM qinglong.runs") == [(1,)]
    assert cluster.sql("SELECT trigger_id FROM qinglong.runs ORDER BY 1") == [
        ("tr000",), ("tr002",), ("tr004",)]
    # the refused rows are as the claim left them: still claimed, cursor unmoved
    rows = cluster.sql("SELECT trigger_id, claim_owner, last_scheduled_at_ms FROM qinglong.trigger_schedules "
                       "WHERE trigger_id IN ('tr001', 'tr003') ORDER BY 1")
    assert rows == [("tr001", "r1", None), ("tr003", "r1", None)]


def test_a_write_that_fails_on_one_row_is_isolated_and_the_rest_of_the_page_commits(cluster):
    """A failed write rolls the whole page back; without splitting, one bad row would keep its
    whole page from ever being admitted (every round, until the fault goes)."""
    seed(cluster, 6)
    set_cursor(cluster, None, -1000)
    cluster.sql("CREATE FUNCTION public.injected_fault() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN IF NEW.trigger_id = 'tr004' THEN "
                "RAISE EXCEPTION 'injected fault on %', NEW.trigger_id; END IF; RETURN NEW; END $$")
    cluster.sql("CREATE TRIGGER injected_fault BEFORE INSERT ON qinglong.runs FOR EACH ROW "
                "EXECUTE FUNCTION public.injected_fault()")

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            claims = await claim(backend, limit=6)
            return claims, await _commit_page(backend, claims)

    claims, page = arun(body())
    by_id = {c.head.trigger_id: o for c, o in zip(claims, page.outcomes)}
    assert isinstance(by_id.pop("tr004"), psycopg.errors.RaiseException)
    assert all(o.admission is not None for o in by_id.values()), by_id
    assert _totals(cluster) == (5, 5, 10, 0)
    assert cluster.sql("SELECT claim_owner, last_scheduled_at_ms FROM qinglong.trigger_schedules "
                       "WHERE trigger_id = 'tr004'") == [("r1", None)]


def test_a_hot_row_that_keeps_conflicting_does_not_starve_its_page(cluster):
    """A page retried only whole would fail for ever while one of its rows keeps losing
    serialization races: every other occurrence of the page would wait with it."""
    seed(cluster, 8)
    set_cursor(cluster, None, -1000)
    cluster.sql("CREATE FUNCTION public.serialization_fault() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN IF NEW.trigger_id = 'tr005' THEN "
                "RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$")
    cluster.sql("CREATE TRIGGER serialization_fault BEFORE INSERT ON qinglong.runs FOR EACH ROW "
                "EXECUTE FUNCTION public.serialization_fault()")

    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            claims = await claim(backend, limit=8)
            return claims, await _commit_page(backend, claims, retries=3)

    claims, page = arun(body())
    by_id = {c.head.trigger_id: o for c, o in zip(claims, page.outcomes)}
    assert isinstance(by_id.pop("tr005"), psycopg.errors.SerializationFailure)
    assert all(o.admission is not None for o in by_id.values()), by_id
    assert _totals(cluster) == (7, 7, 14, 0)
    assert page.serialization_retries >= 3


def test_a_round_admits_a_page_and_gives_back_an_exhausted_row_for_the_next_round(cluster):
    """Through the coordinator: the hot row's claim is released at once (not stranded for a
    lease) and the rest of the page is admitted in the same round, exactly once."""
    seed(cluster, 4)
    set_cursor(cluster, None, -1000)
    cluster.sql("CREATE SEQUENCE public.fault_seq")
    cluster.sql("CREATE FUNCTION public.serialization_fault() RETURNS trigger LANGUAGE plpgsql "
                "SECURITY DEFINER AS $$ BEGIN IF NEW.trigger_id = 'tr002' AND nextval('public.fault_seq') <= 50 "
                "THEN RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$")
    cluster.sql("CREATE TRIGGER serialization_fault BEFORE INSERT ON qinglong.runs FOR EACH ROW "
                "EXECUTE FUNCTION public.serialization_fault()")
    backend = cluster.backend("r1", settings=cluster.settings(serialization_retries=2))

    async def body():
        async with closing(backend):
            first = await backend.run_round()
            released = backend.last_round.claims_released
            cluster.sql("DROP TRIGGER serialization_fault ON qinglong.runs")
            second = await backend.run_round()
            return first, released, second

    first, released, second = arun(body())
    assert (first.claimed, first.admitted, first.errors, released) == (4, 3, 1, 1)
    assert (second.claimed, second.admitted) == (1, 1)
    assert _totals(cluster) == (4, 4, 8, 0)
    assert cluster.sql("SELECT count(DISTINCT trigger_id) FROM qinglong.runs") == [(4,)]
