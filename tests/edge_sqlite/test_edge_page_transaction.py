"""What a page transaction reads or draws once for all its occurrences: the task heads an admission
pins (read inside the transaction, once per task) and the ids of its Runs and Attempts (one random
prefix per page)."""

from __future__ import annotations

import asyncio
import sqlite3

from edge_helpers import Diagnostics, cron, open_backend, query, seed

from qinglong.contracts.diagnostics import RoundEvent
from qinglong.plugins.edge_sqlite.scheduler import PageTransaction, pinned_execution_digest

MINUTE = 60_000


async def test_a_task_republished_before_the_page_commits_refuses_each_of_its_occurrences_once(
        db_path, tmp_path, clock):
    """The page reads each task's head once, inside its transaction. Read before the transaction (or
    kept from an earlier page), a republish between the decision and the commit would admit Runs
    pinning the replaced revision; read per page but refusing only the first occurrence of the task,
    the others would pin it too. Each refused occurrence must be admitted by the next round, pinning
    the new revision, or it is lost."""
    diagnostics = Diagnostics()
    backend = await open_backend(db_path, clock, page_size=16, diagnostics=diagnostics)
    other = await open_backend(db_path, clock, migrate=False)  # a publisher on its own connection
    try:
        await seed(backend)
        await backend.publisher().put_task("p1", "t2", {"command": ["echo", "two"]})
        for i in range(3):
            await backend.publisher().put_trigger(cron(f"a{i}", task="t1"))
        for i in range(2):
            await backend.publisher().put_trigger(cron(f"b{i}", task="t2"))
        while (await backend.run_round()).more_due:
            pass
        clock.advance(MINUTE)
        assert (await backend.run_round()).admitted == 5  # every task head read by a page before
        clock.advance(MINUTE)
        loop = asyncio.get_running_loop()

        def republish_t1(conn: sqlite3.Connection) -> None:
            # On the scheduler's thread, between its decisions and its page transaction.
            asyncio.run_coroutine_threadsafe(
                other.publisher().put_task("p1", "t1", {"command": ["echo", "changed"]}), loop
            ).result(timeout=30)

        report = await backend.run_round(before_commit=republish_t1)
        assert (report.admitted, report.cas_misses) == (2, 3)
        changed = [e for e in diagnostics.events if e.code == RoundEvent.TASK_CHANGED]
        assert sorted(e.fields["trigger_id"] for e in changed) == ["a0", "a1", "a2"]
        due = clock.ms
        assert query(db_path, "SELECT trigger_id FROM runs WHERE scheduled_for_ms = ? ORDER BY 1",
                     (due,)) == [("b0",), ("b1",)]

        report = await backend.run_round()
        assert (report.admitted, report.cas_misses) == (3, 0)
        (revision, digest), = query(db_path, "SELECT task_revision, content_digest FROM tasks "
                                             "WHERE task_id = 't1'")
        assert revision == 2
        pinned = query(db_path, "SELECT r.trigger_id, r.task_revision, a.execution_digest FROM runs r "
                                "JOIN attempts a USING (run_id) WHERE r.task_id = 't1' "
                                "AND r.scheduled_for_ms = ? ORDER BY 1", (due,))
        expected_digest = pinned_execution_digest("p1", "t1", 2, digest)
        assert pinned == [(f"a{i}", 2, expected_digest) for i in range(3)]
    finally:
        await other.close()
        await backend.close()


async def test_the_runs_of_a_page_share_a_random_prefix_that_no_other_page_reuses(db_path, clock):
    """Ids sharing one prefix per page keep a page's index writes on a few leaf pages; a prefix
    reused by another page (or an id repeated) would make a later Run's insert fail on the primary
    key, and its occurrence would be refused and held instead of admitted."""
    backend = await open_backend(db_path, clock, page_size=8)
    try:
        await seed(backend)
        for i in range(16):
            await backend.publisher().put_trigger(cron(f"c{i:02d}"))
        while (await backend.run_round()).more_due:
            pass
        clock.advance(MINUTE)
        first = await backend.run_round()
        second = await backend.run_round()
        assert (first.admitted, second.admitted) == (8, 8)
        rows = query(db_path, "SELECT r.run_id, a.attempt_id, r.trigger_id FROM runs r "
                              "JOIN attempts a USING (run_id) ORDER BY r.trigger_id")
        run_ids = [r[0] for r in rows]
        attempt_ids = [r[1] for r in rows]
        for ids in (run_ids, attempt_ids):
            assert len(set(ids)) == 16
            assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids)
            prefixes = [i[:-4] for i in ids]
            assert len(set(prefixes[:8])) == 1 and len(set(prefixes[8:])) == 1
            assert prefixes[0] != prefixes[8]
        assert set(run_ids).isdisjoint(attempt_ids)
    finally:
        await backend.close()


def test_a_page_draws_new_prefixes_before_its_serial_would_wrap():
    """A serial that wrapped past 16 bits would repeat the page's first id: the 65,537th admission
    of one page would be refused on the primary key."""
    page = PageTransaction()
    ids = [page.ids() for _ in range(0x10000 + 3)]
    runs = [r for r, _ in ids]
    attempts = [a for _, a in ids]
    assert len(set(runs)) == len(runs) and len(set(attempts)) == len(attempts)
    assert runs[0][:-4] != runs[0x10000][:-4]
    assert runs[0x10000][-4:] == "0000"
