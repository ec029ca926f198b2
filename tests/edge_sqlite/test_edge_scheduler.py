"""The scheduler round: decisions committed occurrence by occurrence under a compare-and-set."""

from __future__ import annotations

import asyncio
import sqlite3
import time

from edge_helpers import Diagnostics, cron, open_backend, query, seed
from qinglong.contracts.diagnostics import RoundEvent
from qinglong.host.lifecycle import SchedulerLoop
from qinglong.plugins.edge_sqlite import scheduler_holds, scheduler_read
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


async def test_initialize_then_fire_admits_one_run_with_attempt_and_two_events(db_path, clock, backends):
    """The basic promise: an occurrence becomes exactly one queued Run, one pristine Attempt and
    the run.created/run.queued events, all or nothing."""
    backend = backends.track(await open_backend(db_path, clock))
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
        [(1, "claimed", "local_process", None, None, None)]
    assert query(db_path, "SELECT seq, type FROM run_events WHERE run_id = ? ORDER BY seq",
                 (run_id,)) == [(1, "run.created"), (2, "run.queued")]
    assert query(db_path, "SELECT last_scheduled_at_ms FROM trigger_schedules") == [(due,)]
    assert (await backend.run_round()).admitted == 0


async def test_fire_once_after_an_hour_outage_admits_only_the_latest_and_records_the_rest(db_path, clock, backends):
    """Replaying an hour of backlog after an outage would flood workers; losing the record of what
    was skipped would hide the outage from operators."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await backend.publisher().put_trigger(cron("a", "* * * * *", grace_ms=MINUTE))
    await backend.run_round()
    start = clock.ms
    clock.advance(HOUR + 30_000)
    report = await backend.run_round()
    # skipped counts the skip record this fire_once misfire wrote (RoundReport's meaning)
    assert (report.admitted, report.skipped) == (1, 1)
    assert runs(db_path) == [("a", 1, start + HOUR, clock.ms)]
    assert skips(db_path) == [("a", "fire_once", start + MINUTE, start + HOUR - MINUTE, 59, 1)]
    assert cursor(db_path, "a") == start + HOUR + MINUTE


async def test_skip_policy_admits_nothing_and_records_the_skipped_range(db_path, clock, backends):
    """A skip trigger must never run late work, and the skipped range must be visible."""
    backend = backends.track(await open_backend(db_path, clock))
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


async def test_scan_order_is_uninitialized_first_then_oldest_cursor_then_ids(db_path, clock, backends):
    """The contract's scan order keeps new triggers from waiting behind a backlog and makes both
    profiles serve due schedules in the same order."""
    backend = backends.track(await open_backend(db_path, clock, page_size=2))
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
    # Both uninitialized triggers, none of the due ones, in the first page. Initialized from
    # their publish time, they owe the two minutes since and admit them in the same round.
    assert (first.initialized, first.admitted, first.more_due) == (2, 4, True)
    assert {r[0] for r in runs(db_path)} == {"z-new", "a-new"}
    second = await backend.run_round()
    assert second.admitted >= 2
    # "early" (cursor T0+1min) came before "late" (T0+2min): both were served in the same page.
    assert {r[0] for r in runs(db_path)} == {"early", "late", "z-new", "a-new"}


async def test_a_round_reads_one_page_and_reports_more_due(db_path, clock, backends):
    """An unbounded round would hold the whole table in memory on a small board."""
    backend = backends.track(await open_backend(db_path, clock, page_size=4))
    await seed(backend)
    for i in range(10):
        await backend.publisher().put_trigger(cron(f"tr{i:02d}"))
    reports = [await backend.run_round() for _ in range(3)]
    assert [(r.scanned, r.initialized, r.more_due) for r in reports] == \
        [(4, 4, True), (4, 4, True), (2, 2, False)]
    assert query(db_path, "SELECT count(*) FROM trigger_schedules WHERE next_fire_at_ms IS NULL") == [(0,)]


async def test_backlog_drains_page_by_page_without_starving_a_new_trigger(db_path, clock, backends):
    """Occurrences late but inside the grace must all be admitted, a page at a time, while a
    trigger published meanwhile still gets initialized in the next round."""
    backend = backends.track(await open_backend(db_path, clock, page_size=4))
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


async def test_republish_between_decision_and_commit_admits_nothing_of_the_old_revision(db_path, clock, backends):
    """A stale decision must not create a Run for a revision the operator already replaced."""
    backend = backends.track(await open_backend(db_path, clock))
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


async def test_clock_jumps_forward_misfire_once_and_backward_never_duplicate(db_path, clock, backends):
    """A clock step (NTP, a board without RTC) must neither replay a backlog nor re-admit an
    occurrence that was already admitted."""
    backend = backends.track(await open_backend(db_path, clock))
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


async def test_one_broken_trigger_is_reported_and_does_not_stop_the_round(db_path, clock, backends):
    """One bad row must not stall every other trigger; the failure must reach diagnostics."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, diagnostics=diagnostics))
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
    assert event.code == RoundEvent.UNKNOWN_TRIGGER_KIND and event.fields["trigger_id"] == "a"
    assert event.fields["kind"] == "gone"
    assert "gone" in event.message


