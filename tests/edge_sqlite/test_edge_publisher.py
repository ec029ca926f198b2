"""Publisher: bad input writes nothing; revisions move only when content changes and reset cursors."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from edge_helpers import cron, dump, open_backend, query, seed
from qinglong.contracts.errors import (
    AlreadyExists,
    NotFound,
    TriggerSpecError,
    UnknownTriggerKind,
    UserError,
)
from qinglong.contracts.records import TriggerDefinition
from qinglong.plugins.edge_sqlite import migrations
from tests.support.aio import closing


@pytest.mark.parametrize(
    "definition, error, message",
    [
        (cron("bad", "61 * * * *"), TriggerSpecError, "expression"),
        (cron("bad", "* * *"), TriggerSpecError, "3 fields"),
        (cron("bad", timezone="Mars/Olympus"), TriggerSpecError, "Mars/Olympus"),
        (cron("bad", grace_ms=-1), TriggerSpecError, "misfire_grace_ms"),
        (cron("bad", policy="sometimes"), UserError, "misfire_policy"),
        (cron("bad", task="nope"), NotFound, "task 'nope'"),
        (cron("bad", project="ghost"), NotFound, "project 'ghost'"),
        (cron("bad:id"), UserError, "trigger_id"),
        (TriggerDefinition("p1", "bad", "t1", "interval", {"seconds": 5}), UnknownTriggerKind, "interval"),
    ],
    ids=["cron-range", "cron-fields", "zone", "negative-grace", "policy", "unknown-task",
         "unknown-project", "identifier", "unknown-kind"],
)
async def test_refused_trigger_writes_nothing(db_path, clock, definition, error, message, backends):
    """A refused publish that still wrote a head or a cursor would fire a trigger nobody accepted."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await backend.publisher().put_trigger(cron("good"))
    before = dump(db_path)
    with pytest.raises(error, match=message):
        await backend.publisher().put_trigger(definition)
    assert dump(db_path) == before


async def test_refused_project_and_task_writes_nothing(db_path, clock, backends):
    """Duplicates and tasks of unknown projects must be refused whole, not half-written."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    before = dump(db_path)
    with pytest.raises(AlreadyExists, match="p1"):
        await backend.publisher().create_project("p1")
    with pytest.raises(NotFound, match="ghost"):
        await backend.publisher().put_task("ghost", "t1", {})
    with pytest.raises(UserError, match="JSON"):
        await backend.publisher().put_task("p1", "t2", {"x": object()})
    with pytest.raises(NotFound, match="t9"):
        await backend.publisher().delete_trigger("p1", "t9")
    assert dump(db_path) == before


async def test_trigger_ids_are_unique_across_projects(db_path, clock, backends):
    """The idempotency key names no project: two projects sharing a trigger id would share keys."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await seed(backend, project="p2")
    await backend.publisher().put_trigger(cron("shared"))
    with pytest.raises(AlreadyExists, match="p1"):
        await backend.publisher().put_trigger(cron("shared", project="p2"))


async def test_unchanged_publish_keeps_revision_and_cursor(db_path, clock, backends):
    """Re-publishing the same definition (a deploy that changed nothing) must not reset a cursor,
    which would drop or shift occurrences."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    first = await backend.publisher().put_trigger(cron("a", "*/5 * * * *"))
    await backend.run_round()
    cursor = query(db_path, "SELECT * FROM trigger_schedules")
    again = await backend.publisher().put_trigger(
        cron("a", "*/5  *  * * *"))  # the same expression, spaced differently
    assert again == first
    assert query(db_path, "SELECT * FROM trigger_schedules") == cursor
    assert query(db_path, "SELECT count(*) FROM triggers") == [(1,)]


async def test_new_revision_resets_cursor_and_bumps_state_version(db_path, clock, backends):
    """A changed trigger must not keep firing on its old cursor; a stale decision must miss."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await backend.publisher().put_trigger(cron("a", "*/5 * * * *"))
    await backend.run_round()
    (rev, nxt, version), = query(db_path, "SELECT trigger_revision, next_fire_at_ms, state_version "
                                          "FROM trigger_schedules")
    assert (rev, nxt is not None) == (1, True)
    head = await backend.publisher().put_trigger(cron("a", "*/10 * * * *"))
    assert head.trigger_revision == 2
    assert query(db_path, "SELECT trigger_revision, next_fire_at_ms, last_scheduled_at_ms, "
                          "state_version FROM trigger_schedules") == [(2, None, None, version + 1)]
    disabled = await backend.publisher().set_trigger_enabled("p1", "a", False)
    assert (disabled.trigger_revision, disabled.enabled) == (3, False)
    same = await backend.publisher().set_trigger_enabled("p1", "a", False)
    assert same == disabled


