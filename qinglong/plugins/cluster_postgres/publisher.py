"""The admin side: projects, tasks (with pinned execution revisions) and triggers.

Every call is one SERIALIZABLE transaction on the admin role's pool (retried on serialization
failures, which write nothing). Input is validated before the transaction starts, so bad input
writes nothing. Publishing a trigger upserts its schedule row in the same transaction; a new
revision resets the cursor and the claim and increments ``state_version`` and ``claim_version``,
which kills every older claim, and records the publish time (database clock) the first occurrence
is counted from. A trigger's revisions never repeat, even across a delete and re-create
(``trigger_revision_marks``). A ``skip`` trigger whose grace cannot be met under the scheduler's
cadence and claim lease is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from typing import Any, Awaitable, Callable, Mapping, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from qinglong.contracts.frozen import record
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
from qinglong.contracts.execution import CONTRACT_LIMITS, parse_execution_spec, spec_to_payload
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
from qinglong.contracts.secrets import (
    given_trigger_spec,
    opened_state,
    opened_trigger_spec,
    sealed_env_payload,
    sealed_trigger_spec,
)
from qinglong.contracts.store import (
    SchedulerLimits,
    check_enabled,
    check_identifier,
    check_misfire_grace,
    check_project_name,
    check_task_payload,
    misfire_policy_of,
    validate_definition,
)

from .admission import RETRYABLE
from .tokens import write_pending_audit
from .sql import query

T = TypeVar("T")

EXECUTOR = "remote_worker"


def execution_spec(project_id: str, task_id: str, task_revision: int, task_digest: str,
                   execution: Mapping[str, Any] | None = None) -> dict:
    """The pinned execution revision of a task revision: what a remote worker will be offered.

    ``execution`` is the task's normalised execution spec (every default written out, see
    :func:`~qinglong.contracts.execution.spec_to_payload`), or None when the payload names no
    command; the store's worker functions read the concurrency, retry, timeout, log limit and
    label policies from it (no default lives in SQL)."""
    return {
        "executor": EXECUTOR,
        "project_id": project_id,
        "task_id": task_id,
        "task_revision": task_revision,
        "task_digest": task_digest,
        "execution": None if execution is None else dict(execution),
    }


def normalised_execution(task_id: str, payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The execution spec of a task payload with every default written out, or None when it
    names no command. A payload whose spec is invalid is refused here, key by key, before
    anything is written (the words of :func:`parse_execution_spec`)."""
    spec = parse_execution_spec(task_id, payload, CONTRACT_LIMITS)
    return None if spec is None else spec_to_payload(spec)


def _head(trigger_id: str, row: Mapping[str, Any]) -> TriggerHead:
    """A :class:`TriggerHead` from a ``lock_trigger_head`` row, read by column name."""
    return TriggerHead(row["project_id"], trigger_id, row["task_id"], row["trigger_revision"],
                       row["kind"], row["spec_json"], MisfirePolicy(row["misfire_policy"]),
                       row["misfire_grace_ms"], row["enabled"], row["content_digest"],
                       row["jitter_ms"])


async def _check_chain(conn, project_id: str, trigger_id: str, task_id: str,
                       spec: Mapping[str, Any]) -> None:
    """An ``after`` trigger: its upstream task exists in the project, and the chain graph with it
    has no loop (read in the publish's SERIALIZABLE transaction: two publishes that together
    would close a loop cannot both commit)."""
    upstream = await _one(conn, query("lock_task_head"), {"project_id": project_id,
                                                           "task_id": spec["task"]})
    if upstream is None or upstream["deleted_at_ms"] is not None:
        raise task_not_found(project_id, spec["task"])
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("chain_edges"), {"project_id": project_id})
        edges = [(r["upstream"], r["task_id"]) for r in await cur.fetchall()
                 if r["trigger_id"] != trigger_id]
    check_no_cycle(project_id, trigger_id, edges + [(spec["task"], task_id)])


