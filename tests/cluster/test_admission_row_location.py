"""The admission finds each schedule row where its claim left it, and by key when it is no longer
there: a row that moved without changing is still admitted once, and a row that changed is
still refused."""

from __future__ import annotations

import dataclasses

from tests.support.cluster import arun, claim, seed, set_cursor
from qinglong.contracts.decision import decide
from qinglong.contracts.errors import FenceLost
from qinglong.plugins.cluster_postgres.admission import PageItem, commit_page
from tests.support.aio import closing


async def _admit(backend, claims):
    provider = backend.context.providers["cron"]
    items = [PageItem(c, decide(c.head, c.cursor, c.observed_at_ms, provider), False) for c in claims]
    pool = await backend.runtime_pool()
    async with pool.connection() as conn:
        return await commit_page(conn, items, retries=5)


def test_rows_moved_since_their_claim_are_found_by_key_and_admitted_once(cluster):
    """If the admission looked only where the claim left each row, a table rewritten between
    claim and commit (VACUUM FULL, CLUSTER) would make every claimed occurrence look lost: no Run
    until the lease expired and another round claimed it again, 30 s late."""
    seed(cluster, 4)
    set_cursor(cluster, None, -1000)
    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            claims = await claim(backend, limit=4)
            assert len(claims) == 4 and all(c.row_tid for c in claims)
            before = {c.head.trigger_id: c.row_tid for c in claims}
            cluster.sql("VACUUM FULL qinglong.trigger_schedules")
            after = dict(cluster.sql("SELECT trigger_id, ctid::text FROM qinglong.trigger_schedules"))
            # where a rewrite put a row back in its place, point its claim elsewhere: every row
            # must be looked for where it is not
            stale = [dataclasses.replace(c, row_tid="(4000,1)")
                     if after[c.head.trigger_id] == before[c.head.trigger_id] else c for c in claims]
            return await _admit(backend, stale)

    page = arun(body())
    assert all(not isinstance(o, BaseException) and o.admission is not None for o in page.outcomes), page.outcomes
    assert cluster.count("runs") == 4
    assert cluster.sql("SELECT count(DISTINCT trigger_id) FROM qinglong.runs") == [(4,)]


def test_a_row_that_changed_since_its_claim_is_refused_wherever_it_is_found(cluster):
    """If a row found by key after it moved skipped the fence, a claim taken over by another
    replica would be admitted twice."""
    seed(cluster, 2)
    set_cursor(cluster, None, -1000)
    async def body():
        backend = cluster.backend("r1")
        async with closing(backend):
            claims = await claim(backend, limit=2)
            # tr000 taken over since the claim: its row changed, and so moved
            cluster.sql("UPDATE qinglong.trigger_schedules SET claim_owner = 'r2', "
                        "claim_token = gen_random_uuid(), claim_version = claim_version + 1, "
                        "state_version = state_version + 1 WHERE trigger_id = 'tr000'")
            return claims, await _admit(backend, claims)

    claims, page = arun(body())
    by_id = {c.head.trigger_id: o for c, o in zip(claims, page.outcomes)}
    assert isinstance(by_id["tr000"], FenceLost)
    assert by_id["tr001"].admission is not None
    assert cluster.sql("SELECT trigger_id FROM qinglong.runs") == [("tr001",)]
