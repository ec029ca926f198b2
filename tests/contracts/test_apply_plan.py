"""Properties of the pure plan function every store applies (``contracts.apply.plan_project``).

If a plan did not reach the desired state, or planned a change against the state it reached,
``qinglong apply`` would publish a new revision on every run (resetting schedules) or leave the
store differing from the file while reporting success.
"""

from __future__ import annotations

import string

from hypothesis import given, strategies as st

from qinglong.contracts.apply import (
    ChangeAction,
    DesiredProject,
    ProjectState,
    apply_plan_to_state,
    plan_project,
)
from qinglong.contracts.records import (
    MisfirePolicy,
    TaskRecord,
    TriggerDefinition,
    TriggerHead,
    content_digest,
    trigger_content_digest,
)

IDS = st.sampled_from(list(string.ascii_lowercase[:6]))
PAYLOADS = st.fixed_dictionaries({"command": st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2),
                                  "timeout_ms": st.sampled_from([1000, 2000])})


@st.composite
def desired(draw):
    tasks = draw(st.dictionaries(IDS, PAYLOADS, max_size=4))
    triggers = {}
    if tasks:
        for trigger_id in draw(st.lists(IDS, unique=True, max_size=4)):
            triggers[f"t-{trigger_id}"] = TriggerDefinition(
                "p", f"t-{trigger_id}", draw(st.sampled_from(sorted(tasks))), "cron",
                {"expression": draw(st.sampled_from(["* * * * *", "0 * * * *"])), "timezone": "UTC"},
                MisfirePolicy.FIRE_ONCE, 60_000, draw(st.booleans()))
    return DesiredProject("p", draw(st.sampled_from([None, "P", "Q"])), tasks, triggers)


def state_of(project: DesiredProject, name: str | None) -> ProjectState:
    """The state a store holds after publishing ``project`` (revision 1 everywhere)."""
    tasks = {k: TaskRecord("p", k, 1, v, content_digest(v)) for k, v in project.tasks.items()}
    triggers = {k: TriggerHead("p", k, d.task_id, 1, d.kind, d.spec, d.misfire_policy, d.misfire_grace_ms,
                               d.enabled, trigger_content_digest("p", k, d.task_id, d.kind, d.spec,
                                                                 d.misfire_policy, d.misfire_grace_ms, d.enabled))
                for k, d in project.triggers.items()}
    return ProjectState("p", True, name, tasks, triggers)


@given(desired(), desired(), st.booleans())
def test_a_plan_reaches_the_desired_state_and_then_plans_nothing(before, after, prune):
    current = state_of(before, before.name or "p")
    plan = plan_project(after, current, prune=prune)
    reached = apply_plan_to_state(plan, current)
    assert reached["tasks"].keys() >= {k for k in after.tasks}
    assert {k: content_digest(v) for k, v in after.tasks.items()}.items() <= reached["tasks"].items()
    if prune:
        assert set(reached["tasks"]) == set(after.tasks) and set(reached["triggers"]) == set(after.triggers)
    else:
        assert not any(c.action is ChangeAction.DELETE for c in plan.changes)
    name = after.name or before.name or "p"
    again = plan_project(after, state_of(after, name), prune=prune)
    assert all(c.action is ChangeAction.UNCHANGED for c in again.changes)


@given(desired())
def test_deleting_a_project_deletes_triggers_before_tasks_before_the_project(project):
    plan = plan_project(None, state_of(project, "p"))
    kinds = [c.kind.value for c in plan.changes]
    assert kinds == sorted(kinds, key=["trigger", "task", "project"].index)
    assert kinds[-1] == "project" and all(c.action is ChangeAction.DELETE for c in plan.changes)
