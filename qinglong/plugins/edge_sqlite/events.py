"""The outbox of the SQLite store: :class:`~qinglong.contracts.events.EventOutbox`.

The events themselves are written by the triggers of migration ``0008_events_outbox``, inside the
transaction that ends a Run or records a skip; this module routes them to channels and records the
deliveries' tries, each call one short ``BEGIN IMMEDIATE`` transaction on the store's thread.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from typing import Any, Callable, Mapping, Sequence

from qinglong.contracts.events import (
    EPISODE_RECOVERY,
    Delivery,
    DeliveryState,
    OutboxEvent,
    RunContext,
    check_episode,
)
from qinglong.contracts.secrets import env_values_to_redact
from qinglong.contracts.store import listing_bound

from .queries import query
from .store import SqliteStore, named_one, named_rows, transaction


def _json(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def event_of(row: sqlite3.Row) -> OutboxEvent:
    return OutboxEvent(
        row["event_id"], row["seq"], row["kind"], row["subject"], row["project_id"],
        row["task_id"], row["trigger_id"], row["run_id"] or None, row["state"], row["exit_code"],
        row["duration_ms"], row["reason"], row["at_ms"], _json(row["notify_json"]),
        _json(row["detail_json"]) or {})


def delivery_of(row: sqlite3.Row) -> Delivery:
    return Delivery(event_of(row), row["channel"], DeliveryState(row["delivery_state"]),
                    row["tries"], row["next_try_at_ms"], row["last_error"],
                    row["delivered_at_ms"], row["created_at_ms"])


def read_tail(path: str, max_bytes: int) -> tuple[bytes, bool]:
    """The last ``max_bytes`` of a file and whether that cut its start; nothing if unreadable."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            return f.read(max_bytes), start > 0
    except OSError:
        return b"", False


class SqliteEventOutbox:
    """Implements :class:`qinglong.contracts.events.EventOutbox` on the backend's store."""

    def __init__(self, store: SqliteStore, clock_ms: Callable[[], int] | None = None, *,
                 sealer: Any = None) -> None:
        import time

        self._store = store
        self._sealer = sealer
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)

    async def route(self, choose: Callable[[OutboxEvent], Sequence[str]], now_ms: int,
                    limit: int) -> int:
        bound = listing_bound(limit)

        def work(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                rows = named_rows(conn, query("events_unrouted"), {"limit": bound}, bound)
                for row in rows:
                    event = event_of(row)
                    for channel in choose(event):
                        conn.execute(query("events_insert_delivery"), {
                            "seq": event.seq, "channel": channel, "subject": event.subject,
                            "now": now_ms})
                    conn.execute(query("events_mark_routed"), {"seq": event.seq, "now": now_ms})
                return len(rows)

        return await self._store.call(work)

    async def claim_due(self, now_ms: int, lease_ms: int, limit: int) -> Sequence[Delivery]:
        bound = listing_bound(limit)

        def work(conn: sqlite3.Connection) -> list[Delivery]:
            with transaction(conn):
                found = []
                for seq, channel in conn.execute(query("events_due"),
                                                 {"now": now_ms, "limit": bound}).fetchall():
                    conn.execute(query("events_hold"), {"until": now_ms + lease_ms, "seq": seq,
                                                        "channel": channel})
                    found.append(delivery_of(named_one(conn, query("events_delivery"),
                                                       {"seq": seq, "channel": channel})))
                return found

        return await self._store.call(work)

    async def record_try(self, event_id: str, channel: str, *, ok: bool, error: str | None,
                         now_ms: int, retry_in_ms: int | None) -> DeliveryState:
        if ok:
            state, next_at = DeliveryState.DELIVERED, None
        elif retry_in_ms is None:
            state, next_at = DeliveryState.DEAD, None
        else:
            state, next_at = DeliveryState.PENDING, now_ms + retry_in_ms

        def work(conn: sqlite3.Connection) -> DeliveryState:
            with transaction(conn):
                seq = conn.execute(query("events_seq_of"), {"event_id": event_id}).fetchone()
                if seq is None:
                    raise LookupError(f"event {event_id!r} does not exist")
                conn.execute(query("events_record_try"), {
                    "state": state.value, "next": next_at, "error": None if ok else error,
                    "now": now_ms, "seq": seq[0], "channel": channel})
                row = named_one(conn, query("events_delivery"), {"seq": seq[0], "channel": channel})
                if row is None:
                    raise LookupError(f"event {event_id!r} has no delivery on {channel!r}")
                return DeliveryState(row["delivery_state"])

        return await self._store.call(work)

    async def list_deliveries(self, *, state: DeliveryState | str | None = None,
                              limit: int = 50) -> Sequence[Delivery]:
        bound = listing_bound(limit)
        params = {"state": DeliveryState(state).value if state is not None else None,
                  "limit": bound}
        rows = await self._store.call(named_rows, query("events_list_deliveries"), params, bound)
        return [delivery_of(row) for row in rows]

    async def list_events(self, *, limit: int = 50) -> Sequence[OutboxEvent]:
        bound = listing_bound(limit)
        rows = await self._store.call(named_rows, query("events_list"), {"limit": bound}, bound)
        return [event_of(row) for row in rows]

    async def prune(self, older_than_ms: int, limit: int) -> int:
        bound = max(1, min(int(limit), 1000))

        def work(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                params = {"before": older_than_ms, "limit": bound}
                conn.execute(query("events_prune_deliveries"), params)
                return conn.execute(query("events_prune_events"), params).rowcount

        return await self._store.call(work)

    async def operator_episode(self, key: str, kind: str, *, active: bool, subject: str,
                               reason: str, detail: Mapping[str, Any]) -> bool:
        check_episode(key, kind, subject, reason, detail)
        now_ms = self._clock_ms()

        def work(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                if active:
                    written = conn.execute(query("episode_open"), {
                        "key": key, "kind": kind, "now": now_ms,
                        "detail": json.dumps(dict(detail))}).rowcount
                    event_kind, event_detail = kind, dict(detail)
                else:
                    row = conn.execute(query("episode_opened_at"),
                                       {"key": key, "kind": kind}).fetchone()
                    written = row is not None and conn.execute(
                        query("episode_close"), {"key": key, "kind": kind}).rowcount
                    event_kind = EPISODE_RECOVERY[kind]
                    event_detail = {**dict(detail), "since_ms": row[0] if row else None}
                if not written:
                    return False
                conn.execute(query("episode_event"), {
                    "event_id": uuid.uuid4().hex, "kind": event_kind, "subject": subject,
                    "reason": reason, "detail": json.dumps(event_detail), "now": now_ms})
                return True

        return await self._store.call(work)

    async def run_context(self, run_id: str, max_log_bytes: int) -> RunContext:
        row = await self._store.call(named_one, query("events_run_context"), {"run_id": run_id})
        if row is None:
            return RunContext()
        values = env_values_to_redact(self._sealer, row["project_id"], row["task_id"],
                                      _json(row["payload_json"]))
        tail, cut = b"", False
        if row["attempt_dir"] and max_log_bytes > 0:
            tail, cut = read_tail(os.path.join(row["attempt_dir"], "log"), max_log_bytes)
        return RunContext(tail, cut, values)


__all__ = ["SqliteEventOutbox"]
