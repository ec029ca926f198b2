"""The admin side: projects, tasks and trigger heads. Every call is one transaction.

Input is validated before the transaction starts (spec, identifiers, policy, grace), and every
existence check happens inside it, before the first write, so a refused call writes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any, Callable, Mapping

from qinglong.contracts.chain import AFTER_KIND, check_no_cycle
from qinglong.contracts.apply import (
    Change,
    ChangeAction,
    DesiredProject,
    ObjectKind,
    PlanRefused,
    ProjectPlan,
    ProjectState,
    plan_project,
    validate_desired,
)
from qinglong.contracts.errors import (
    UserError,
    project_exists,
    project_not_found,
    task_in_use,
    task_not_found,
    trigger_id_taken,
    trigger_not_found,
)
from qinglong.contracts.records import (
    MisfirePolicy,
    ProjectRecord,
    TaskRecord,
    TriggerDefinition,
    TriggerHead,
    canonical_json,
    content_digest,
    trigger_content_digest,
)
from qinglong.contracts.store import (
    BackendContext,
    SchedulerLimits,
    check_enabled,
    check_identifier,
    check_misfire_grace,
    check_project_name,
    check_task_payload,
    misfire_policy_of,
    validate_definition,
)

from qinglong.contracts.secrets import (
    given_trigger_spec,
    opened_state,
    opened_trigger_spec,
    sealed_env_payload,
    sealed_trigger_spec,
)

from .queries import query
from .reader import head_from_row
from .store import SqliteStore, named_one, named_rows, transaction


def _require_project(conn: sqlite3.Connection, project_id: str) -> sqlite3.Row:
    row = named_one(conn, query("project_by_id"), (project_id,))
    if row is None or row["deleted_at_ms"] is not None:
        raise project_not_found(project_id)
    return row


def _live_task_head(conn: sqlite3.Connection, project_id: str, task_id: str) -> sqlite3.Row | None:
    """The task's head row unless the task does not exist or was deleted."""
    row = named_one(conn, query("task_head"), (project_id, task_id))
    return row if row is not None and row["deleted_at_ms"] is None else None


def checked_task_payload(sealer: Any, project_id: str, task_id: str,
                         payload: Mapping[str, Any]) -> tuple[str, str]:
    """``(stored JSON, digest)`` of a payload to publish: checked and digested in clear, stored
    with its env values sealed (:func:`~qinglong.contracts.secrets.sealed_env_payload`)."""
    if not isinstance(payload, Mapping):
        check_task_payload(task_id, payload)  # the contract's refusal
    plain, stored = sealed_env_payload(sealer, project_id, task_id, payload)
    plain_json = check_task_payload(task_id, plain)
    return canonical_json(stored), content_digest(json.loads(plain_json))


def put_task_in(conn: sqlite3.Connection, project_id: str, task_id: str, payload_json: str,
                digest: str, now_ms: int) -> TaskRecord:
    """Publish a checked payload inside the caller's open transaction: a new revision when its
    digest differs from the head's (or the task was deleted: its revisions continue)."""
    _require_project(conn, project_id)
    head = named_one(conn, query("task_head"), (project_id, task_id))
    if head is not None and head["deleted_at_ms"] is None and head["content_digest"] == digest:
        return TaskRecord(project_id, task_id, head["task_revision"],
                          json.loads(head["payload_json"]), head["content_digest"])
    revision = head["task_revision"] + 1 if head is not None else 1
    params = {"project_id": project_id, "task_id": task_id, "revision": revision,
              "payload": payload_json, "digest": digest, "now": now_ms}
    # The head first: task_revisions references it.
    conn.execute(query("upsert_task_head"), params)
    conn.execute(query("insert_task_revision"), params)
    return TaskRecord(project_id, task_id, revision, json.loads(payload_json), digest)


def delete_task_in(conn: sqlite3.Connection, project_id: str, task_id: str, now_ms: int) -> None:
    """Mark a task deleted inside the caller's transaction; refused while a trigger runs it."""
    if _live_task_head(conn, project_id, task_id) is None:
        raise task_not_found(project_id, task_id)
    users = [row[0] for row in conn.execute(query("triggers_of_task"), (project_id, task_id))]
    if users:
        raise task_in_use(project_id, task_id, users)
    conn.execute(query("delete_task_head"), {"project_id": project_id, "task_id": task_id, "now": now_ms})