async def test_disabled_triggers_and_inactive_projects_never_fire(db_path, clock, backends):
    """Disabling must stop admissions at once, whatever the cursor says."""
    backend = backends.track(await open_backend(db_path, clock))
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


def _make_undecidable(db_path, count: int, kind: str = "gone") -> None:
    """``count`` triggers of a kind no loaded plugin provides (a plugin that was uninstalled), all
    uninitialized and sorting before every other trigger id, written straight into the file."""
    conn = sqlite3.connect(db_path)
    with conn:
        conn.executemany(
            "INSERT INTO triggers (trigger_id, project_id, task_id, trigger_revision, kind, spec_json, "
            "misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms) "
            "VALUES (?, 'p1', 't1', 1, ?, '{}', 'fire_once', 60000, 1, 'sha256:0', 0)",
            [(f"a{i:05d}", kind) for i in range(count)])
        conn.executemany(
            "INSERT INTO trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms, "
            "last_scheduled_at_ms, state_version, updated_at_ms) VALUES (?, 'p1', 1, NULL, NULL, 1, 0)",
            [(f"a{i:05d}",) for i in range(count)])
    conn.close()


async def test_a_page_of_undecidable_triggers_neither_spins_nor_blocks_the_trigger_behind_it(db_path, clock, backends):
    """Without this, a page full of triggers of an uninstalled kind set more_due every round: the
    loop span back-to-back rounds (thousands a second, a log line per row per round) and the
    healthy trigger behind them never got its Run."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, page_size=4, diagnostics=diagnostics))
    await seed(backend)
    await backend.publisher().put_trigger(cron("zz-healthy", "* * * * * *", grace_ms=5_000))
    _make_undecidable(db_path, 40)
    first = await backend.run_round()
    # The scan stepped past all 40 within the round and initialized the healthy trigger.
    assert (first.initialized, first.errors) == (1, 40)
    assert len(diagnostics.events) <= scheduler_holds.DIAGNOSTICS_PER_ROUND + 1
    reported = {e.fields.get("trigger_id") for e in diagnostics.events} - {None}
    assert len(reported) == scheduler_holds.DIAGNOSTICS_PER_ROUND
    diagnostics.events.clear()
    for _ in range(5):
        clock.advance(1_000)
        report = await backend.run_round()
        assert (report.scanned, report.admitted, report.errors, report.more_due) == (1, 1, 0, False)
    assert len(runs(db_path, "zz-healthy")) == 5
    assert diagnostics.events == []
    # When the hold ends they are decided again, fail again, and are held twice as long with
    # one summary, not forty new reports; the healthy trigger is served in the same round.
    clock.ms += scheduler_holds.HOLD_FIRST_MS - 5_000
    report = await backend.run_round()
    assert (report.errors, report.admitted) == (40, 1)
    (summary,) = diagnostics.events
    assert summary.code == "scheduler.undecidable_held" and summary.fields["repeated"] == 40
    diagnostics.events.clear()
    clock.advance(scheduler_holds.HOLD_FIRST_MS)  # still held (for twice the first hold)
    report = await backend.run_round()
    assert (report.errors, report.more_due) == (0, False) and diagnostics.events == []


async def test_a_clock_stepping_back_does_not_stretch_a_hold(db_path, clock, backends):
    """A hold counted on a clock that then stepped back an hour (NTP on a board without RTC) must
    not keep a trigger out of every round for that hour once its cause is gone."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    _make_undecidable(db_path, 1, kind="cron")
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE triggers SET spec_json = '{\"expression\": 7}'")
    conn.close()
    assert (await backend.run_round()).errors == 1
    assert (await backend.run_round()).errors == 0  # held
    clock.advance(-HOUR)
    assert (await backend.run_round()).errors == 1  # decided again, not held for an hour


