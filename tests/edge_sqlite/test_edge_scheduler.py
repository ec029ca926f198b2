"""The scheduler round: decisions committed occurrence by occurrence under a compare-and-set."""

from __future__ import annotations

import sqlite3

from edge_helpers import Diagnostics, cron, open_backend, query, seed
from qinglong.plugins.edge_sqlite.publisher import put_trigger_in, validated
from qinglong.plugins.edge_sqlite.store import transaction

MINUTE = 60_000
HOUR = 60 * MINUTE


def runs(db_path, trigger_id=None):
    sql = "SELECT trigger_id, trigger_revision, scheduled_for_ms, admitted_at_ms FROM runs"
    if trigger_id is not None:
        return query(db_path, sql + " WHERE trigger_id = ? ORDER BY scheduled_for_ms", (trigger_id,))
    return query(db_path, sql + " ORDER BY trigger_id, scheduled_for_ms")


def cursor(db_path, trigger_id):
    return query(db_path, "SELECT next_fire_at_ms FROM trigger_schedules WHERE trigger_id = ?",
                 (trigger_id,))[0][0]


def skips(db_path):
    return query(db_path, "SELECT trigger_id, policy, first_skipped_ms, last_skipped_ms, count, "
                          "count_exact FROM schedule_skips ORDER BY id")


async def test_initialize_then_fire_admits_one_run_with_attempt_and_two_events(db_path, clock):
    """The basic promise: an occurrence becomes exactly one queued Run, one pristine Attempt and
    the run.created/run.queued events, all or nothing."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("a", "* * * * *"))
        report = await backend.run_round()
        assert (report.scanned, report.initialized, report.admitted) == (1, 1, 0)
        assert cursor(db_path, "a") == clock.ms + MINUTE and runs(db_path) == []
        clock.advance(MINUTE + 250)
        report = await backend.run_round()
        assert (report.admitted, report.more_due) == (1, False)
        due = clock.ms - 250
        assert runs(db_path) == [("a", 1, due, clock.ms)]
        (run_id, state, key, queued), = query(db_path, "SELECT run_id, state, idempotency_key, "
                                                       "queued_at_ms FROM runs")
        assert (state, key, queued) == ("queued", f"ql3:cron:v1:a:1:{due}", clock.ms)
        assert query(db_path, "SELECT attempt_no, state, executor, worker_id, lease_id, started_at_ms "
                              "FROM attempts WHERE run_id = ?", (run_id,)) == \
            [(1, "claimed", "remote_worker", None, None, None)]
        assert query(db_path, "SELECT seq, type FROM run_events WHERE run_id = ? ORDER BY seq",
                     (run_id,)) == [(1, "run.created"), (2, "run.queued")]
        assert query(db_path, "SELECT last_scheduled_at_ms FROM trigger_schedules") == [(due,)]
        assert (await backend.run_round()).admitted == 0
    finally:
        await backend.close()


async def test_fire_once_after_an_hour_outage_admits_only_the_latest_and_records_the_rest(db_path, clock):
    """Replaying an hour of backlog after an outage would flood workers; losing the record of what
    was skipped would hide the outage from operators."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("a", "* * * * *", grace_ms=MINUTE))
        await backend.run_round()
        start = clock.ms
        clock.advance(HOUR + 30_000)
        report = await backend.run_round()
        assert (report.admitted, report.skipped) == (1, 0)
        assert runs(db_path) == [("a", 1, start + HOUR, clock.ms)]
        assert skips(db_path) == [("a", "fire_once", start + MINUTE, start + HOUR - MINUTE, 59, 1)]
        assert cursor(db_path, "a") == start + HOUR + MINUTE
    finally:
        await backend.close()


