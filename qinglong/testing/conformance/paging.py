"""The paging suite: the schedules listing pages with a keyset cursor alike on every backend (ours:
SQLite, PostgreSQL 18 and 15): every schedule exactly once across pages, in the due order, whatever
the page size. Run like :mod:`.store`."""

from __future__ import annotations

import pytest

from qinglong.contracts.errors import UserError
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

SECOND = 1000


def _trigger(trigger_id: str, project: str, expression: str) -> TriggerDefinition:
    return TriggerDefinition(project, trigger_id, "t1", "cron", {"expression": expression},
                             MisfirePolicy.FIRE_ONCE, 60_000)


async def _pages(reader, size: int, *, as_tuple: bool) -> list:
    listed, after = [], None
    while True:
        page = await reader.list_schedules(size, after=after)
        assert len(page) <= size
        listed.extend(page)
        if len(page) < size:
            return listed
        last = page[-1]
        after = (last.next_fire_at_ms, last.project_id, last.trigger_id) if as_tuple else last


async def test_paging_lists_every_schedule_exactly_once_in_the_due_order(harness):
    """A cursor that skipped or repeated rows at a page boundary (between the schedules awaiting
    initialization and the initialized ones, between equal fire times, between projects) would
    hide a schedule from, or show it twice to, an operator paging through a large store."""
    for project in ("pb", "pa"):
        await harness.publisher.create_project(project)
        await harness.publisher.put_task(project, "t1", {"command": ["true"]})
    expressions = ("0 0 1 1 *", "0 12 * * *", "*/5 * * * *")
    for i in range(7):
        await harness.publisher.put_trigger(_trigger(f"a{i}", "pa", expressions[i % 3]))
        await harness.publisher.put_trigger(_trigger(f"b{i}", "pb", expressions[i % 3]))
    report = await harness.run_round()  # initializes every cursor
    assert report.initialized == 14, report
    for i in (1, 4):  # republished: awaiting initialization again, so listed first
        await harness.publisher.put_trigger(_trigger(f"b{i}", "pb", "0 6 * * *"))
    await harness.publisher.put_trigger(_trigger("a9", "pa", "0 3 * * *"))

    whole = await harness.reader.list_schedules()
    assert len(whole) == 15
    keys = [(s.next_fire_at_ms is not None, s.next_fire_at_ms or 0, s.project_id, s.trigger_id)
            for s in whole]
    assert keys == sorted(keys)
    assert [s.trigger_id for s in whole[:3]] == ["a9", "b1", "b4"]
    for size in (1, 2, 3, 5, 14, 15, 16):
        for as_tuple in (False, True):
            paged = await _pages(harness.reader, size, as_tuple=as_tuple)
            assert [s.trigger_id for s in paged] == [s.trigger_id for s in whole], (size, as_tuple)
    last = whole[-1]
    assert await harness.reader.list_schedules(5, after=last) == []


async def test_an_invalid_cursor_is_refused_with_what_was_expected(harness):
    """A malformed cursor silently read as 'from the start' would list the first page again and
    again to a caller paging on."""
    for bad in ((1, "p"), ("x", "p", "t"), (True, "p", "t"), "p/t", (None, 1, "t")):
        with pytest.raises(UserError, match="invalid schedule cursor"):
            await harness.reader.list_schedules(5, after=bad)


#: What ``from qinglong.testing.conformance.paging import *`` brings into a test module: the tests.
__all__ = sorted(name for name in dict(globals()) if name.startswith("test_"))