async def test_a_healthy_trigger_behind_ten_thousand_undecidable_ones_fires_on_time(db_path, clock, backends):
    """A wall of undecidable rows at the front of the due index must cost a bounded number of
    rounds once per hold, and then nothing: otherwise the trigger behind it is delayed by a round
    per page (minutes) and every round reports thousands of errors."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, page_size=32, diagnostics=diagnostics))
    await seed(backend)
    await backend.publisher().put_trigger(cron("zz-healthy", "* * * * * *", grace_ms=1_000))
    _make_undecidable(db_path, 10_000)
    bound = 32 * scheduler_read.SCAN_PAGES_PER_ROUND

    async def drain() -> int:
        back_to_back = 0
        while (await backend.run_round()).more_due:
            back_to_back += 1
            assert back_to_back <= 10_000 // bound + 1
        return back_to_back

    back_to_back = await drain()
    assert cursor(db_path, "zz-healthy") == clock.ms + 1_000
    assert len(diagnostics.events) <= (back_to_back + 1) * (scheduler_holds.DIAGNOSTICS_PER_ROUND + 1)
    for _ in range(3):
        clock.advance(1_000)
        report = await backend.run_round()
        assert (report.admitted, report.errors, report.more_due) == (1, 0, False)
    # The holds end together: deciding them again is again a few back-to-back rounds, and
    # the healthy trigger is not late by a round per page.
    clock.ms = clock.ms // 1000 * 1000 + scheduler_holds.HOLD_FIRST_MS + 300
    due = clock.ms - 300
    await drain()
    assert runs(db_path, "zz-healthy")[-1][2] == due


async def test_rounds_of_a_held_page_follow_the_cadence_not_each_other(db_path, clock, backends):
    """The host loop starts the next round at once when a round says more_due; a page that can
    never be decided must leave the loop at its cadence (the busy loop ran 3,225 rounds in 6 s)."""
    backend = backends.track(await open_backend(db_path, clock, page_size=4))
    await seed(backend)
    _make_undecidable(db_path, 8)
    loop = SchedulerLoop(backend.run_round, cadence_ms=100, diagnostics=Diagnostics())
    started = time.monotonic()
    loop.start()
    deadline = started + 30
    while loop.stats.rounds < 6 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await loop.stop(10)
    elapsed = time.monotonic() - started
    assert loop.stats.rounds >= 6
    # Aligned to the cadence: at most one round per 100 ms, plus the first and the last.
    assert loop.stats.rounds <= elapsed / 0.1 + 2


async def test_a_full_disk_ends_the_round_without_more_due_and_reports_once(small_filesystem, clock, backends):
    """When every commit fails (disk full), trying the rest of the page and starting the next
    round at once only burns the CPU and floods the log; the occurrences must still be admitted
    once there is room again."""
    db_path = small_filesystem / "q.db"
    filler = small_filesystem / "filler"
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, page_size=4, diagnostics=diagnostics))
    await seed(backend)
    for i in range(8):
        await backend.publisher().put_trigger(cron(f"f{i}", "* * * * *", grace_ms=5 * MINUTE))
    while (await backend.run_round()).more_due:
        pass
    clock.advance(MINUTE)
    diagnostics.events.clear()

    def fill_the_disk(conn: sqlite3.Connection) -> None:
        # An empty WAL: the next commit must grow it, on a file system with no room left.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with open(filler, "wb", buffering=0) as out:
            try:
                while True:
                    out.write(b"\0" * 4096)
            except OSError:
                pass

    report = await backend.run_round(before_commit=fill_the_disk)
    assert (report.admitted, report.errors, report.more_due) == (0, 1, False)
    (event,) = diagnostics.events
    assert event.code == "scheduler.store_failed" and "full" in event.message
    assert str(db_path) in event.message
    clock.advance(1_000)
    report = await backend.run_round()
    assert (report.admitted, report.more_due) == (0, False)
    assert [e.code for e in diagnostics.events] == ["scheduler.store_failed"]  # rate-limited
    filler.unlink()
    clock.advance(1_000)
    admitted = 0
    while True:
        report = await backend.run_round()
        admitted += report.admitted
        if not report.more_due:
            break
    assert admitted == 8 and len(runs(db_path)) == 8


async def test_a_constraint_refusing_one_commit_holds_that_trigger_and_serves_the_others(db_path, clock, backends):
    """A row whose commit a constraint refuses (here a Run already holding its idempotency key)
    fails the same way every round; it must not stop the page, nor be retried and reported every
    round."""
    diagnostics = Diagnostics()
    backend = backends.track(await open_backend(db_path, clock, diagnostics=diagnostics))
    await seed(backend)
    await backend.publisher().put_trigger(cron("a", "* * * * *"))
    await backend.publisher().put_trigger(cron("b", "* * * * *"))
    await backend.run_round()
    due = clock.ms + MINUTE
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
                     "task_revision, task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, "
                     "state, idempotency_key) VALUES ('x', 'p1', 'a', 1, 't1', 1, 'd', ?, 0, 0, "
                     "'succeeded', ?)", (due, f"ql3:cron:v1:a:1:{due}"))
    conn.close()
    clock.advance(MINUTE)
    diagnostics.events.clear()
    report = await backend.run_round()
    assert (report.admitted, report.errors, report.more_due) == (1, 1, False)
    (event,) = diagnostics.events
    assert event.code == "scheduler.commit_failed" and event.fields["trigger_id"] == "a"
    clock.advance(1_000)
    report = await backend.run_round()
    assert (report.errors, report.scanned) == (0, 0)


async def test_a_trigger_published_just_before_its_occurrence_fires_it(db_path, clock, backends):
    """A daily job edited at 01:59:59.7 must still run at 02:00: initializing from the first round
    (02:00:00.3) instead of from the publish skipped that day's run."""
    two_am = 1_700_013_600_000  # 2023-11-15T02:00:00Z
    clock.ms = two_am - 300
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await backend.publisher().put_trigger(cron("daily", "0 2 * * *"))
    clock.ms = two_am + 300
    report = await backend.run_round()
    assert (report.initialized, report.admitted, report.more_due) == (1, 1, False)
    assert runs(db_path) == [("daily", 1, two_am, two_am + 300)]
    assert cursor(db_path, "daily") == two_am + 24 * HOUR
    # Republished (a new revision) at 01:59:59.7 the next day: the same.
    clock.ms = two_am + 24 * HOUR - 300
    await backend.publisher().put_trigger(cron("daily", "0 2 * * *", grace_ms=2 * MINUTE))
    clock.ms = two_am + 24 * HOUR + 300
    report = await backend.run_round()
    assert (report.initialized, report.admitted) == (1, 1)
    assert runs(db_path)[-1] == ("daily", 2, two_am + 24 * HOUR, clock.ms)


async def test_an_occurrence_owed_since_the_publish_follows_the_misfire_policy(db_path, clock, backends):
    """An initialization that is already late by more than the grace must misfire as the policy
    says (skip: recorded, no Run), in the same round, not fire late work nor wait a round."""
    clock.ms = 1_700_013_600_000 - 300
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await backend.publisher().put_trigger(cron("s", "0 2 * * *", policy="skip", grace_ms=5_000))
    clock.advance(HOUR)
    report = await backend.run_round()
    assert (report.initialized, report.admitted, report.skipped) == (1, 0, 1)
    assert runs(db_path) == [] and len(skips(db_path)) == 1
    assert cursor(db_path, "s") > clock.ms
