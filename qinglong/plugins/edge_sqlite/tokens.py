"""API tokens and the audit log in the SQLite file (:class:`~qinglong.contracts.tokens.TokenStore`).

Every write transaction of this store inserts the pending audit entry
(:data:`~qinglong.contracts.tokens.CURRENT_AUDIT`) before its commit (:func:`.store.transaction`).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from typing import Sequence

from qinglong.contracts.errors import AlreadyExists, NotFound, quoted
from qinglong.contracts.tokens import AuditEntry, TokenRecord

#: An expired console link is kept this long (then pruned as new links are made).
LINK_KEPT_MS = 86_400_000

from .queries import query
from .store import SqliteStore, named_one, named_rows, transaction


def token_from_row(row: sqlite3.Row) -> TokenRecord:
    return TokenRecord(row["token_id"], row["name"], row["scope"], tuple(json.loads(row["projects_json"])),
                       row["created_at_ms"], row["expires_at_ms"], row["revoked_at_ms"])


def insert_audit(conn: sqlite3.Connection, entry: AuditEntry) -> None:
    conn.execute(query("insert_audit"), {
        "at": entry.at_ms, "actor": entry.actor, "token_id": entry.token_id, "source": entry.source,
        "action": entry.action, "object": entry.object, "result": entry.result,
        "detail": json.dumps(entry.detail, sort_keys=True)})


class SqliteTokens:
    """Tokens and audit entries; each change one transaction with its audit entry."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def create_token(self, record: TokenRecord, digest: str, audit: AuditEntry) -> None:
        def body(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                if named_one(conn, query("live_token_by_name"), (record.name,)) is not None:
                    raise AlreadyExists(f"a token named {quoted(record.name)} exists already (revoke it first)")
                conn.execute(query("insert_token"), {
                    "token_id": record.token_id, "name": record.name, "digest": digest, "scope": record.scope,
                    "projects": json.dumps(list(record.projects)), "created": record.created_at_ms,
                    "expires": record.expires_at_ms})
                insert_audit(conn, audit)

        await self._store.call(body)

    async def revoke_token(self, name: str, now_ms: int, audit: AuditEntry) -> TokenRecord:
        def body(conn: sqlite3.Connection) -> TokenRecord:
            with transaction(conn):
                row = named_one(conn, query("live_token_by_name"), (name,))
                if row is None:
                    raise NotFound(f"no active token named {quoted(name)}")
                conn.execute(query("revoke_token"), (now_ms, row["token_id"]))
                insert_audit(conn, audit)
                return token_from_row(row)

        return await self._store.call(body)

    async def list_tokens(self) -> Sequence[TokenRecord]:
        def body(conn: sqlite3.Connection) -> list[TokenRecord]:
            return [token_from_row(r) for r in named_rows(conn, query("list_tokens"))]

        return await self._store.call(body)

    async def token_by_digest(self, digest: str) -> TokenRecord | None:
        def body(conn: sqlite3.Connection) -> TokenRecord | None:
            row = named_one(conn, query("token_by_digest"), (digest,))
            return token_from_row(row) if row is not None else None

        return await self._store.call(body)

    async def record_audit(self, audit: AuditEntry) -> None:
        def body(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                insert_audit(conn, audit)

        await self._store.call(body)

    async def list_audit(self, since_ms: int | None = None, limit: int = 100) -> Sequence[AuditEntry]:
        def body(conn: sqlite3.Connection) -> list[AuditEntry]:
            return [AuditEntry(r["at_ms"], r["actor"], r["token_id"], r["source"], r["action"], r["object"],
                               r["result"], json.loads(r["detail_json"]), r["entry_id"])
                    for r in named_rows(conn, query("list_audit"), (since_ms or 0, limit))]

        return await self._store.call(body)

    async def create_console_link(self, link_id: str, digest: str, created_at_ms: int, expires_at_ms: int,
                                  audit: AuditEntry) -> None:
        def body(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                # links expired a day ago are told apart from forged ones no longer
                conn.execute(query("prune_console_links"), {"before": created_at_ms - LINK_KEPT_MS})
                conn.execute(query("insert_console_link"), {"link_id": link_id, "digest": digest,
                                                            "created": created_at_ms, "expires": expires_at_ms})
                insert_audit(conn, audit)

        await self._store.call(body)

    async def redeem_console_link(self, digest: str, now_ms: int, audit: AuditEntry) -> tuple[str, str | None]:
        def body(conn: sqlite3.Connection) -> tuple[str, str | None]:
            with transaction(conn):
                row = named_one(conn, query("use_console_link"), {"digest": digest, "now": now_ms})
                if row is not None:
                    insert_audit(conn, replace(audit, object=row["link_id"]))
                    return "ok", row["link_id"]
                found = named_one(conn, query("console_link_by_digest"), (digest,))
            if found is None:
                return "unknown", None
            return ("used" if found["used_at_ms"] is not None else "expired"), None

        return await self._store.call(body)
