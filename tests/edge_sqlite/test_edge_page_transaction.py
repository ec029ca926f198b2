"""What a page transaction reads or draws once for all its occurrences: the task heads an admission
pins (read inside the transaction, once per task) and the ids of its Runs and Attempts (one random
prefix per page)."""

from __future__ import annotations

import asyncio
import sqlite3

from edge_helpers import Diagnostics, cron, open_backend, query, seed

from qinglong.contracts.diagnostics import RoundEvent
from qinglong.plugins.edge_sqlite.scheduler_read import pinned_execution_digest
from qinglong.plugins.edge_sqlite.scheduler_write import PageTransaction

MINUTE = 60_000


async def test_a_task_republished_before_the_page_commits_refuses_each_of_its_occurrences_once(
        db_path, tmp_path, clock, backends):
    """The page reads each task's head once, inside its transaction. Read before the transaction (or
    kept from an earlier page), a republish between the decision and the commit would admit Runs
    pinning the replaced revision; read per page but refusing only the first occurrence of the task,
    the others would pin it too. Each refused occurrence must be admitted by the next round, pinning
    the new revision, or it is lost."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, page_size=16, diagnostics=diagnostics))
    # a publisher on its own connection
    other = backends.track(await open_backend(db_path, clock, migrate=False))
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


async def test_the_runs_of_a_page_share_a_random_prefix_that_no_other_page_reuses(db_path, clock, backends):
    """Ids sharing one prefix per page keep a page's index writes on a few leaf pages; a prefix
    reused by another page (or an id repeated) would make a later Run's insert fail on the primary
    key, and its occurrence would be refused and held instead of admitted."""
    backend = backends.track(await open_backend(db_path, clock, page_size=8))
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


def _key_taken(db_path, trigger_id: str, due: int) -> None:
    """A Run already holding ``trigger_id``'s key for ``due``: its admission fails on the UNIQUE key
    after its cursor advanced, part-way through the occurrence."""
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
                     "task_revision, task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, "
                     "state, idempotency_key) VALUES ('x', 'p1', ?, 1, 't1', 1, 'd', ?, 0, 0, "
                     "'succeeded', ?)", (trigger_id, due, f"ql3:cron:v1:{trigger_id}:1:{due}"))
    conn.close()


async def test_a_write_failing_part_way_rewrites_the_page_with_a_savepoint_per_occurrence(
        db_path, clock, backends):
    """Written without savepoints, a page whose write fails after an occurrence's cursor advanced
    must not commit that advance without its Run (the occurrence lost): the page is rolled back
    and written again, each occurrence under its own savepoint, and only the failing one is
    undone. The second pass must start from the decisions: a backlog cursor left where the first
    pass moved it would skip (lose) the occurrences already written once, and counters or reports
    kept from the first pass would count a miss twice."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, page_size=16, diagnostics=diagnostics))
    other = backends.track(await open_backend(db_path, clock, migrate=False))
    await seed(backend)
    await backend.publisher().put_task("p1", "t2", {"command": ["echo", "two"]})
    await backend.publisher().put_trigger(cron("a0", grace_ms=10 * MINUTE))  # a backlog
    await backend.publisher().put_trigger(cron("a1"))
    await backend.publisher().put_trigger(cron("b0", task="t2"))  # its task changes
    await backend.publisher().put_trigger(cron("z9"))  # written last, fails
    while (await backend.run_round()).more_due:
        pass
    clock.advance(3 * MINUTE)
    due = clock.ms
    _key_taken(db_path, "z9", due)
    loop = asyncio.get_running_loop()
    statements: list[str] = []

    def change_t2_and_trace(conn: sqlite3.Connection) -> None:
        asyncio.run_coroutine_threadsafe(
            other.publisher().put_task("p1", "t2", {"command": ["echo", "changed"]}), loop
        ).result(timeout=30)
        conn.set_trace_callback(statements.append)

    try:
        report = await backend.run_round(before_commit=change_t2_and_trace)
    finally:
        await backend.store.call(lambda conn: conn.set_trace_callback(None))
    words = [s.split()[0].upper() for s in statements]
    assert words.count("BEGIN") == 2 and words.count("ROLLBACK") >= 1 and words.count("COMMIT") == 1
    assert statements[statements.index("ROLLBACK"):].count("SAVEPOINT occurrence") >= 4
    # a0 owes 3 occurrences, a1 its latest (fire_once) one; b0 missed on its task; z9 refused.
    assert (report.admitted, report.cas_misses, report.errors) == (4, 1, 1)
    assert [e.code for e in diagnostics.events if e.code == RoundEvent.TASK_CHANGED] == [
        RoundEvent.TASK_CHANGED]
    assert [e.code for e in diagnostics.events if e.level == "error"] == [RoundEvent.COMMIT_FAILED]
    runs = query(db_path, "SELECT trigger_id, scheduled_for_ms FROM runs WHERE run_id <> 'x' "
                          "ORDER BY 1, 2")
    assert runs == [("a0", due - 2 * MINUTE), ("a0", due - MINUTE), ("a0", due), ("a1", due)]
    assert query(db_path, "SELECT count(*) FROM attempts") == [(4,)]
    assert query(db_path, "SELECT count(*) FROM run_events") == [(8,)]
    cursors = dict(query(db_path, "SELECT trigger_id, next_fire_at_ms FROM trigger_schedules"))
    assert cursors == {"a0": due + MINUTE, "a1": due + MINUTE, "b0": due - 2 * MINUTE,
                       "z9": due - 2 * MINUTE}
