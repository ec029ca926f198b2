"""Applying a project's desired state, and deleting tasks and projects, on every backend.

One transaction per project: a plan is applied whole or not at all; applying the same state
twice writes nothing and makes no new revision; a pruned task's Runs stay; a dry run writes
nothing. Each test runs on SQLite, PostgreSQL 18 and PostgreSQL 15.
"""

from __future__ import annotations

import pytest

from qinglong.contracts.apply import (
    STORED,
    ChangeAction,
    DesiredProject,
    ObjectKind,
    PlanRefused,
    ProjectState,
)
from qinglong.contracts.errors import NotFound, UserError
from qinglong.contracts.records import MisfirePolicy, TriggerDefinition


def _payload(command: str = "true", **extra) -> dict:
    """A payload as `task put` states it (the publisher stores what it is given)."""
    payload = {"command": ["/bin/sh", "-c", command], "timeout_ms": 60_000,
               "concurrency": {"mode": "allow"}, "idempotent": False, "labels": [],
               "log_limit_bytes": 4096, "executor": "local_process",
               "retry": {"max_attempts": 1, "initial_backoff_ms": 10000, "max_backoff_ms": 600000,
                         "jitter": 0.5, "on_timeout": True}}
    payload.update(extra)
    return payload


def _trigger(project: str, trigger_id: str, task: str, expression: str = "*/5 * * * *",
             enabled: bool = True) -> TriggerDefinition:
    return TriggerDefinition(project, trigger_id, task, "cron", {"expression": expression},
                             MisfirePolicy.FIRE_ONCE, 60_000, enabled)


def _desired(project: str = "ops", *, name: str | None = "Operations", tasks=None, triggers=None):
    tasks = {"backup": _payload("backup"), "report": _payload("report")} if tasks is None else tasks
    if triggers is None:
        triggers = {f"{project}-nightly": _trigger(project, f"{project}-nightly", "backup", "30 2 * * *"),
                    f"{project}-hourly": _trigger(project, f"{project}-hourly", "report", "0 * * * *")}
    return DesiredProject(project, name, tasks, triggers)


def _actions(plan) -> set[tuple[str, str, str]]:
    return {(c.action.value, c.kind.value, c.object_id) for c in plan.changes}


async def _digests(publisher, project: str) -> dict:
    state = await publisher.project_state(project)
    return {"exists": state.exists, "name": state.name,
            "tasks": {k: (v.task_revision, v.content_digest) for k, v in state.tasks.items()},
            "triggers": {k: (v.trigger_revision, v.content_digest) for k, v in state.triggers.items()}}


async def test_applying_the_same_project_twice_writes_no_new_revision(harness):
    """A second apply of the same file must be a no-op: a new revision would reset every
    schedule cursor (a trigger republished on each CI run would lose its owed occurrence)."""
    pub = harness.publisher
    first = await pub.apply_project(_desired())
    assert _actions(first) == {("create", "project", "ops"), ("create", "task", "backup"),
                               ("create", "task", "report"), ("create", "trigger", "ops-nightly"),
                               ("create", "trigger", "ops-hourly")}
    before = await _digests(pub, "ops")
    second = await pub.apply_project(_desired())
    assert not second.writes
    assert {c.action for c in second.changes} == {ChangeAction.UNCHANGED}
    assert await _digests(pub, "ops") == before
    assert before["name"] == "Operations"
    assert [p.project_id for p in await harness.reader.list_projects()] == ["ops"]


async def test_an_update_names_the_changed_fields_and_makes_one_new_revision(harness):
    """An edited task or trigger gets exactly one new revision, and the plan says what changed
    without any value (an env value is a secret): a wrong plan would hide what an apply does."""
    pub = harness.publisher
    await pub.apply_project(_desired(tasks={"backup": _payload("backup", env={"TOKEN": "Xq1-first"}),
                                            "report": _payload("report")}))
    plan = await pub.apply_project(_desired(
        name="Ops", tasks={"backup": _payload("backup", env={"TOKEN": "Xq2-second"}, timeout_ms=120_000),
                           "report": _payload("report")},
        triggers={"ops-nightly": _trigger("ops", "ops-nightly", "backup", "45 2 * * *"),
                  "ops-hourly": _trigger("ops", "ops-hourly", "report", "0 * * * *", enabled=False)}))
    updates = {(c.kind.value, c.object_id): c for c in plan.changes if c.action is ChangeAction.UPDATE}
    assert set(updates) == {("project", "ops"), ("task", "backup"), ("trigger", "ops-nightly"),
                            ("trigger", "ops-hourly")}
    assert updates[("task", "backup")].fields == ("env.TOKEN", "timeout_ms")
    assert updates[("trigger", "ops-nightly")].fields == ("spec",)
    assert updates[("trigger", "ops-hourly")].fields == ("enabled",)
    assert "Xq" not in repr(plan.to_json()) and "Xq" not in repr(plan)
    state = await _digests(pub, "ops")
    assert state["tasks"]["backup"][0] == 2 and state["tasks"]["report"][0] == 1
    assert state["triggers"]["ops-nightly"][0] == 2 and state["name"] == "Ops"


