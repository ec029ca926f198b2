"""The admin side: projects, tasks and trigger heads. Every call is one transaction.

Input is validated before the transaction starts (spec, identifiers, policy, grace), and every
existence check happens inside it, before the first write, so a refused call writes nothing.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable, Mapping

from qinglong.contracts.errors import (
    project_exists,
    project_not_found,
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
    check_task_payload,
    misfire_policy_of,
    validate_definition,
)

from .queries import q
from .store import SqliteStore, named_one, transaction


def head_from_row(row: sqlite3.Row) -> TriggerHead:
    """A :class:`TriggerHead` from a ``trigger_by_id``-shaped row, read by column name."""
    return TriggerHead(row["project_id"], row["trigger_id"], row["task_id"],
                       row["trigger_revision"], row["kind"], json.loads(row["spec_json"]),
                       MisfirePolicy(row["misfire_policy"]), row["misfire_grace_ms"],
                       bool(row["enabled"]), row["content_digest"])


def _require_project(conn: sqlite3.Connection, project_id: str) -> sqlite3.Row:
    row = named_one(conn, q("project_by_id"), (project_id,))
    if row is None:
        raise project_not_found(project_id)
    return row


def _write_trigger_revision(conn: sqlite3.Connection, head: TriggerHead, now_ms: int) -> None:
    conn.execute(q("upsert_trigger_head"), {
        "trigger_id": head.trigger_id, "project_id": head.project_id, "task_id": head.task_id,
        "revision": head.trigger_revision, "kind": head.kind, "spec": canonical_json(dict(head.spec)),
        "policy": head.misfire_policy.value, "grace": head.misfire_grace_ms,
        "enabled": int(head.enabled), "digest": head.content_digest, "now": now_ms,
    })
    # Same transaction as the head: a new revision never runs on the old revision's cursor.
    conn.execute(q("reset_schedule_for_revision"), {
        "trigger_id": head.trigger_id, "project_id": head.project_id,
        "revision": head.trigger_revision, "now": now_ms,
    })
    conn.execute(q("raise_trigger_revision_mark"),
                 {"trigger_id": head.trigger_id, "revision": head.trigger_revision})


def next_trigger_revision(conn: sqlite3.Connection, trigger_id: str, current: int) -> int:
    """The revision a new definition of ``trigger_id`` gets: above its head's ``current`` (0 when
    there is no head) and above every revision the id ever had (a trigger deleted and created
    again continues, never repeats)."""
    mark = named_one(conn, q("trigger_revision_mark"), (trigger_id,))
    return max(current, mark["high_revision"] if mark is not None else 0) + 1


def put_trigger_in(conn: sqlite3.Connection, definition: TriggerDefinition,
                   spec: Mapping[str, Any], kind: str, policy: MisfirePolicy, now_ms: int) -> TriggerHead:
    """Publish a validated definition inside the caller's open transaction."""
    _require_project(conn, definition.project_id)
    if conn.execute(q("task_head"), (definition.project_id, definition.task_id)).fetchone() is None:
        raise task_not_found(definition.project_id, definition.task_id)
    existing = named_one(conn, q("trigger_by_id"), (definition.trigger_id,))
    if existing is not None and existing["project_id"] != definition.project_id:
        raise trigger_id_taken(definition.trigger_id, existing["project_id"])
    digest = trigger_content_digest(definition.project_id, definition.trigger_id, definition.task_id,
                                    kind, spec, policy, definition.misfire_grace_ms, definition.enabled)
    if existing is not None and existing["content_digest"] == digest:
        return head_from_row(existing)
    head = TriggerHead(definition.project_id, definition.trigger_id, definition.task_id,
                       next_trigger_revision(conn, definition.trigger_id,
                                             existing["trigger_revision"] if existing is not None
                                             else 0), kind,
                       dict(spec), policy, definition.misfire_grace_ms, definition.enabled, digest)
    _write_trigger_revision(conn, head, now_ms)
    return head


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
        label = project_id if name is None else str(name)
        now = self._context.clock_ms()

        def write(conn: sqlite3.Connection) -> ProjectRecord:
            if conn.execute(q("project_by_id"), (project_id,)).fetchone() is not None:
                raise project_exists(project_id)
            conn.execute(q("insert_project"), (project_id, label, now))
            return ProjectRecord(project_id, label, True)

        return await self._in_transaction(write)

    async def put_task(self, project_id: str, task_id: str, payload: Mapping[str, Any]) -> TaskRecord:
        """Create a task or publish a new revision when its payload changed."""
        check_identifier("project_id", project_id)
        check_identifier("task_id", task_id)
        payload_json = check_task_payload(task_id, payload)
        digest = content_digest(json.loads(payload_json))
        now = self._context.clock_ms()

        def write(conn: sqlite3.Connection) -> TaskRecord:
            _require_project(conn, project_id)
            head = named_one(conn, q("task_head"), (project_id, task_id))
            if head is not None and head["content_digest"] == digest:
                return TaskRecord(project_id, task_id, head["task_revision"],
                                  json.loads(head["payload_json"]), head["content_digest"])
            revision = head["task_revision"] + 1 if head is not None else 1
            params = {"project_id": project_id, "task_id": task_id, "revision": revision,
                      "payload": payload_json, "digest": digest, "now": now}
            # The head first: task_revisions references it.
            conn.execute(q("upsert_task_head"), params)
            conn.execute(q("insert_task_revision"), params)
            return TaskRecord(project_id, task_id, revision, json.loads(payload_json), digest)

        return await self._in_transaction(write)

    async def put_trigger(self, definition: TriggerDefinition) -> TriggerHead:
        """Add a trigger or publish a new revision (resetting its cursor); unchanged is a no-op."""
        spec, kind, policy = validated(definition, self._context.providers, self._context.limits)
        now = self._context.clock_ms()
        return await self._in_transaction(put_trigger_in, definition, spec, kind, policy, now)

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
            digest = trigger_content_digest(head.project_id, head.trigger_id, head.task_id, head.kind,
                                            head.spec, head.misfire_policy, head.misfire_grace_ms, enabled)
            new = TriggerHead(head.project_id, head.trigger_id, head.task_id,
                              next_trigger_revision(conn, head.trigger_id, head.trigger_revision),
                              head.kind, head.spec, head.misfire_policy, head.misfire_grace_ms,
                              enabled, digest)
            _write_trigger_revision(conn, new, now)
            return new

        return await self._in_transaction(write)

    async def delete_trigger(self, project_id: str, trigger_id: str) -> None:
        """Delete a trigger head and its schedule row; its Runs and its revision high-water mark
        stay, so a trigger created again under the id continues its revisions."""

        def write(conn: sqlite3.Connection) -> None:
            _existing_head(conn, project_id, trigger_id)
            conn.execute(q("delete_schedule"), (trigger_id,))
            conn.execute(q("delete_trigger_head"), (trigger_id,))

        await self._in_transaction(write)


def _existing_head(conn: sqlite3.Connection, project_id: str, trigger_id: str) -> TriggerHead:
    row = named_one(conn, q("trigger_by_id"), (trigger_id,))
    if row is None or row["project_id"] != project_id:
        raise trigger_not_found(project_id, trigger_id)
    return head_from_row(row)
