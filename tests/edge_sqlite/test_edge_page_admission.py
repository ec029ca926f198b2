"""A round's page of decisions commits in one transaction and one thread hop, each occurrence under
its own savepoint and compare-and-set: a row whose CAS misses is undone alone and reported while
the rest of the page commits, and no occurrence is ever written in part."""

from __future__ import annotations

import sqlite3

from edge_helpers import Diagnostics, cron, open_backend, query, seed

MINUTE = 60_000


def _runs(db_path) -> dict:
    return {t: n for t, n in query(db_path, "SELECT trigger_id, count(*) FROM runs GROUP BY trigger_id")}


async def _page_of_due(backend, clock, count: int) -> None:
    await seed(backend)
    for i in range(count):
        await backend.publisher().put_trigger(cron(f"t{i:02d}", "* * * * *"))
    while (await backend.run_round()).more_due:  # initialize every cursor
        pass
    clock.advance(MINUTE)


async def test_a_page_of_admissions_is_one_transaction_and_one_thread_hop(db_path, clock, backends):
    """A transaction (and a WAL commit) per occurrence capped a burst near the single-row commit
    rate; a thread hop per occurrence adds a queue round trip each. One page, one of each."""
    backend = backends.track(await open_backend(db_path, clock, page_size=16))
    await _page_of_due(backend, clock, 12)
    statements: list[str] = []
    calls: list[str] = []
    real_call = backend.store.call

    async def counted_call(fn, *args):
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real_call(fn, *args)

    def trace(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(statements.append)

    backend.store.call = counted_call
    try:
        report = await backend.run_round(before_commit=trace)
    finally:
        backend.store.call = real_call
        await real_call(lambda conn: conn.set_trace_callback(None))
    assert report.admitted == 12
    assert len(calls) == 1, calls
    words = [s.split()[0].upper() for s in statements]
    assert words.count("BEGIN") == 1 and words.count("COMMIT") == 1, statements
    # Every write succeeded, so no occurrence needed a savepoint of its own.
    assert not [s for s in statements if s.split()[0].upper() in ("SAVEPOINT", "ROLLBACK")]
    assert sum(_runs(db_path).values()) == 12


async def test_a_cas_miss_undoes_only_its_row_and_the_rest_of_the_page_commits(db_path, clock, backends):
    """Failing the whole page for one trigger changed meanwhile would delay every other occurrence
    of the page by a round (or forever, if that row kept changing); committing the changed row
    anyway would admit from a stale cursor."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, page_size=16, diagnostics=diagnostics))
    await _page_of_due(backend, clock, 6)
    before = query(db_path, "SELECT next_fire_at_ms, state_version FROM trigger_schedules "
                            "WHERE trigger_id = 't03'")[0]

    def change_one_row(conn: sqlite3.Connection) -> None:
        # A concurrent writer moved t03's state after the round decided it.
        conn.execute("UPDATE trigger_schedules SET state_version = state_version + 1 "
                     "WHERE trigger_id = 't03'")

    report = await backend.run_round(before_commit=change_one_row)
    assert (report.admitted, report.cas_misses) == (5, 1)
    assert _runs(db_path) == {f"t{i:02d}": 1 for i in range(6) if i != 3}
    after = query(db_path, "SELECT next_fire_at_ms, state_version FROM trigger_schedules "
                           "WHERE trigger_id = 't03'")[0]
    assert after == (before[0], before[1] + 1)  # only the concurrent writer's change
    report = await backend.run_round()  # decided again from the new state: admitted once
    assert report.admitted == 1
    assert _runs(db_path) == {f"t{i:02d}": 1 for i in range(6)}


async def test_a_write_refused_mid_occurrence_leaves_none_of_it_and_the_page_commits(db_path, clock, backends):
    """Without a savepoint per occurrence, a Run refused after its schedule's cursor advanced would
    either commit the advance without the Run (the occurrence lost) or roll back the whole page."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, page_size=16, diagnostics=diagnostics))
    await _page_of_due(backend, clock, 4)
    due = clock.ms
    cursor_before = query(db_path, "SELECT next_fire_at_ms, state_version FROM trigger_schedules "
                                   "WHERE trigger_id = 't01'")[0]
    conn = sqlite3.connect(db_path)
    with conn:  # a Run already holding t01's key: its insert fails after the CAS succeeded
        conn.execute("INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
                     "task_revision, task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, "
                     "state, idempotency_key) VALUES ('x', 'p1', 't01', 1, 't1', 1, 'd', ?, 0, 0, "
                     "'succeeded', ?)", (due, f"ql3:cron:v1:t01:1:{due}"))
    conn.close()
    report = await backend.run_round()
    assert (report.admitted, report.errors) == (3, 1)
    assert [e.code for e in diagnostics.events if e.level == "error"] == ["scheduler.commit_failed"]
    assert query(db_path, "SELECT next_fire_at_ms, state_version FROM trigger_schedules "
                          "WHERE trigger_id = 't01'")[0] == cursor_before
    assert query(db_path, "SELECT count(*) FROM runs WHERE trigger_id = 't01'") == [(1,)]
    assert query(db_path, "SELECT count(*) FROM attempts a JOIN runs r USING (run_id) "
                          "WHERE r.trigger_id = 't01'") == [(0,)]
    assert query(db_path, "SELECT count(*) FROM run_events e JOIN runs r USING (run_id) "
                          "WHERE r.trigger_id = 't01'") == [(0,)]
    assert _runs(db_path) == {"t00": 1, "t01": 1, "t02": 1, "t03": 1}


async def test_a_backlog_of_one_trigger_is_admitted_occurrence_by_occurrence_in_the_page(db_path, clock, backends):
    """Each owed occurrence of a backlog is its own savepoint in the same page transaction: a
    cursor that did not see its own earlier write would miss its CAS and drain one per round."""
    backend = backends.track(await open_backend(db_path, clock, page_size=16))
    await seed(backend)
    await backend.publisher().put_trigger(cron("b", "* * * * *", grace_ms=10 * MINUTE))
    await backend.run_round()
    clock.advance(5 * MINUTE)
    report = await backend.run_round()
    assert (report.admitted, report.cas_misses) == (5, 0)
    assert _runs(db_path) == {"b": 5}
    keys = query(db_path, "SELECT count(DISTINCT idempotency_key) FROM runs")
    assert keys == [(5,)]