async def test_task_revisions_are_kept_and_only_change_with_payload(db_path, clock, backends):
    """Runs pin a task revision; losing old revisions or bumping on no change breaks that pin."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    same = await backend.publisher().put_task("p1", "t1", {"command": ["echo", "hello"]})
    assert same.task_revision == 1
    new = await backend.publisher().put_task("p1", "t1", {"command": ["echo", "bye"]})
    assert new.task_revision == 2 and new.content_digest != same.content_digest
    assert query(db_path, "SELECT task_revision FROM task_revisions ORDER BY 1") == [(1,), (2,)]


async def test_delete_trigger_removes_schedule_and_keeps_runs(db_path, clock, backends):
    """Deleting a trigger must stop it firing but keep its history of Runs."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await backend.publisher().put_trigger(cron("a", "* * * * *"))
    await backend.run_round()
    clock.advance(60_000)
    assert (await backend.run_round()).admitted == 1
    await backend.publisher().delete_trigger("p1", "a")
    assert query(db_path, "SELECT count(*) FROM trigger_schedules") == [(0,)]
    assert query(db_path, "SELECT count(*) FROM runs") == [(1,)]
    clock.advance(60_000)
    assert (await backend.run_round()).admitted == 0


async def test_reader_returns_contract_records(db_path, clock, backends):
    """The CLI shows what the reader returns; wrong records would mislead an operator."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    head = await backend.publisher().put_trigger(cron("a", "* * * * *"))
    reader = backend.reader()
    assert [p.project_id for p in await reader.list_projects()] == ["p1"]
    assert await reader.list_triggers() == [head]
    assert await reader.list_triggers("other") == []
    await backend.run_round()
    clock.advance(60_000)
    await backend.run_round()
    (run,) = await reader.recent_runs()
    assert run.lag_ms == 0 and run.idempotency_key == f"ql3:cron:v1:a:1:{clock.ms}"
    (schedule,) = await reader.list_schedules()
    assert schedule.next_fire_at_ms == clock.ms + 60_000
    assert await reader.recent_skips() == []


@pytest.mark.parametrize("grace_ms", [0, 500, 1_000])
async def test_skip_with_a_grace_not_above_the_cadence_is_refused_and_writes_nothing(db_path, clock, grace_ms, backends):
    """A 'skip' trigger whose grace is at or below the cadence skips on-time occurrences, which
    are observed up to a cadence late: it would never fire, in silence."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    before = dump(db_path)
    with pytest.raises(TriggerSpecError, match=rf"'quiet'.*{grace_ms} ms.*cadence \(1000 ms\)"):
        await backend.publisher().put_trigger(cron("quiet", policy="skip", grace_ms=grace_ms))
    assert dump(db_path) == before
    head = await backend.publisher().put_trigger(cron("quiet", policy="skip", grace_ms=1_001))
    assert head.misfire_grace_ms == 1_001
    fire_once = await backend.publisher().put_trigger(cron("other", grace_ms=grace_ms))
    assert fire_once.misfire_grace_ms == grace_ms


async def test_enabling_a_stored_skip_trigger_below_the_cadence_is_refused(db_path, clock, backends):
    """A head stored before the floor was enforced must not be switched on to skip in silence."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    await backend.publisher().put_trigger(cron("old", policy="skip", grace_ms=5_000,
                                               enabled=False))
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE triggers SET misfire_grace_ms = 200 WHERE trigger_id = 'old'")
    conn.close()
    before = dump(db_path)
    with pytest.raises(TriggerSpecError, match="'old'.*200 ms"):
        await backend.publisher().set_trigger_enabled("p1", "old", True)
    assert dump(db_path) == before


async def test_a_trigger_deleted_and_created_again_never_reuses_a_revision(db_path, clock, backends):
    """Restarting at revision 1 would make (trigger_id, trigger_revision) name two definitions:
    old Runs would mix with new ones, and the new revision's idempotency keys would collide with
    the old Runs' (its occurrences refused for ever)."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    publisher = backend.publisher()
    await publisher.put_trigger(cron("a", "* * * * *"))
    await publisher.put_trigger(cron("a", "*/1 * * * *", grace_ms=30_000))
    await backend.run_round()
    clock.advance(60_000)
    assert (await backend.run_round()).admitted == 1
    await publisher.delete_trigger("p1", "a")
    again = await publisher.put_trigger(cron("a", "* * * * *"))
    assert again.trigger_revision == 3
    await publisher.delete_trigger("p1", "a")
    await seed(backend, project="p2")
    elsewhere = await publisher.put_trigger(cron("a", "* * * * *", project="p2"))
    assert elsewhere.trigger_revision == 4
    toggled = await publisher.set_trigger_enabled("p2", "a", False)
    assert toggled.trigger_revision == 5
    await publisher.set_trigger_enabled("p2", "a", True)
    await backend.run_round()
    clock.advance(60_000)
    assert (await backend.run_round()).admitted == 1
    assert query(db_path, "SELECT trigger_revision FROM runs ORDER BY rowid") == [(2,), (6,)]


