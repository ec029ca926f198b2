"""The outbox of the PostgreSQL store: :class:`~qinglong.contracts.events.EventOutbox`, as the
runtime role.

The events are written by the row triggers of migration ``0009_events_outbox`` in the
transaction that ends a Run (a worker's completion, the control plane's expiry, a cancel, a
closed session) or records a skip. Here every replica's delivery loop routes them and records the
deliveries' tries; a claimed delivery is held by a lease, so two replicas do not send it together.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Awaitable, Callable, Mapping, Sequence

from psycopg.rows import dict_row

from qinglong.contracts.secrets import env_values_to_redact
from qinglong.contracts.event_sources import AdmitResult, occurrence_key, payload_json
from qinglong.contracts.events import (
    Delivery,
    DeliveryState,
    OutboxEvent,
    RunContext,
    check_episode,
)
from qinglong.contracts.store import listing_bound

from .runs import ClusterRunControl, run_uuid
from .sql import query


def _mapping(value: Any) -> dict | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def event_of(row: dict) -> OutboxEvent:
    return OutboxEvent(
        row["event_id"], row["seq"], row["kind"], row["subject"], row["project_id"],
        row["task_id"], row["trigger_id"], row["run_id"], row["state"], row["exit_code"],
        row["duration_ms"], row["reason"], row["at_ms"], _mapping(row["notify_json"]),
        _mapping(row["detail_json"]) or {})


def delivery_of(row: dict) -> Delivery:
    return Delivery(event_of(row), row["channel"], DeliveryState(row["delivery_state"]),
                    row["tries"], row["next_try_at_ms"], row["last_error"],
                    row["delivered_at_ms"], row["created_at_ms"])


class ClusterEventOutbox:
    """``run(body)`` runs ``body(conn)`` on a runtime connection (autocommit: a body that writes
    more than one statement opens its own transaction)."""

    def __init__(self, run: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]], *,
                 sealer: Any = None) -> None:
        self._run = run
        self._sealer = sealer

    async def _rows(self, name: str, params: dict) -> list[dict]:
        async def body(conn):
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query(name), params)
                return await cur.fetchall() if cur.description else []

        return await self._run(body)

    async def route(self, choose: Callable[[OutboxEvent], Sequence[str]], now_ms: int,
                    limit: int) -> int:
        bound = listing_bound(limit)

        async def body(conn):
            async with conn.transaction():
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(query("events_unrouted"), {"limit": bound})
                    rows = await cur.fetchall()
                    for row in rows:
                        event = event_of(row)
                        for channel in choose(event):
                            await cur.execute(query("events_insert_delivery"), {
                                "seq": event.seq, "channel": channel, "subject": event.subject,
                                "now": now_ms})
                        await cur.execute(query("events_mark_routed"),
                                          {"seq": event.seq, "now": now_ms})
                    return len(rows)

        return await self._run(body)

    async def claim_due(self, now_ms: int, lease_ms: int, limit: int) -> Sequence[Delivery]:
        keys = await self._rows("events_claim_due", {"now": now_ms, "until": now_ms + lease_ms,
                                                     "limit": listing_bound(limit)})
        if not keys:
            return []
        rows = await self._rows("events_deliveries_by_key", {
            "seqs": [k["event_seq"] for k in keys], "channels": [k["channel"] for k in keys]})
        return [delivery_of(row) for row in rows]

    async def record_try(self, event_id: str, channel: str, *, ok: bool, error: str | None,
                         now_ms: int, retry_in_ms: int | None) -> DeliveryState:
        if ok:
            state, next_at = DeliveryState.DELIVERED, None
        elif retry_in_ms is None:
            state, next_at = DeliveryState.DEAD, None
        else:
            state, next_at = DeliveryState.PENDING, now_ms + retry_in_ms
        rows = await self._rows("events_record_try", {
            "event_id": event_id, "channel": channel, "state": state.value, "next": next_at,
            "error": None if ok else error, "now": now_ms})
        if not rows or rows[0]["state"] is None:
            raise LookupError(f"event {event_id!r} has no delivery on {channel!r}")
        return DeliveryState(rows[0]["state"])

    async def list_deliveries(self, *, state: DeliveryState | str | None = None,
                              limit: int = 50) -> Sequence[Delivery]:
        rows = await self._rows("events_list_deliveries", {
            "state": DeliveryState(state).value if state is not None else None,
            "limit": listing_bound(limit)})
        return [delivery_of(row) for row in rows]

    async def list_events(self, *, limit: int = 50) -> Sequence[OutboxEvent]:
        rows = await self._rows("events_list", {"limit": listing_bound(limit)})
        return [event_of(row) for row in rows]

    async def prune(self, older_than_ms: int, limit: int) -> int:
        async def body(conn):
            async with conn.transaction():
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(query("events_prune"), {
                        "before": older_than_ms, "limit": max(1, min(int(limit), 1000))})
                    return (await cur.fetchone())["deleted"]

        return await self._run(body)

    async def operator_episode(self, key: str, kind: str, *, active: bool, subject: str,
                               reason: str, detail: Mapping[str, Any]) -> bool:
        check_episode(key, kind, subject, reason, detail)
        rows = await self._rows("events_operator_episode", {
            "key": key, "kind": kind, "active": active, "subject": subject, "reason": reason,
            "detail": json.dumps(dict(detail))})
        return bool(rows[0]["written"])

    async def stranded_runs(self, grace_ms: int) -> int:
        """Queued Runs no live worker can take that waited past ``grace_ms``; opens or closes the
        ``queue.stalled`` episode accordingly (``qinglong.check_stranded_runs``)."""
        rows = await self._rows("events_stranded_runs", {"grace_ms": int(grace_ms)})
        return int(rows[0]["stranded"])

    async def run_context(self, run_id: str, max_log_bytes: int) -> RunContext:
        rows = await self._rows("events_run_context", {"run_id": run_uuid(run_id)})
        if not rows:
            return RunContext()
        row = rows[0]
        values = env_values_to_redact(self._sealer, row["project_id"], row["task_id"],
                                      _mapping(row["payload_json"]))
        tail, cut = b"", False
        if row["attempt_id"] is not None and row["stored_bytes"] and max_log_bytes > 0:
            start = max(0, row["stored_bytes"] - max_log_bytes)
            control = ClusterRunControl(self._run)
            tail = await control.read_log(row["attempt_id"], start, max_log_bytes)
            cut = start > 0
        return RunContext(tail, cut, values)


class ClusterOccurrences:
    """:class:`~qinglong.contracts.event_sources.OccurrenceAdmission` as the runtime role: one
    statement checks the trigger and admits (see ``occurrence_admit``)."""

    def __init__(self, run: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]],
                 max_queued: int | None = None) -> None:
        self._run = run
        self._max_queued = max_queued  # written on each Run admitted (the claim's bound)

    async def admit_occurrence(self, kind: str, trigger_id: str, event_id: str,
                               payload: Mapping[str, Any] | None, now_ms: int) -> AdmitResult:
        key = occurrence_key(kind, trigger_id, event_id)
        payload_text = payload_json(payload)

        async def body(conn):
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("occurrence_admit"), {
                    "trigger_id": trigger_id, "kind": kind, "key": key, "now": now_ms,
                    "max_queued": self._max_queued,
                    "run_id": str(uuid.uuid4()), "attempt_id": str(uuid.uuid4()),
                    "payload": payload_text})
                return await cur.fetchone()

        row = await self._run(body)
        if row["created"] is not None:
            return AdmitResult(row["created"], True)
        if row["existing"] is not None:
            return AdmitResult(row["existing"], False)
        return AdmitResult(None, False, f"trigger {trigger_id!r} does not exist, is not of kind "
                                        f"{kind!r}, is disabled, or its project or task is not "
                                        "active")


__all__ = ["ClusterEventOutbox", "ClusterOccurrences"]