async def _one(conn, sql: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The first row of ``sql``, read by column name (the row factory is this cursor's only)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, params)
        return await cur.fetchone()


class ClusterPublisher:
    """:class:`~qinglong.contracts.store.Publisher` on PostgreSQL (admin role)."""

    def __init__(self, pool_factory: Callable[[], Awaitable[Any]], providers: Mapping[str, Any],
                 retries: int = 5, limits: SchedulerLimits | None = None, sealer: Any = None) -> None:
        self._pool_factory = pool_factory
        self._sealer = sealer
        self._providers = providers
        self._retries = retries
        self._limits = limits

    async def _transaction(self, body: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        pool = await self._pool_factory()
        attempt = 0
        while True:
            try:
                async with pool.connection() as conn:
                    async with conn.transaction():
                        result = await body(conn)
                        audit = await write_pending_audit(conn)
                if audit is not None:
                    audit.written = True
                return result
            except RETRYABLE:
                if attempt >= self._retries:
                    raise
                attempt += 1
                await asyncio.sleep(random.uniform(0, 0.005 * 2 ** attempt))

    async def create_project(self, project_id: str, name: str | None = None) -> ProjectRecord:
        """Create an active project; :class:`AlreadyExists` if the identifier is taken."""
        check_identifier("project_id", project_id)
        display = check_project_name(name) if name is not None else project_id

        async def body(conn):
            row = await _one(conn, query("insert_project"), {"project_id": project_id, "name": display})
            if row is None:
                raise project_exists(project_id)
            return ProjectRecord(row["project_id"], row["name"], row["active"])

        return await self._transaction(body)

    async def put_task(self, project_id: str, task_id: str, payload: Mapping[str, Any]) -> TaskRecord:
        """Create a task or publish a new revision when the payload changed; each revision gets
        its pinned ``remote_worker`` execution revision in the same transaction."""
        check_identifier("project_id", project_id)
        check_identifier("task_id", task_id)
        checked = _checked_task(self._sealer, project_id, task_id, payload)
        return await self._transaction(lambda conn: _put_task_in(conn, project_id, task_id, checked))

    async def delete_task(self, project_id: str, task_id: str) -> None:
        """Mark a task deleted (its revisions and Runs stay); refused while a trigger runs it."""
        await self._transaction(lambda conn: _delete_task_in(conn, project_id, task_id))

    async def project_state(self, project_id: str) -> ProjectState:
        """The project's name, task heads and trigger heads, read in one transaction."""
        return await self._transaction(lambda conn: _project_state_in(conn, project_id, lock=False))

    async def apply_project(self, desired: DesiredProject, *, prune: bool = False,
                            dry_run: bool = False) -> ProjectPlan:
        """Plan and apply one project in one transaction (rolled back for ``dry_run``)."""
        checked = validate_desired(desired, self._providers, self._limits, leased=True)
        return await self._planned(checked, checked.project_id, prune, dry_run)

    async def delete_project(self, project_id: str, *, dry_run: bool = False) -> ProjectPlan:
        """Delete a project's triggers, tasks and the project in one transaction."""
        check_identifier("project_id", project_id)
        return await self._planned(None, project_id, True, dry_run)

    async def _planned(self, desired: DesiredProject | None, project_id: str, prune: bool,
                       dry_run: bool) -> ProjectPlan:
        async def body(conn):
            current = opened_state(self._sealer, await _project_state_in(conn, project_id, lock=True))
            plan = plan_project(desired, current, prune=prune)
            checked = {task_id: _checked_task(self._sealer, project_id, task_id, payload)
                       for task_id, payload in plan.tasks.items()}
            for change in plan.changes:
                if change.action is ChangeAction.UNCHANGED:
                    continue
                try:
                    await self._apply_change(conn, change, plan, desired, checked)
                except PlanRefused:
                    raise
                except UserError as exc:
                    raise PlanRefused(project_id, change.kind, change.object_id,
                                      "id" if change.kind is not ObjectKind.TRIGGER else "trigger",
                                      str(exc)) from None
            if dry_run:
                raise _RollBack(plan)
            return plan

        try:
            return await self._transaction(body)
        except _RollBack as done:
            return done.plan

    async def _apply_change(self, conn, change: Change, plan: ProjectPlan,
                            desired: DesiredProject | None, checked: Mapping[str, Any]) -> None:
        project_id = plan.project_id
        if change.kind is ObjectKind.PROJECT:
            if change.action is ChangeAction.DELETE:
                await conn.execute(query("delete_project_row"), {"project_id": project_id})
                return
            name = desired.name if desired is not None and desired.name is not None else project_id
            if change.action is ChangeAction.CREATE:
                if await _one(conn, query("insert_project"), {"project_id": project_id, "name": name}) is None:
                    raise project_exists(project_id)
            else:
                await conn.execute(query("rename_project"), {"project_id": project_id, "name": name})
        elif change.kind is ObjectKind.TASK:
            if change.action is ChangeAction.DELETE:
                await _delete_task_in(conn, project_id, change.object_id)
            else:
                await _put_task_in(conn, project_id, change.object_id, checked[change.object_id])
        elif change.action is ChangeAction.DELETE:
            await _delete_trigger_in(conn, project_id, change.object_id)
        else:
            definition = plan.triggers[change.object_id]
            await self._publish(conn, project_id, definition.trigger_id, definition.task_id,
                                definition.kind, definition.spec,
                                MisfirePolicy(definition.misfire_policy),
                                definition.misfire_grace_ms, definition.enabled,
                                definition.jitter_ms)

    async def put_trigger(self, definition: TriggerDefinition) -> TriggerHead:
        """Add a trigger or publish a new revision (resetting its schedule), in one transaction."""
        # an edit keeping the head's sealed secret gives it back sealed: validated in clear
        definition = dataclasses.replace(definition, spec=given_trigger_spec(
            self._sealer, definition.project_id, definition.trigger_id, definition.spec))
        spec, kind = validate_definition(definition, self._providers)
        policy = misfire_policy_of(definition.misfire_policy)
        check_enabled(definition.enabled)
        self._check_grace(definition)
        return await self._transaction(lambda conn: self._publish(
            conn, definition.project_id, definition.trigger_id, definition.task_id, kind, spec,
            policy, definition.misfire_grace_ms, definition.enabled, definition.jitter_ms))

    def _check_grace(self, definition: TriggerDefinition | TriggerHead) -> None:
        # a claim that dies is taken over a lease later: 'skip' needs a grace beyond cadence + lease
        if self._limits is not None:
            check_misfire_grace(definition, self._limits, leased=True)

    async def _publish(self, conn, project_id: str, trigger_id: str, task_id: str, kind: str,
                       spec: Mapping[str, Any], policy: MisfirePolicy, grace_ms: int,
                       enabled: bool, jitter_ms: int = 0) -> TriggerHead:
        await _require_project(conn, project_id)
        task = await _one(conn, query("lock_task_head"), {"project_id": project_id, "task_id": task_id})
        if task is None or task["deleted_at_ms"] is not None:
            raise task_not_found(project_id, task_id)
        # digested in clear, stored with its secret values sealed (as a head reads back)
        spec = opened_trigger_spec(self._sealer, project_id, trigger_id, spec)
        stored = sealed_trigger_spec(self._sealer, project_id, trigger_id, spec)
        digest = trigger_content_digest(project_id, trigger_id, task_id, kind, spec, policy, grace_ms,
                                        enabled, jitter_ms)
        row = await _one(conn, query("lock_trigger_head"), {"trigger_id": trigger_id})
        if row is not None and row["project_id"] != project_id:
            raise trigger_id_taken(trigger_id, row["project_id"])
        if row is not None and row["content_digest"] == digest:
            return _head(trigger_id, row)
        if kind == AFTER_KIND:
            await _check_chain(conn, project_id, trigger_id, task_id, spec)
        mark = await _one(conn, query("next_trigger_revision"),
                          {"trigger_id": trigger_id,
                           "head_revision": 0 if row is None else row["trigger_revision"]})
        revision = mark["last_revision"]
        params = {
            "trigger_id": trigger_id, "project_id": project_id, "task_id": task_id,
            "trigger_revision": revision, "kind": kind, "spec_json": Jsonb(stored),
            "misfire_policy": policy.value, "misfire_grace_ms": grace_ms, "enabled": enabled,
            "content_digest": digest, "jitter_ms": jitter_ms,
        }
        await conn.execute(query("upsert_trigger_head"), params)
        await conn.execute(query("reset_schedule"), params)
        return TriggerHead(project_id, trigger_id, task_id, revision, kind, stored, policy,
                           grace_ms, enabled, digest, jitter_ms)

    async def set_trigger_enabled(self, project_id: str, trigger_id: str, enabled: bool) -> TriggerHead:
        """Enable or disable a trigger; a change is a new revision (the cursor is reset)."""
        check_enabled(enabled)

        async def body(conn):
            row = await _one(conn, query("lock_trigger_head"), {"trigger_id": trigger_id})
            if row is None or row["project_id"] != project_id:
                raise trigger_not_found(project_id, trigger_id)
            head = _head(trigger_id, row)
            if head.enabled == enabled:
                return head
            if enabled:
                # a head stored before the grace floor was enforced must not start skipping
                self._check_grace(head)
            return await self._publish(conn, project_id, trigger_id, head.task_id, head.kind,
                                       head.spec, head.misfire_policy, head.misfire_grace_ms, enabled,
                                       head.jitter_ms)

        return await self._transaction(body)

    async def delete_trigger(self, project_id: str, trigger_id: str) -> None:
        """Delete a trigger and its schedule row; its Runs stay."""
        await self._transaction(lambda conn: _delete_trigger_in(conn, project_id, trigger_id))


class _RollBack(Exception):
    """Raised at the end of a dry run so that its transaction writes nothing."""

    def __init__(self, plan: ProjectPlan) -> None:
        self.plan = plan


@record(slots=False)
class _CheckedTask:
    """A task payload checked before any transaction: the payload and execution spec as stored
    (env values sealed) and the digests of both in clear."""

    payload: Mapping[str, Any]
    payload_json: str
    digest: str
    execution: dict[str, Any] | None
    stored_execution: dict[str, Any] | None


def _checked_task(sealer: Any, project_id: str, task_id: str, payload: Mapping[str, Any]) -> _CheckedTask:
    if not isinstance(payload, Mapping):
        check_task_payload(task_id, payload)  # the contract's refusal
    plain, stored = sealed_env_payload(sealer, project_id, task_id, payload)
    check_task_payload(task_id, plain)
    execution = normalised_execution(task_id, plain)
    stored_execution = (None if execution is None
                        else sealed_env_payload(sealer, project_id, task_id, execution)[1])
    return _CheckedTask(stored, canonical_json(stored), content_digest(plain), execution, stored_execution)


async def _put_task_in(conn, project_id: str, task_id: str, task: _CheckedTask) -> TaskRecord:
    """Publish a checked payload inside the caller's transaction: a new revision (with its pinned
    execution revision) when its digest differs from the head's or the task was deleted."""
    await _require_project(conn, project_id)
    row = await _one(conn, query("lock_task_head"), {"project_id": project_id, "task_id": task_id})
    if row is not None and row["deleted_at_ms"] is None and row["content_digest"] == task.digest:
        return TaskRecord(project_id, task_id, row["task_revision"], task.payload, task.digest)
    revision = 1 if row is None else row["task_revision"] + 1
    keys = {"project_id": project_id, "task_id": task_id, "task_revision": revision}
    await conn.execute(query("upsert_task_head"), {**keys, "content_digest": task.digest})
    await conn.execute(query("insert_task_revision"),
                       {**keys, "payload_json": task.payload_json, "content_digest": task.digest})
    # the digest is of the spec in clear; the text stored has its env values sealed
    spec = execution_spec(project_id, task_id, revision, task.digest, task.execution)
    stored = execution_spec(project_id, task_id, revision, task.digest, task.stored_execution)
    await conn.execute(query("insert_execution_revision"),
                       {**keys, "spec_json": canonical_json(stored), "content_digest": content_digest(spec)})
    return TaskRecord(project_id, task_id, revision, task.payload, task.digest)


async def _delete_task_in(conn, project_id: str, task_id: str) -> None:
    row = await _one(conn, query("lock_task_head"), {"project_id": project_id, "task_id": task_id})
    if row is None or row["deleted_at_ms"] is not None:
        raise task_not_found(project_id, task_id)
    cur = await conn.execute(query("triggers_of_task"), {"project_id": project_id, "task_id": task_id})
    users = [r[0] for r in await cur.fetchall()]
    if users:
        raise task_in_use(project_id, task_id, users)
    await conn.execute(query("delete_task_head"), {"project_id": project_id, "task_id": task_id})


async def _delete_trigger_in(conn, project_id: str, trigger_id: str) -> None:
    row = await _one(conn, query("lock_trigger_head"), {"trigger_id": trigger_id})
    if row is None or row["project_id"] != project_id:
        raise trigger_not_found(project_id, trigger_id)
    await conn.execute(query("delete_schedule"), {"trigger_id": trigger_id})
    await conn.execute(query("delete_trigger_head"), {"trigger_id": trigger_id, "project_id": project_id})


async def _project_state_in(conn, project_id: str, *, lock: bool) -> ProjectState:
    """The project's state as :func:`~qinglong.contracts.apply.plan_project` reads it; with
    ``lock`` its row is locked, so a concurrent apply of the project waits for this one."""
    row = await _one(conn, query("lock_project" if lock else "read_project"), {"project_id": project_id})
    if row is None or row["deleted_at_ms"] is not None:
        return ProjectState.absent(project_id)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("project_task_heads"), {"project_id": project_id})
        task_rows = await cur.fetchall()
        await cur.execute(query("project_trigger_heads"), {"project_id": project_id})
        trigger_rows = await cur.fetchall()
    tasks = {r["task_id"]: TaskRecord(project_id, r["task_id"], r["task_revision"],
                                      json.loads(r["payload_json"]), r["content_digest"])
             for r in task_rows}
    triggers = {r["trigger_id"]: _head(r["trigger_id"], r) for r in trigger_rows}
    return ProjectState(project_id, True, row["name"], tasks, triggers)


async def _require_project(conn, project_id: str) -> None:
    cur = await conn.execute(query("project_exists"), {"project_id": project_id})
    if await cur.fetchone() is None:
        raise project_not_found(project_id)