def _database_of_version(path, count: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    try:
        migrations.apply_pending(conn, migrations.load_migrations()[:count], str(path), 0)
    finally:
        conn.close()


async def test_an_upgraded_database_continues_the_revisions_of_deleted_triggers(db_path, clock, backends):
    """A trigger deleted before the upgrade left only its Runs and skipped ranges; its next
    revision must still be above theirs."""
    _database_of_version(db_path, 2)
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
                     "task_revision, task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, "
                     "state, idempotency_key) VALUES ('r', 'p1', 'gone', 7, 't1', 1, 'd', 0, 0, 0, "
                     "'succeeded', 'ql3:cron:v1:gone:7:0')")
        conn.execute("INSERT INTO schedule_skips (project_id, trigger_id, trigger_revision, policy, "
                     "first_skipped_ms, last_skipped_ms, count, count_exact, recorded_at_ms) "
                     "VALUES ('p1', 'skipped', 4, 'skip', 0, 0, 1, 1, 0)")
    conn.close()
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    assert (await backend.publisher().put_trigger(cron("gone"))).trigger_revision == 8
    assert (await backend.publisher().put_trigger(cron("skipped"))).trigger_revision == 5
    assert (await backend.publisher().put_trigger(cron("new"))).trigger_revision == 1


async def test_a_task_head_can_never_name_a_missing_revision(db_path, clock):
    """A head naming a revision that is not stored pins Runs to a task nobody can read back; it
    must be impossible, not a silent miss found later."""
    backend = await open_backend(db_path, clock)
    async with closing(backend):
        await seed(backend)
        await backend.publisher().put_task("p1", "t1", {"command": ["echo", "bye"]})
    for drift in ("UPDATE tasks SET task_revision = 9",
                  "UPDATE tasks SET content_digest = 'sha256:0'",
                  "DELETE FROM task_revisions WHERE task_revision = 2",
                  "INSERT INTO tasks (project_id, task_id, task_revision, payload_json, content_digest, "
                  "updated_at_ms) VALUES ('p1', 't9', 1, '{}', 'sha256:0', 0)"):
        conn = sqlite3.connect(db_path)
        conn.execute("PRAGMA foreign_keys = ON")
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            with conn:
                conn.execute(drift)
        conn.close()
    assert query(db_path, "SELECT task_revision FROM tasks") == [(2,)]


async def test_an_upgrade_restores_a_missing_head_revision_from_the_head(db_path, clock, backends):
    """A database whose head already names a missing revision must migrate (not fail on the new
    key) and keep scheduling with the head's content as that revision."""
    _database_of_version(db_path, 2)
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO projects VALUES ('p1', 'p1', 1, 0)")
        conn.execute("INSERT INTO tasks VALUES ('p1', 't1', 3, '{\"command\":[\"true\"]}', 'sha256:3', 0)")
        conn.execute("INSERT INTO task_revisions VALUES ('p1', 't1', 1, '{}', 'sha256:1', 0)")
    conn.close()
    backend = backends.track(await open_backend(db_path, clock))
    assert query(db_path, "SELECT task_revision, content_digest FROM task_revisions "
                          "ORDER BY 1") == [(1, "sha256:1"), (3, "sha256:3")]
    await backend.publisher().put_trigger(cron("a", "* * * * *"))
    await backend.run_round()
    clock.advance(60_000)
    assert (await backend.run_round()).admitted == 1
    assert (await backend.recover()).pristine_queued == 1


async def test_schedules_show_their_publish_time_and_status_follows_the_owner_lock(db_path, clock, backends):
    """Without the publish time a schedule shows no next fire time until a scheduler ran; without
    the owner lock a reader cannot tell a stopped scheduler (whose lag is not growing) from a
    running one."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    published = clock.ms
    await backend.publisher().put_trigger(cron("a", "* * * * *"))
    await backend.publisher().put_trigger(cron("b", "* * * * *"))
    reader = backend.reader()
    views = await reader.list_schedules()
    assert [(v.trigger_id, v.next_fire_at_ms, v.published_at_ms) for v in views] == \
        [("a", None, published), ("b", None, published)]
    assert [v.trigger_id for v in await reader.list_schedules(limit=1)] == ["a"]
    assert [h.trigger_id for h in await reader.list_triggers(limit=1)] == ["a"]
    assert [h.trigger_id for h in await reader.list_triggers("p1", limit=1)] == ["a"]
    clock.advance(5_000)
    await backend.publisher().put_trigger(cron("a", "*/2 * * * *"))
    (view, _) = await reader.list_schedules()
    assert (view.trigger_revision, view.published_at_ms) == (2, clock.ms)
    stopped = await reader.scheduler_status()
    assert (stopped.running, stopped.last_round_at_ms, stopped.replicas) == (False, None, 0)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OWNER_LOCK, str(db_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        running = await reader.scheduler_status()
        assert (running.running, running.last_round_at_ms, running.replicas) == (True, None, 1)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not (await reader.scheduler_status()).running


#: A child that takes the owner lock as 'qinglong run' does, says so, and holds it until stdin closes.
HOLD_OWNER_LOCK = """
import sys
from qinglong.plugins.edge_sqlite.store import OwnerLock
lock = OwnerLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
"""
