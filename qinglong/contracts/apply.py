"""Configuration as code: a project's desired state, the state a store holds, and the plan between.

``qinglong apply`` (and the API's ``PUT /api/v1/apply``) read a file of projects, tasks and
triggers into one :class:`DesiredProject` per project. A publisher applies each project's plan in
one transaction (:meth:`~qinglong.contracts.store.Publisher.apply_project`): it reads the
project's :class:`ProjectState` inside the transaction, computes the plan with
:func:`plan_project` (pure, the same in every store) and writes exactly what the plan says.
Applying the same desired state twice therefore writes nothing the second time and makes no new
revision: an object whose content digest is unchanged is ``unchanged``.

A plan never holds a value: it names what changes (``timeout_ms``, ``env.TOKEN``), so printing
or logging it cannot leak a secret.

An env value of a desired task may be :data:`STORED`: "the value the store holds now" (what an
export writes instead of a secret). :func:`resolve_stored_env` replaces it with the stored value
inside the transaction, or refuses naming the task and the variable when there is none.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any, Iterable, Mapping

from .frozen import record
from .errors import UserError
from .records import (
    MisfirePolicy,
    TaskRecord,
    TriggerDefinition,
    TriggerHead,
    content_digest,
    trigger_content_digest,
)

#: The version of the file format (``version = 1`` at the top of an apply file).
FORMAT_VERSION = 1


class _Stored:
    """The type of :data:`STORED` (a singleton, never a JSON value)."""

    _instance: "_Stored | None" = None

    def __new__(cls) -> "_Stored":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "STORED"


#: An env value meaning "keep the value the store holds for this task and variable".
STORED = _Stored()


class ChangeAction(str, enum.Enum):
    """What a plan does to one object."""

    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"
    DELETE = "delete"


class ObjectKind(str, enum.Enum):
    """The kinds of object a plan names."""

    PROJECT = "project"
    TASK = "task"
    TRIGGER = "trigger"


@record
class DesiredProject:
    """One project as a file declares it.

    ``tasks`` maps a task id to its payload with every execution value stated (what ``task put``
    would store; env values may be :data:`STORED`); ``triggers`` maps a trigger id to its
    definition with a spec its provider has normalised. ``name`` None keeps the stored name (the
    project id for a new project).
    """

    project_id: str
    name: str | None = None
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    triggers: Mapping[str, TriggerDefinition] = field(default_factory=dict)


@record
class ProjectState:
    """What a store holds for one project: its name, its task heads and its trigger heads.

    ``exists`` is False for a project the store does not have (or has deleted); its maps are then
    empty.
    """

    project_id: str
    exists: bool
    name: str | None = None
    tasks: Mapping[str, TaskRecord] = field(default_factory=dict)
    triggers: Mapping[str, TriggerHead] = field(default_factory=dict)

    @classmethod
    def absent(cls, project_id: str) -> "ProjectState":
        """The state of a project the store does not have."""
        return cls(project_id, False)


@record
class Change:
    """One object's line in a plan. ``fields`` names what differs (never a value); ``revision``
    is the stored revision the change starts from (None for a create or a project)."""

    action: ChangeAction
    kind: ObjectKind
    project_id: str
    object_id: str
    fields: tuple[str, ...] = ()
    revision: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (what ``apply --json`` and the API return)."""
        return {"action": self.action.value, "kind": self.kind.value, "project_id": self.project_id,
                "id": self.object_id, "fields": list(self.fields), "revision": self.revision}