async def test_prune_deletes_what_the_file_does_not_name_and_keeps_runs(harness):
    """``--prune`` removes triggers and tasks the file no longer has; the deleted task's Runs
    stay as history (losing them would erase what ran), and a deleted trigger stops firing."""
    pub = harness.publisher
    await pub.apply_project(_desired(triggers={"ops-tick": _trigger("ops", "ops-tick", "report", "* * * * * *")}))
    await harness.run_round()          # initialize
    await harness.elapse(2000)
    await harness.run_round()          # admit at least one Run of the task about to go
    runs_before = harness.count("runs", "ops-tick")
    assert runs_before >= 1
    plan = await pub.apply_project(_desired(tasks={"backup": _payload("backup")}, triggers={}),
                                   prune=True)
    assert _actions(plan) >= {("delete", "trigger", "ops-tick"), ("delete", "task", "report")}
    state = await pub.project_state("ops")
    assert set(state.tasks) == {"backup"} and state.triggers == {}
    assert harness.count("runs", "ops-tick") == runs_before
    await harness.elapse(2000)
    await harness.run_round()
    assert harness.count("runs", "ops-tick") == runs_before
    # published again, the deleted task continues its revisions instead of repeating one
    again = await pub.put_task("ops", "report", _payload("report"))
    assert again.task_revision == 2


async def test_without_prune_nothing_is_deleted(harness):
    """An apply without ``--prune`` must never delete: a partial file (one team's tasks) would
    otherwise wipe everything else in the project."""
    pub = harness.publisher
    await pub.apply_project(_desired())
    plan = await pub.apply_project(_desired(tasks={"backup": _payload("backup")},
                                            triggers={"ops-nightly": _trigger("ops", "ops-nightly", "backup", "30 2 * * *")}))
    assert not any(c.action is ChangeAction.DELETE for c in plan.changes)
    state = await pub.project_state("ops")
    assert set(state.tasks) == {"backup", "report"} and set(state.triggers) == {"ops-nightly", "ops-hourly"}


async def test_a_refusal_in_the_middle_of_a_plan_writes_nothing_of_the_project(harness):
    """The trigger id is another project's (found only inside the transaction, after the tasks
    were written): the whole project rolls back, so no half-applied file is left behind."""
    pub = harness.publisher
    await pub.apply_project(_desired("other", triggers={"shared-id": _trigger("other", "shared-id", "backup")}))
    with pytest.raises(PlanRefused) as refused:
        await pub.apply_project(_desired(triggers={"shared-id": _trigger("ops", "shared-id", "backup")}))
    assert refused.value.kind is ObjectKind.TRIGGER and refused.value.object_id == "shared-id"
    assert "project 'other'" in str(refused.value)
    assert await pub.project_state("ops") == ProjectState.absent("ops")
    assert [p.project_id for p in await harness.reader.list_projects()] == ["other"]


async def test_a_dry_run_returns_the_plan_and_writes_nothing(harness):
    """``--dry-run`` must show exactly what an apply would do and leave the store as it was."""
    pub = harness.publisher
    await pub.apply_project(_desired(tasks={"backup": _payload("backup")},
                                     triggers={"ops-nightly": _trigger("ops", "ops-nightly", "backup")}))
    before = await _digests(pub, "ops")
    plan = await pub.apply_project(_desired(), dry_run=True, prune=True)
    assert plan.writes and ("create", "task", "report") in _actions(plan)
    assert await _digests(pub, "ops") == before
    gone = await pub.delete_project("ops", dry_run=True)
    assert ("delete", "project", "ops") in _actions(gone)
    assert await _digests(pub, "ops") == before


async def test_stored_env_values_keep_what_the_store_holds(harness):
    """An exported file names a secret as 'stored:' instead of its value; applying it must keep
    the stored value exactly (same digest), and refuse a variable that is not stored."""
    pub = harness.publisher
    await pub.apply_project(_desired(tasks={"backup": _payload("backup", env={"TOKEN": "s3cret"})},
                                     triggers={}))
    before = await _digests(pub, "ops")
    plan = await pub.apply_project(_desired(tasks={"backup": _payload("backup", env={"TOKEN": STORED})},
                                            triggers={}))
    assert not plan.writes and await _digests(pub, "ops") == before
    with pytest.raises(PlanRefused) as refused:
        await pub.apply_project(_desired(tasks={"backup": _payload("backup", env={"OTHER": STORED})},
                                         triggers={}))
    assert refused.value.key == "env.OTHER"
    assert await _digests(pub, "ops") == before


async def test_deleting_a_project_removes_it_and_creating_it_again_starts_empty(harness):
    """A deleted project must not be listed, scheduled or published into; its id can be created
    again, empty, and its Runs stay."""
    pub = harness.publisher
    await pub.apply_project(_desired())
    plan = await pub.delete_project("ops")
    assert [c.kind for c in plan.changes if c.action is ChangeAction.DELETE].count(ObjectKind.TRIGGER) == 2
    assert await harness.reader.list_projects() == []
    assert (await pub.project_state("ops")).exists is False
    with pytest.raises(NotFound):
        await pub.put_task("ops", "backup", _payload("backup"))
    record = await pub.create_project("ops", "Again")
    assert record.active and (await pub.project_state("ops")).tasks == {}
    assert (await pub.delete_project("missing")).changes == ()


async def test_delete_task_is_refused_while_a_trigger_runs_it(harness):
    """Deleting a task under a live trigger would leave the trigger firing a task that is gone."""
    pub = harness.publisher
    await pub.apply_project(_desired())
    with pytest.raises(UserError, match="ops-nightly"):
        await pub.delete_task("ops", "backup")
    await pub.delete_trigger("ops", "ops-nightly")
    await pub.delete_task("ops", "backup")
    assert set((await pub.project_state("ops")).tasks) == {"report"}
    with pytest.raises(NotFound):
        await pub.delete_task("ops", "backup")
    with pytest.raises(NotFound):
        await pub.put_trigger(_trigger("ops", "ops-nightly", "backup"))
