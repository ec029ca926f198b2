"""Publisher: bad input writes nothing; revisions move only when content changes and reset cursors."""

from __future__ import annotations

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
async def test_refused_trigger_writes_nothing(db_path, clock, definition, error, message):
    """A refused publish that still wrote a head or a cursor would fire a trigger nobody accepted."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("good"))
        before = dump(db_path)
        with pytest.raises(error, match=message):
            await backend.publisher().put_trigger(definition)
        assert dump(db_path) == before
    finally:
        await backend.close()


async def test_refused_project_and_task_writes_nothing(db_path, clock):
    """Duplicates and tasks of unknown projects must be refused whole, not half-written."""
    backend = await open_backend(db_path, clock)
    try:
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
    finally:
        await backend.close()


async def test_trigger_ids_are_unique_across_projects(db_path, clock):
    """The idempotency key names no project: two projects sharing a trigger id would share keys."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        await seed(backend, project="p2")
        await backend.publisher().put_trigger(cron("shared"))
        with pytest.raises(AlreadyExists, match="p1"):
            await backend.publisher().put_trigger(cron("shared", project="p2"))
    finally:
        await backend.close()


async def test_unchanged_publish_keeps_revision_and_cursor(db_path, clock):
    """Re-publishing the same definition (a deploy that changed nothing) must not reset a cursor,
    which would drop or shift occurrences."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        first = await backend.publisher().put_trigger(cron("a", "*/5 * * * *"))
        await backend.run_round()
        cursor = query(db_path, "SELECT * FROM trigger_schedules")
        again = await backend.publisher().put_trigger(
            cron("a", "*/5  *  * * *"))  # the same expression, spaced differently
        assert again == first
        assert query(db_path, "SELECT * FROM trigger_schedules") == cursor
        assert query(db_path, "SELECT count(*) FROM triggers") == [(1,)]
    finally:
        await backend.close()


async def test_new_revision_resets_cursor_and_bumps_state_version(db_path, clock):
    """A changed trigger must not keep firing on its old cursor; a stale decision must miss."""
    backend = await open_backend(db_path, clock)
    try:
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
    finally:
        await backend.close()


async def test_task_revisions_are_kept_and_only_change_with_payload(db_path, clock):
    """Runs pin a task revision; losing old revisions or bumping on no change breaks that pin."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        same = await backend.publisher().put_task("p1", "t1", {"command": ["echo", "hello"]})
        assert same.task_revision == 1
        new = await backend.publisher().put_task("p1", "t1", {"command": ["echo", "bye"]})
        assert new.task_revision == 2 and new.content_digest != same.content_digest
        assert query(db_path, "SELECT task_revision FROM task_revisions ORDER BY 1") == [(1,), (2,)]
    finally:
        await backend.close()


async def test_delete_trigger_removes_schedule_and_keeps_runs(db_path, clock):
    """Deleting a trigger must stop it firing but keep its history of Runs."""
    backend = await open_backend(db_path, clock)
    try:
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
    finally:
        await backend.close()


async def test_reader_returns_contract_records(db_path, clock):
    """The CLI shows what the reader returns; wrong records would mislead an operator."""
    backend = await open_backend(db_path, clock)
    try:
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
    finally:
        await backend.close()