def project_state_in(conn: sqlite3.Connection, project_id: str) -> ProjectState:
    """The project's state as :func:`~qinglong.contracts.apply.plan_project` reads it."""
    row = named_one(conn, query("project_by_id"), (project_id,))
    if row is None or row["deleted_at_ms"] is not None:
        return ProjectState.absent(project_id)
    tasks = {r["task_id"]: TaskRecord(project_id, r["task_id"], r["task_revision"],
                                      json.loads(r["payload_json"]), r["content_digest"])
             for r in named_rows(conn, query("project_task_heads"), (project_id,))}
    triggers = {r["trigger_id"]: head_from_row(r)
                for r in named_rows(conn, query("list_triggers_of_project"), (project_id,))}
    return ProjectState(project_id, True, row["name"], tasks, triggers)


class _RollBack(Exception):
    """Raised at the end of a dry run so that its transaction writes nothing."""

    def __init__(self, plan: ProjectPlan) -> None:
        self.plan = plan


def apply_plan_in(conn: sqlite3.Connection, desired: DesiredProject | None, project_id: str,
                  prune: bool, now_ms: int, sealer: Any = None) -> ProjectPlan:
    """Read the project, plan it and write the plan, inside the caller's transaction."""
    current = opened_state(sealer, project_state_in(conn, project_id))
    plan = plan_project(desired, current, prune=prune)
    for change in plan.changes:
        if change.action is ChangeAction.UNCHANGED:
            continue
        try:
            _apply_change(conn, change, plan, desired, now_ms, sealer)
        except PlanRefused:
            raise
        except UserError as exc:
            raise PlanRefused(project_id, change.kind, change.object_id,
                              "id" if change.kind is not ObjectKind.TRIGGER else "trigger",
                              str(exc)) from None
    return plan


def _apply_change(conn: sqlite3.Connection, change: Change, plan: ProjectPlan,
                  desired: DesiredProject | None, now_ms: int, sealer: Any = None) -> None:
    project_id = plan.project_id
    if change.kind is ObjectKind.PROJECT:
        if change.action is ChangeAction.DELETE:
            conn.execute(query("delete_project_row"), {"project_id": project_id, "now": now_ms})
            return
        name = (desired.name if desired is not None and desired.name is not None else project_id)
        if change.action is ChangeAction.CREATE:
            row = named_one(conn, query("project_by_id"), (project_id,))
            if row is None:
                conn.execute(query("insert_project"), (project_id, name, now_ms))
            else:
                conn.execute(query("revive_project"), {"project_id": project_id, "name": name})
        else:
            conn.execute(query("rename_project"), {"project_id": project_id, "name": name})
    elif change.kind is ObjectKind.TASK:
        if change.action is ChangeAction.DELETE:
            delete_task_in(conn, project_id, change.object_id, now_ms)
            return
        stored_json, digest = checked_task_payload(sealer, project_id, change.object_id,
                                                   plan.tasks[change.object_id])
        put_task_in(conn, project_id, change.object_id, stored_json, digest, now_ms)
    else:
        if change.action is ChangeAction.DELETE:
            _existing_head(conn, project_id, change.object_id)
            conn.execute(query("delete_schedule"), (change.object_id,))
            conn.execute(query("delete_trigger_head"), (change.object_id,))
            return
        definition = plan.triggers[change.object_id]
        put_trigger_in(conn, definition, definition.spec, definition.kind,
                       MisfirePolicy(definition.misfire_policy), now_ms, sealer)


def _write_trigger_revision(conn: sqlite3.Connection, head: TriggerHead, now_ms: int) -> None:
    conn.execute(query("upsert_trigger_head"), {
        "trigger_id": head.trigger_id, "project_id": head.project_id, "task_id": head.task_id,
        "revision": head.trigger_revision, "kind": head.kind, "spec": canonical_json(dict(head.spec)),
        "policy": head.misfire_policy.value, "grace": head.misfire_grace_ms,
        "enabled": int(head.enabled), "digest": head.content_digest, "now": now_ms,
        "jitter": head.jitter_ms,
    })
    # Same transaction as the head: a new revision never runs on the old revision's cursor.
    conn.execute(query("reset_schedule_for_revision"), {
        "trigger_id": head.trigger_id, "project_id": head.project_id,
        "revision": head.trigger_revision, "now": now_ms,
    })
    conn.execute(query("raise_trigger_revision_mark"),
                 {"trigger_id": head.trigger_id, "revision": head.trigger_revision})


def next_trigger_revision(conn: sqlite3.Connection, trigger_id: str, current: int) -> int:
    """The revision a new definition of ``trigger_id`` gets: above its head's ``current`` (0 when
    there is no head) and above every revision the id ever had (a trigger deleted and created
    again continues, never repeats)."""
    mark = named_one(conn, query("trigger_revision_mark"), (trigger_id,))
    return max(current, mark["high_revision"] if mark is not None else 0) + 1


