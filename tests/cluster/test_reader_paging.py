"""The schedules listing pages with a keyset cursor: every schedule exactly once across pages,
in the due order, each page reading only its own rows; a statement that outlives the timeout is
a clear error, not a traceback."""

from __future__ import annotations

import asyncio
import json
import threading

import psycopg
import pytest

from tests.support.cluster import arun, seed, set_cursor
from devtools.scale_seed import clone_triggers, plan_nodes
from qinglong.contracts.errors import StoreUnavailable, UserError
from qinglong.plugins.cluster_postgres.sql import query
from tests.support.aio import closing


def _listing(cluster, limit, after=None, settings=None):
    async def body():
        backend = cluster.backend("reader", settings=settings)
        async with closing(backend):
            return await backend.reader().list_schedules(limit, after=after)

    return arun(body())


def test_paging_with_the_cursor_returns_every_schedule_once_in_the_due_order(cluster):
    """A cursor that skipped or repeated rows at the boundary between the rows awaiting
    initialization and the due ones (or between equal fire times) would hide or double schedules
    in a listing an operator pages through."""
    seed(cluster, 6, project="pb", prefix="b")
    seed(cluster, 5, project="pa", prefix="a")
    set_cursor(cluster, None, 60_000)
    for t in ("a001", "b004", "b000"):
        set_cursor(cluster, t, None)  # awaiting initialization: listed first
    set_cursor(cluster, "b002", -5_000)
    whole = _listing(cluster, None)
    assert len(whole) == 11
    keys = [(s.next_fire_at_ms is not None, s.next_fire_at_ms or 0, s.project_id, s.trigger_id)
            for s in whole]
    assert keys == sorted(keys)
    for size in (1, 2, 3, 4, 10):
        pages, after = [], None
        while True:
            page = _listing(cluster, size, after=after)
            assert len(page) <= size
            if not page:
                break
            pages.extend(page)
            after = page[-1] if len(pages) % 2 else (page[-1].next_fire_at_ms, page[-1].project_id,
                                                     page[-1].trigger_id)
        assert [s.trigger_id for s in pages] == [s.trigger_id for s in whole], size


def test_a_page_deep_in_a_large_store_reads_only_its_own_rows(cluster):
    """An offset or a sort would make the last pages of a million schedules cost the whole table
    each (the listing ended in a statement timeout)."""
    seed(cluster, 1, project="scale", prefix="tpl")
    with psycopg.connect(cluster.superuser_dsn(), autocommit=True) as conn:
        clone_triggers(conn, "tpl000", 30_000)
        middle = conn.execute("SELECT next_fire_at_ms, project_id, trigger_id FROM qinglong.trigger_schedules "
                              "WHERE trigger_id = 'x00015000'").fetchone()
    with psycopg.connect(cluster.superuser_dsn()) as conn:
        [[doc]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("list_schedules"),
                               {"limit": 50, "after_next": middle[0], "after_project": middle[1],
                                "after_trigger": middle[2]}).fetchall()
    nodes = list(plan_nodes(doc[0]))
    def rows(n):
        return float(n.get("Actual Rows", 0)) * n.get("Actual Loops", 1) + sum(
            int(v) for k, v in n.items() if k.startswith("Rows Removed by"))

    # whatever the planner sorts (the empty range of rows awaiting initialization), it is never
    # more than the page; every schedule scan reads the page and nothing before the cursor
    assert all(rows(n) <= 51 for n in nodes if n["Node Type"] == "Sort"), json.dumps(doc)[:3000]
    scans = [n for n in nodes if n.get("Relation Name") == "trigger_schedules"]
    assert scans and all(rows(n) <= 51 for n in scans), scans
    page = _listing(cluster, 3, after=middle)
    assert [s.trigger_id for s in page] == ["x00015001", "x00015002", "x00015003"]


def test_a_listing_that_outlives_the_statement_timeout_is_a_clear_store_error(cluster):
    """A statement timeout surfacing as a traceback (exit 1) tells the operator nothing; the
    error must say what to do (ask for fewer rows and page)."""
    seed(cluster, 2)
    held, release = threading.Event(), threading.Event()

    def locker():
        with psycopg.connect(cluster.superuser_dsn()) as conn:
            conn.execute("LOCK TABLE qinglong.triggers IN ACCESS EXCLUSIVE MODE")
            held.set()
            release.wait(60)
            conn.rollback()

    thread = threading.Thread(target=locker)
    thread.start()
    try:
        assert held.wait(60)
        with pytest.raises(StoreUnavailable, match="statement timeout"):
            _listing(cluster, 10, settings=cluster.settings(statement_timeout_ms=300))
    finally:
        release.set()
        thread.join()


def test_an_invalid_cursor_is_refused_with_what_was_expected(cluster):
    """A malformed cursor silently read as "from the start" would repeat pages for ever."""
    with pytest.raises(UserError, match="invalid schedule cursor"):
        _listing(cluster, 10, after=("not a time", "p", "t"))
