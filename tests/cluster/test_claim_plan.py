"""The claim's cost follows the due work, not the number of schedules: plan shape, not timing.

With 50,000 schedules far in the future and a few due, EXPLAIN (ANALYZE, BUFFERS) of the real
claim statement must show the due index read through an index condition on the cursor, touching
only the due entries and a handful of pages. A plan that kept the due test in a filter walks all
50,000 entries (hundreds of pages) on every round of every replica, and the cost of an idle
round then grows with the size of the store instead of with what is due.
"""

from __future__ import annotations

import psycopg

from tests.support.cluster import arun, claim, seed, set_cursor
from devtools.scale_seed import (blocks_read, clone_triggers, due_index_scans, explain_claim,
                                      make_due, rows_read)
from tests.support.aio import closing

FUTURE = 50_000
DUE = ["x00000007", "x00012345", "x00049999"]
#: Generous bounds: a few index pages and the due rows (plus a few neighbours the scan inspects
#: to find the end of the range). The walk of the whole index reads about 50,000 rows.
MAX_ROWS = 20
MAX_BLOCKS = 60


def _seed_store(cluster):
    seed(cluster, 1, expression="* * * * *", project="scale", prefix="tpl")
    set_cursor(cluster, "tpl000", 400 * 86_400_000)  # the template itself far away too
    with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as conn:
        clone_triggers(conn, "tpl000", FUTURE)
        make_due(conn, DUE)


def _assert_bounded(plan, context):
    scans = due_index_scans(plan)
    assert scans, f"{context}: the claim does not read the due index at all:\n{plan}"
    for node in scans:
        assert "next_fire_at_ms" in node.get("Index Cond", ""), (
            f"{context}: the due index is scanned without a cursor condition (the due test is a "
            f"filter, the scan walks the whole index): {node}")
        assert rows_read(node) <= MAX_ROWS, f"{context}: the due scan read {rows_read(node)} rows: {node}"
        assert blocks_read(node) <= MAX_BLOCKS, (
            f"{context}: the due scan read {blocks_read(node)} pages: {node}")


def test_a_claim_reads_only_the_due_part_of_the_schedule_index(cluster):
    """Without the index condition, every round of every replica walks every schedule (at a
    million schedules about a second of database time per round) and the claim's cost grows with
    the store instead of with the due work."""
    _seed_store(cluster)
    with psycopg.connect(cluster.superuser_dsn()) as conn:
        plan = explain_claim(conn)
    assert int(float(plan["Plan"]["Actual Rows"])) == len(DUE), plan["Plan"]
    _assert_bounded(plan, "a claim that finds the due rows")


def test_an_empty_claim_stays_bounded_while_the_due_rows_are_leased(cluster):
    """The claim that ends every round finds everything due already leased: it must stop at the
    end of the due range too, or idle replicas would each walk the whole index once a round."""
    _seed_store(cluster)

    async def body():
        backend = cluster.backend("holder")
        async with closing(backend):
            return await claim(backend, limit=16)

    claimed = arun(body())
    assert sorted(c.head.trigger_id for c in claimed) == DUE
    with psycopg.connect(cluster.superuser_dsn()) as conn:
        plan = explain_claim(conn, owner="other")
    assert int(float(plan["Plan"]["Actual Rows"])) == 0, "a leased schedule was claimed again"
    _assert_bounded(plan, "an empty claim")


def test_rows_awaiting_initialization_are_claimed_first_through_their_own_index_range(cluster):
    """New schedules (no cursor yet) come before due ones and are found by an index condition
    too; without it a burst of new triggers would wait behind the due rows, or be found by a walk."""
    _seed_store(cluster)
    set_cursor(cluster, "x00030000", None)
    with psycopg.connect(cluster.superuser_dsn()) as conn:
        plan = explain_claim(conn, limit=2)
    assert int(float(plan["Plan"]["Actual Rows"])) == 2
    conds = [n.get("Index Cond", "") for n in due_index_scans(plan)]
    assert any("IS NULL" in c for c in conds), conds
    _assert_bounded(plan, "a claim of new and due rows")

    async def body():
        backend = cluster.backend("first")
        async with closing(backend):
            return await claim(backend, limit=2)

    assert [c.head.trigger_id for c in arun(body())] == ["x00030000", DUE[0]]