def put_trigger_in(conn: sqlite3.Connection, definition: TriggerDefinition,
                   spec: Mapping[str, Any], kind: str, policy: MisfirePolicy, now_ms: int,
                   sealer: Any = None) -> TriggerHead:
    """Publish a validated definition inside the caller's open transaction: digested in clear,
    stored with its secret spec values sealed (as a head reads back)."""
    _require_project(conn, definition.project_id)
    if _live_task_head(conn, definition.project_id, definition.task_id) is None:
        raise task_not_found(definition.project_id, definition.task_id)
    existing = named_one(conn, query("trigger_by_id"), (definition.trigger_id,))
    if existing is not None and existing["project_id"] != definition.project_id:
        raise trigger_id_taken(definition.trigger_id, existing["project_id"])
    digest = trigger_content_digest(definition.project_id, definition.trigger_id, definition.task_id,
                                    kind, spec, policy, definition.misfire_grace_ms, definition.enabled,
                                    definition.jitter_ms)
    if existing is not None and existing["content_digest"] == digest:
        return head_from_row(existing)
    if kind == AFTER_KIND:
        _check_chain(conn, definition, spec)
    head = TriggerHead(definition.project_id, definition.trigger_id, definition.task_id,
                       next_trigger_revision(conn, definition.trigger_id,
                                             existing["trigger_revision"] if existing is not None
                                             else 0), kind,
                       sealed_trigger_spec(sealer, definition.project_id, definition.trigger_id, spec),
                       policy, definition.misfire_grace_ms, definition.enabled, digest,
                       definition.jitter_ms)
    _write_trigger_revision(conn, head, now_ms)
    return head


def _check_chain(conn: sqlite3.Connection, definition: TriggerDefinition,
                 spec: Mapping[str, Any]) -> None:
    """An ``after`` trigger: its upstream task exists in the project, and the chain graph with it
    has no loop."""
    upstream = spec["task"]
    if _live_task_head(conn, definition.project_id, upstream) is None:
        raise task_not_found(definition.project_id, upstream)
    edges = [(row["upstream"], row["task_id"])
             for row in named_rows(conn, query("chain_edges"), (definition.project_id,))
             if row["trigger_id"] != definition.trigger_id]
    check_no_cycle(definition.project_id, definition.trigger_id,
                   edges + [(upstream, definition.task_id)])


def validated(definition: TriggerDefinition, providers: Mapping[str, Any],
              limits: SchedulerLimits | None = None) -> tuple[Mapping[str, Any], str, MisfirePolicy]:
    """Validate a definition before any write; returns the normalised spec, kind and policy.

    With ``limits``, a ``skip`` trigger whose grace is at or below the scheduler cadence (so its
    on-time occurrences would be skipped) is refused too.
    """
    spec, kind = validate_definition(definition, providers)
    policy = misfire_policy_of(definition.misfire_policy)
    check_enabled(definition.enabled)
    if limits is not None:
        check_misfire_grace(definition, limits, leased=False)
    return spec, kind, policy