async def test_skip_policy_admits_nothing_and_records_the_skipped_range(db_path, clock):
    """A skip trigger must never run late work, and the skipped range must be visible."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("a", "* * * * *", policy="skip", grace_ms=MINUTE))
        await backend.run_round()
        start = clock.ms
        clock.advance(HOUR + 30_000)
        report = await backend.run_round()
        assert (report.admitted, report.skipped) == (0, 1)
        assert runs(db_path) == []
        assert skips(db_path) == [("a", "skip", start + MINUTE, start + HOUR, 60, 1)]
        assert cursor(db_path, "a") == start + HOUR + MINUTE
        (view,) = await backend.reader().recent_skips()
        assert view.count == 60 and view.count_exact
    finally:
        await backend.close()


async def test_scan_order_is_uninitialised_first_then_oldest_cursor_then_ids(db_path, clock):
    """The contract's scan order keeps new triggers from waiting behind a backlog and makes both
    profiles serve due schedules in the same order."""
    backend = await open_backend(db_path, clock, page_size=2)
    try:
        await seed(backend)
        await seed(backend, project="p0")
        publisher = backend.publisher()
        await publisher.put_trigger(cron("late", "*/2 * * * *"))
        await publisher.put_trigger(cron("early", "* * * * *"))
        assert (await backend.run_round()).initialized == 2
        await publisher.put_trigger(cron("z-new", "* * * * *"))
        await publisher.put_trigger(cron("a-new", "* * * * *", project="p0", task="t1"))
        clock.advance(2 * MINUTE)
        first = await backend.run_round()
        # Both uninitialised triggers, none of the due ones, in the first page.
        assert (first.initialized, first.admitted, first.more_due) == (2, 0, True)
        second = await backend.run_round()
        assert second.admitted >= 2
        # "early" (cursor T0+1min) came before "late" (T0+2min): both were served in the same page.
        assert {r[0] for r in runs(db_path)} == {"early", "late"}
    finally:
        await backend.close()


async def test_a_round_reads_one_page_and_reports_more_due(db_path, clock):
    """An unbounded round would hold the whole table in memory on a small board."""
    backend = await open_backend(db_path, clock, page_size=4)
    try:
        await seed(backend)
        for i in range(10):
            await backend.publisher().put_trigger(cron(f"tr{i:02d}"))
        reports = [await backend.run_round() for _ in range(3)]
        assert [(r.scanned, r.initialized, r.more_due) for r in reports] == \
            [(4, 4, True), (4, 4, True), (2, 2, False)]
        assert query(db_path, "SELECT count(*) FROM trigger_schedules WHERE next_fire_at_ms IS NULL") == [(0,)]
    finally:
        await backend.close()


async def test_backlog_drains_page_by_page_without_starving_a_new_trigger(db_path, clock):
    """Occurrences late but inside the grace must all be admitted, a page at a time, while a
    trigger published meanwhile still gets initialised in the next round."""
    backend = await open_backend(db_path, clock, page_size=4)
    try:
        await seed(backend)
        for i in range(10):
            await backend.publisher().put_trigger(cron(f"b{i}", "* * * * * *", grace_ms=MINUTE))
        while (await backend.run_round()).more_due:
            pass
        start = clock.ms
        clock.advance(5_000)  # five one-second occurrences due, all inside the grace
        first = await backend.run_round()
        assert (first.scanned, first.admitted, first.more_due) == (4, 20, True)
        await backend.publisher().put_trigger(cron("newer", "* * * * * *"))
        second = await backend.run_round()
        assert second.initialized == 1 and second.admitted == 15
        third = await backend.run_round()
        assert third.admitted == 15 and not third.more_due
        for i in range(10):
            assert [r[2] for r in runs(db_path, f"b{i}")] == [start + s * 1000 for s in range(1, 6)]
        clock.advance(1_000)
        admitted = 0
        while True:
            report = await backend.run_round()
            admitted += report.admitted
            if not report.more_due:
                break
        assert admitted == 11
        assert runs(db_path, "newer")[0][2] == clock.ms
    finally:
        await backend.close()


async def test_republish_between_decision_and_commit_admits_nothing_of_the_old_revision(db_path, clock):
    """A stale decision must not create a Run for a revision the operator already replaced."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("a", "* * * * *"))
        await backend.run_round()
        clock.advance(MINUTE)
        context = backend.context

        def republish(conn: sqlite3.Connection) -> None:
            definition = cron("a", "*/2 * * * *")
            spec, kind, policy = validated(definition, context.providers)
            with transaction(conn):
                put_trigger_in(conn, definition, spec, kind, policy, clock.ms)

        report = await backend.run_round(before_commit=republish)
        assert (report.cas_misses, report.admitted) == (1, 0)
        assert runs(db_path) == []
        assert query(db_path, "SELECT trigger_revision, next_fire_at_ms FROM trigger_schedules") == [(2, None)]
        assert (await backend.run_round()).initialized == 1
    finally:
        await backend.close()


async def test_clock_jumps_forward_misfire_once_and_backward_never_duplicate(db_path, clock):
    """A clock step (NTP, a board without RTC) must neither replay a backlog nor re-admit an
    occurrence that was already admitted."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("a", "* * * * *", grace_ms=MINUTE))
        await backend.run_round()
        clock.advance(MINUTE)
        assert (await backend.run_round()).admitted == 1
        clock.advance(HOUR)
        assert (await backend.run_round()).admitted == 1  # fire_once: the latest only
        high = cursor(db_path, "a")
        clock.advance(-2 * HOUR)
        for _ in range(3):
            assert (await backend.run_round()).admitted == 0
            clock.advance(MINUTE)
        assert cursor(db_path, "a") == high  # the cursor never moves back
        clock.ms = high
        assert (await backend.run_round()).admitted == 1
        keys = query(db_path, "SELECT idempotency_key FROM runs")
        assert len(keys) == len(set(keys)) == 3
    finally:
        await backend.close()


async def test_one_broken_trigger_is_reported_and_does_not_stop_the_round(db_path, clock):
    """One bad row must not stall every other trigger; the failure must reach diagnostics."""
    diagnostics = Diagnostics()
    backend = await open_backend(db_path, clock, diagnostics=diagnostics)
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("a", "* * * * *"))
        await backend.publisher().put_trigger(cron("b", "* * * * *"))
        conn = sqlite3.connect(db_path)
        conn.execute("UPDATE triggers SET kind = 'gone' WHERE trigger_id = 'a'")
        conn.commit()
        conn.close()
        report = await backend.run_round()
        assert (report.errors, report.initialized) == (1, 1)
        (event,) = diagnostics.events
        assert event.code == "scheduler.decide_failed" and event.fields["trigger_id"] == "a"
        assert "gone" in event.message
    finally:
        await backend.close()


async def test_disabled_triggers_and_inactive_projects_never_fire(db_path, clock):
    """Disabling must stop admissions at once, whatever the cursor says."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await seed(backend, project="p2")
        await backend.publisher().put_trigger(cron("off", "* * * * *", enabled=False))
        await backend.publisher().put_trigger(cron("idle", "* * * * *", project="p2"))
        await backend.run_round()
        conn = sqlite3.connect(db_path)
        conn.execute("UPDATE projects SET active = 0 WHERE project_id = 'p2'")
        conn.commit()
        conn.close()
        clock.advance(5 * MINUTE)
        report = await backend.run_round()
        assert (report.scanned, report.admitted) == (0, 0)
        assert runs(db_path) == []
    finally:
        await backend.close()