@record
class ProjectPlan:
    """The plan of one project, in the order it is applied: the project, trigger deletions, task
    creations and updates, trigger creations and updates, task deletions, the project's deletion.

    ``tasks`` and ``triggers`` are what the transaction writes (resolved payloads, validated
    definitions), by id; they are not part of the printed plan.
    """

    project_id: str
    changes: tuple[Change, ...]
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    triggers: Mapping[str, TriggerDefinition] = field(default_factory=dict, repr=False)

    @property
    def writes(self) -> bool:
        """True when applying this plan changes the store."""
        return any(c.action is not ChangeAction.UNCHANGED for c in self.changes)

    def counts(self) -> dict[str, int]:
        """How many changes of each action (``create``, ``update``, ``unchanged``, ``delete``)."""
        found = {action.value: 0 for action in ChangeAction}
        for change in self.changes:
            found[change.action.value] += 1
        return found

    def of(self, action: ChangeAction, kind: ObjectKind) -> list[Change]:
        """The changes of one action and kind, in plan order."""
        return [c for c in self.changes if c.action is action and c.kind is kind]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form: the project, its counts and its changes."""
        return {"project_id": self.project_id, "counts": self.counts(),
                "changes": [c.to_json() for c in self.changes]}


class PlanRefused(UserError):
    """A plan that cannot be applied, naming the object and the key that is wrong, so a caller
    holding the file can name its line. Nothing of the project was written."""

    def __init__(self, project_id: str, kind: ObjectKind, object_id: str, key: str, problem: str) -> None:
        self.project_id = project_id
        self.kind = kind
        self.object_id = object_id
        self.key = key
        self.problem = problem
        super().__init__(f"project {project_id!r}, {kind.value} {object_id!r}: {key}: {problem}")


def resolve_stored_env(project_id: str, task_id: str, payload: Mapping[str, Any],
                       current: TaskRecord | None) -> dict[str, Any]:
    """``payload`` with every :data:`STORED` env value replaced by the value ``current`` holds.

    Refused (:class:`PlanRefused` naming ``env.NAME``) when the task or the variable is not
    stored; the refusal never shows a value.
    """
    env = payload.get("env")
    if not isinstance(env, Mapping) or not any(v is STORED for v in env.values()):
        return dict(payload)
    stored_env = current.payload.get("env") if current is not None else None
    resolved: dict[str, Any] = {}
    for name, value in env.items():
        if value is STORED:
            if not isinstance(stored_env, Mapping) or not isinstance(stored_env.get(name), str):
                where = ("the task is not stored yet" if current is None
                         else "the stored task has no such variable")
                raise PlanRefused(project_id, ObjectKind.TASK, task_id, f"env.{name}",
                                  f"'stored:' keeps the stored value, but {where}; give the value "
                                  "with env:NAME, file:PATH or secret:NAME")
            resolved[name] = stored_env[name]
        else:
            resolved[name] = value
    out = dict(payload)
    out["env"] = resolved
    return out


def payload_differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, ...]:
    """The payload keys whose values differ, sorted; env variables by name (``env.TOKEN``), so a
    changed secret is named, never shown."""
    keys: set[str] = set()
    for key in set(before) | set(after):
        if key == "env":
            old, new = before.get("env"), after.get("env")
            old = old if isinstance(old, Mapping) else {}
            new = new if isinstance(new, Mapping) else {}
            keys.update(f"env.{name}" for name in set(old) | set(new) if old.get(name) != new.get(name))
            if ("env" in before) != ("env" in after) and not old and not new:
                keys.add("env")
        elif before.get(key, _MISSING) != after.get(key, _MISSING):
            keys.add(key)
    return tuple(sorted(keys))


_MISSING = object()


def _trigger_digest(definition: TriggerDefinition) -> str:
    return trigger_content_digest(definition.project_id, definition.trigger_id, definition.task_id,
                                  definition.kind, definition.spec,
                                  MisfirePolicy(definition.misfire_policy),
                                  definition.misfire_grace_ms, definition.enabled,
                                  definition.jitter_ms)


def _trigger_differences(head: TriggerHead, definition: TriggerDefinition) -> tuple[str, ...]:
    pairs = (("task", head.task_id, definition.task_id), ("kind", head.kind, definition.kind),
             ("spec", dict(head.spec), dict(definition.spec)),
             ("misfire_policy", head.misfire_policy.value, MisfirePolicy(definition.misfire_policy).value),
             ("misfire_grace_ms", head.misfire_grace_ms, definition.misfire_grace_ms),
             ("jitter_ms", head.jitter_ms, definition.jitter_ms),
             ("enabled", head.enabled, definition.enabled))
    return tuple(name for name, old, new in pairs if old != new)


def plan_project(desired: DesiredProject | None, current: ProjectState, *,
                 prune: bool = False) -> ProjectPlan:
    """The plan that takes ``current`` to ``desired``; pure, the same in every store.

    ``desired`` None deletes the whole project (its triggers, its tasks, then the project).
    Without ``prune`` nothing is deleted: objects the desired state does not name are left alone.
    Triggers in ``desired`` must carry specs their provider normalised (what the store would
    write), or an unchanged trigger would read as an update.

    Refused (:class:`PlanRefused`): a :data:`STORED` env value with nothing stored; a desired
    trigger naming a task that neither the desired state nor (without ``prune``) the store has;
    a trigger whose id belongs to another project is the store's refusal, not this function's.
    """
    project_id = current.project_id
    changes: list[Change] = []
    if desired is None:
        if not current.exists:
            return ProjectPlan(project_id, ())
        for trigger_id in sorted(current.triggers):
            changes.append(Change(ChangeAction.DELETE, ObjectKind.TRIGGER, project_id, trigger_id,
                                  revision=current.triggers[trigger_id].trigger_revision))
        for task_id in sorted(current.tasks):
            changes.append(Change(ChangeAction.DELETE, ObjectKind.TASK, project_id, task_id,
                                  revision=current.tasks[task_id].task_revision))
        changes.append(Change(ChangeAction.DELETE, ObjectKind.PROJECT, project_id, project_id))
        return ProjectPlan(project_id, tuple(changes))
    if desired.project_id != project_id:
        raise ValueError(f"desired project {desired.project_id!r} planned against {project_id!r}")

    name = desired.name if desired.name is not None else (current.name or project_id)
    if not current.exists:
        changes.append(Change(ChangeAction.CREATE, ObjectKind.PROJECT, project_id, project_id))
    elif current.name != name:
        changes.append(Change(ChangeAction.UPDATE, ObjectKind.PROJECT, project_id, project_id, ("name",)))
    else:
        changes.append(Change(ChangeAction.UNCHANGED, ObjectKind.PROJECT, project_id, project_id))

    if prune:
        for trigger_id in sorted(set(current.triggers) - set(desired.triggers)):
            changes.append(Change(ChangeAction.DELETE, ObjectKind.TRIGGER, project_id, trigger_id,
                                  revision=current.triggers[trigger_id].trigger_revision))

    tasks: dict[str, Mapping[str, Any]] = {}
    for task_id in sorted(desired.tasks):
        stored = current.tasks.get(task_id)
        payload = resolve_stored_env(project_id, task_id, desired.tasks[task_id], stored)
        tasks[task_id] = payload
        if stored is None:
            changes.append(Change(ChangeAction.CREATE, ObjectKind.TASK, project_id, task_id))
        elif stored.content_digest != content_digest(payload):
            changes.append(Change(ChangeAction.UPDATE, ObjectKind.TASK, project_id, task_id,
                                  payload_differences(stored.payload, payload), stored.task_revision))
        else:
            changes.append(Change(ChangeAction.UNCHANGED, ObjectKind.TASK, project_id, task_id,
                                  revision=stored.task_revision))

    kept_tasks = set(desired.tasks) | (set() if prune else set(current.tasks))
    triggers: dict[str, TriggerDefinition] = {}
    for trigger_id in sorted(desired.triggers):
        definition = desired.triggers[trigger_id]
        if definition.project_id != project_id or definition.trigger_id != trigger_id:
            raise ValueError(f"trigger {trigger_id!r} is defined for {definition.project_id!r}/"
                             f"{definition.trigger_id!r}")
        if definition.task_id not in kept_tasks:
            raise PlanRefused(project_id, ObjectKind.TRIGGER, trigger_id, "task",
                              f"task {definition.task_id!r} is not declared in project {project_id!r}")
        triggers[trigger_id] = definition
        head = current.triggers.get(trigger_id)
        if head is None:
            changes.append(Change(ChangeAction.CREATE, ObjectKind.TRIGGER, project_id, trigger_id))
        elif head.content_digest != _trigger_digest(definition):
            changes.append(Change(ChangeAction.UPDATE, ObjectKind.TRIGGER, project_id, trigger_id,
                                  _trigger_differences(head, definition), head.trigger_revision))
        else:
            changes.append(Change(ChangeAction.UNCHANGED, ObjectKind.TRIGGER, project_id, trigger_id,
                                  revision=head.trigger_revision))

    if prune:
        for task_id in sorted(set(current.tasks) - set(desired.tasks)):
            changes.append(Change(ChangeAction.DELETE, ObjectKind.TASK, project_id, task_id,
                                  revision=current.tasks[task_id].task_revision))
    return ProjectPlan(project_id, tuple(changes), tasks, triggers)


def apply_plan_to_state(plan: ProjectPlan, current: ProjectState, name: str | None = None) -> dict[str, Any]:
    """What a store holds after ``plan`` (ids and digests only): the model the conformance and
    property tests compare a store against. ``name`` is the desired name (None keeps it)."""
    tasks = {k: v.content_digest for k, v in current.tasks.items()}
    triggers = {k: v.content_digest for k, v in current.triggers.items()}
    exists = current.exists
    for change in plan.changes:
        if change.kind is ObjectKind.PROJECT:
            exists = change.action is not ChangeAction.DELETE
        elif change.kind is ObjectKind.TASK:
            if change.action is ChangeAction.DELETE:
                tasks.pop(change.object_id, None)
            else:
                tasks[change.object_id] = content_digest(plan.tasks[change.object_id])
        else:
            if change.action is ChangeAction.DELETE:
                triggers.pop(change.object_id, None)
            else:
                triggers[change.object_id] = _trigger_digest(plan.triggers[change.object_id])
    return {"exists": exists, "tasks": tasks, "triggers": triggers}


def plans_summary(plans: Iterable[ProjectPlan]) -> dict[str, int]:
    """The counts of several plans added up."""
    total = {action.value: 0 for action in ChangeAction}
    for plan in plans:
        for key, value in plan.counts().items():
            total[key] += value
    return total


def validate_desired(desired: DesiredProject, providers: Mapping[str, Any], limits: Any = None, *,
                     leased: bool = False) -> DesiredProject:
    """``desired`` with every trigger spec normalised by its provider and every task payload and
    identifier checked, before any transaction starts; the checks every publisher makes on
    ``put_task`` and ``put_trigger``. A refusal is a :class:`PlanRefused` naming the object and
    the key (``spec``, ``misfire_grace_ms``, ...); no value is shown.

    ``limits`` (:class:`~qinglong.contracts.store.SchedulerLimits`) adds the grace floor of
    ``skip`` triggers; ``leased`` says the store's claims have a lease (the cluster).
    """
    from .errors import TriggerSpecError, UnknownTriggerKind
    from .store import (check_enabled, check_identifier, check_misfire_grace, check_project_name,
                        check_task_payload, misfire_policy_of, validate_definition)

    project_id = desired.project_id
    check_identifier("project_id", project_id)
    if desired.name is not None:
        try:
            check_project_name(desired.name)
        except UserError as exc:
            raise PlanRefused(project_id, ObjectKind.PROJECT, project_id, "name", str(exc)) from None
    for task_id, payload in desired.tasks.items():
        try:
            check_identifier("task_id", task_id)
            placeholder = dict(payload)
            if isinstance(payload.get("env"), Mapping):
                placeholder["env"] = {k: ("" if v is STORED else v) for k, v in payload["env"].items()}
            check_task_payload(task_id, placeholder)
        except PlanRefused:
            raise
        except UserError as exc:
            raise PlanRefused(project_id, ObjectKind.TASK, task_id, "payload", str(exc)) from None
    triggers: dict[str, TriggerDefinition] = {}
    for trigger_id, definition in desired.triggers.items():
        try:
            spec, kind = validate_definition(definition, providers)
            policy = misfire_policy_of(definition.misfire_policy)
            check_enabled(definition.enabled)
            if limits is not None:
                check_misfire_grace(definition, limits, leased=leased)
        except UnknownTriggerKind as exc:
            raise PlanRefused(project_id, ObjectKind.TRIGGER, trigger_id, "kind", str(exc)) from None
        except TriggerSpecError as exc:
            key = exc.field if exc.field in ("misfire_grace_ms", "jitter_ms") else "spec"
            raise PlanRefused(project_id, ObjectKind.TRIGGER, trigger_id, key, str(exc)) from None
        except UserError as exc:
            text = str(exc)
            key = next((k for k in ("misfire_policy", "enabled", "task_id", "trigger_id")
                        if k in text), "spec")
            raise PlanRefused(project_id, ObjectKind.TRIGGER, trigger_id,
                              "task" if key == "task_id" else key, text) from None
        triggers[trigger_id] = TriggerDefinition(project_id, trigger_id, definition.task_id, kind,
                                                 dict(spec), policy, definition.misfire_grace_ms,
                                                 definition.enabled, definition.jitter_ms)
    return DesiredProject(project_id, desired.name, dict(desired.tasks), triggers)