class SqlitePublisher:
    """Implements :class:`qinglong.contracts.store.Publisher` on the SQLite store."""

    def __init__(self, store: SqliteStore, context: BackendContext) -> None:
        self._store = store
        self._context = context

    async def _in_transaction(self, fn: Callable[..., Any], *args: Any) -> Any:
        def run(conn: sqlite3.Connection) -> Any:
            with transaction(conn):
                return fn(conn, *args)
        return await self._store.call(run)

    async def create_project(self, project_id: str, name: str | None = None) -> ProjectRecord:
        """Create an active project; :class:`AlreadyExists` if the id is taken."""
        check_identifier("project_id", project_id)
        label = project_id if name is None else check_project_name(name)
        now = self._context.clock_ms()

        def write(conn: sqlite3.Connection) -> ProjectRecord:
            row = named_one(conn, query("project_by_id"), (project_id,))
            if row is not None and row["deleted_at_ms"] is None:
                raise project_exists(project_id)
            if row is None:
                conn.execute(query("insert_project"), (project_id, label, now))
            else:  # a deleted project created again starts empty, active
                conn.execute(query("revive_project"), {"project_id": project_id, "name": label})
            return ProjectRecord(project_id, label, True)

        return await self._in_transaction(write)

    async def put_task(self, project_id: str, task_id: str, payload: Mapping[str, Any]) -> TaskRecord:
        """Create a task or publish a new revision when its payload changed."""
        check_identifier("project_id", project_id)
        check_identifier("task_id", task_id)
        stored_json, digest = checked_task_payload(self._context.sealer, project_id, task_id, payload)
        now = self._context.clock_ms()
        return await self._in_transaction(put_task_in, project_id, task_id, stored_json, digest, now)

    async def delete_task(self, project_id: str, task_id: str) -> None:
        """Mark a task deleted (its revisions and Runs stay); refused while a trigger runs it."""
        now = self._context.clock_ms()
        await self._in_transaction(delete_task_in, project_id, task_id, now)

    async def project_state(self, project_id: str) -> ProjectState:
        """The project's name, task heads and trigger heads, read in one transaction."""
        def read(conn: sqlite3.Connection) -> ProjectState:
            conn.execute("BEGIN")
            try:
                return project_state_in(conn, project_id)
            finally:
                conn.execute("COMMIT")
        return await self._store.call(read)

    async def apply_project(self, desired: DesiredProject, *, prune: bool = False,
                            dry_run: bool = False) -> ProjectPlan:
        """Plan and apply one project in one transaction (rolled back for ``dry_run``)."""
        checked = validate_desired(desired, self._context.providers, self._context.limits)
        return await self._planned(checked, checked.project_id, prune, dry_run)

    async def delete_project(self, project_id: str, *, dry_run: bool = False) -> ProjectPlan:
        """Delete a project's triggers, tasks and the project in one transaction."""
        check_identifier("project_id", project_id)
        return await self._planned(None, project_id, True, dry_run)

    async def _planned(self, desired: DesiredProject | None, project_id: str, prune: bool,
                       dry_run: bool) -> ProjectPlan:
        now = self._context.clock_ms()

        def work(conn: sqlite3.Connection) -> ProjectPlan:
            plan = apply_plan_in(conn, desired, project_id, prune, now, self._context.sealer)
            if dry_run:
                raise _RollBack(plan)
            return plan

        try:
            return await self._in_transaction(work)
        except _RollBack as done:
            return done.plan

    async def put_trigger(self, definition: TriggerDefinition) -> TriggerHead:
        """Add a trigger or publish a new revision (resetting its cursor); unchanged is a no-op."""
        sealer = self._context.sealer
        # an edit keeping the head's sealed secret gives it back sealed: validated in clear
        definition = dataclasses.replace(definition, spec=given_trigger_spec(
            sealer, definition.project_id, definition.trigger_id, definition.spec))
        spec, kind, policy = validated(definition, self._context.providers, self._context.limits)
        now = self._context.clock_ms()
        return await self._in_transaction(put_trigger_in, definition, spec, kind, policy, now, sealer)

    async def set_trigger_enabled(self, project_id: str, trigger_id: str, enabled: bool) -> TriggerHead:
        """Enable or disable a trigger; a change is a new revision with a reset cursor."""
        check_enabled(enabled)
        now = self._context.clock_ms()

        def write(conn: sqlite3.Connection) -> TriggerHead:
            head = _existing_head(conn, project_id, trigger_id)
            if head.enabled is enabled:
                return head
            if enabled:
                # A head published before the grace floor was enforced must not start skipping.
                check_misfire_grace(head, self._context.limits, leased=False)
            plain = opened_trigger_spec(self._context.sealer, head.project_id, head.trigger_id, head.spec)
            digest = trigger_content_digest(head.project_id, head.trigger_id, head.task_id, head.kind,
                                            plain, head.misfire_policy, head.misfire_grace_ms, enabled,
                                            head.jitter_ms)
            new = TriggerHead(head.project_id, head.trigger_id, head.task_id,
                              next_trigger_revision(conn, head.trigger_id, head.trigger_revision),
                              head.kind, head.spec, head.misfire_policy, head.misfire_grace_ms,
                              enabled, digest, head.jitter_ms)
            _write_trigger_revision(conn, new, now)
            return new

        return await self._in_transaction(write)

    async def delete_trigger(self, project_id: str, trigger_id: str) -> None:
        """Delete a trigger head and its schedule row; its Runs and its revision high-water mark
        stay, so a trigger created again under the id continues its revisions."""

        def write(conn: sqlite3.Connection) -> None:
            _existing_head(conn, project_id, trigger_id)
            conn.execute(query("delete_schedule"), (trigger_id,))
            conn.execute(query("delete_trigger_head"), (trigger_id,))

        await self._in_transaction(write)


def _existing_head(conn: sqlite3.Connection, project_id: str, trigger_id: str) -> TriggerHead:
    row = named_one(conn, query("trigger_by_id"), (trigger_id,))
    if row is None or row["project_id"] != project_id:
        raise trigger_not_found(project_id, trigger_id)
    return head_from_row(row)
