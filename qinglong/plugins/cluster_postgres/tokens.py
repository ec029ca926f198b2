"""API tokens and the audit log in PostgreSQL (:class:`~qinglong.contracts.tokens.TokenStore`), on
the admin role's pool. The publisher's transactions insert the pending audit entry of an API
change (:func:`write_pending_audit`) before they commit."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Awaitable, Callable, Mapping, Sequence

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from qinglong.contracts.errors import AlreadyExists, NotFound, quoted
from qinglong.contracts.tokens import AuditEntry, TokenRecord, pending_audit

from .sql import query

#: An expired console link is kept this long (then pruned as new links are made).
LINK_KEPT_MS = 86_400_000


def _token(row: Mapping[str, Any]) -> TokenRecord:
    return TokenRecord(row["token_id"], row["name"], row["scope"], tuple(row["projects"] or ()),
                       row["created_at_ms"], row["expires_at_ms"], row["revoked_at_ms"])


async def insert_audit(conn: Any, entry: AuditEntry) -> None:
    async with conn.cursor() as cur:
        await cur.execute(query("insert_audit"), {
            "at": entry.at_ms, "actor": entry.actor, "token_id": entry.token_id, "source": entry.source,
            "action": entry.action, "object": entry.object, "result": entry.result,
            "detail": Jsonb(entry.detail)})


async def write_pending_audit(conn: Any) -> Any:
    """Insert the audit entry of the API change under way in this transaction; the scope to mark
    written once the transaction committed (or None)."""
    scope = pending_audit()
    if scope is not None:
        await insert_audit(conn, scope.entry)
    return scope


class ClusterTokens:
    def __init__(self, pool_factory: Callable[[], Awaitable[Any]]) -> None:
        self._pool_factory = pool_factory

    async def _run(self, body: Callable[[Any], Awaitable[Any]]) -> Any:
        pool = await self._pool_factory()
        async with pool.connection() as conn:
            async with conn.transaction():
                return await body(conn)

    async def create_token(self, record: TokenRecord, digest: str, audit: AuditEntry) -> None:
        async def body(conn: Any) -> None:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("insert_token"), {
                    "token_id": record.token_id, "name": record.name, "digest": digest, "scope": record.scope,
                    "projects": list(record.projects), "created": record.created_at_ms,
                    "expires": record.expires_at_ms})
                if await cur.fetchone() is None:
                    raise AlreadyExists(f"a token named {quoted(record.name)} exists already (revoke it first)")
            await insert_audit(conn, audit)

        await self._run(body)

    async def revoke_token(self, name: str, now_ms: int, audit: AuditEntry) -> TokenRecord:
        async def body(conn: Any) -> TokenRecord:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("revoke_token"), {"name": name, "now": now_ms})
                row = await cur.fetchone()
            if row is None:
                raise NotFound(f"no active token named {quoted(name)}")
            await insert_audit(conn, audit)
            return _token(row)

        return await self._run(body)

    async def list_tokens(self) -> Sequence[TokenRecord]:
        async def body(conn: Any) -> list[TokenRecord]:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("list_tokens"))
                return [_token(r) for r in await cur.fetchall()]

        return await self._run(body)

    async def token_by_digest(self, digest: str) -> TokenRecord | None:
        async def body(conn: Any) -> TokenRecord | None:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("token_by_digest"), {"digest": digest})
                row = await cur.fetchone()
            return _token(row) if row is not None else None

        return await self._run(body)

    async def record_audit(self, audit: AuditEntry) -> None:
        await self._run(lambda conn: insert_audit(conn, audit))

    async def list_audit(self, since_ms: int | None = None, limit: int = 100) -> Sequence[AuditEntry]:
        async def body(conn: Any) -> list[AuditEntry]:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("list_audit"), {"since": since_ms or 0, "limit": limit})
                return [AuditEntry(r["at_ms"], r["actor"], r["token_id"], r["source"], r["action"], r["object"],
                                   r["result"], dict(r["detail"]), r["entry_id"]) for r in await cur.fetchall()]

        return await self._run(body)

    async def create_console_link(self, link_id: str, digest: str, created_at_ms: int, expires_at_ms: int,
                                  audit: AuditEntry) -> None:
        async def body(conn: Any) -> None:
            async with conn.cursor() as cur:
                # links expired a day ago are told apart from forged ones no longer
                await cur.execute(query("prune_console_links"), {"before": created_at_ms - LINK_KEPT_MS})
                await cur.execute(query("insert_console_link"), {
                    "link_id": link_id, "digest": digest, "created": created_at_ms, "expires": expires_at_ms})
            await insert_audit(conn, audit)

        await self._run(body)

    async def redeem_console_link(self, digest: str, now_ms: int, audit: AuditEntry) -> tuple[str, str | None]:
        async def body(conn: Any) -> tuple[str, str | None]:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query("use_console_link"), {"digest": digest, "now": now_ms})
                row = await cur.fetchone()
                if row is not None:
                    await insert_audit(conn, replace(audit, object=row["link_id"]))
                    return "ok", row["link_id"]
                await cur.execute(query("console_link_by_digest"), {"digest": digest})
                found = await cur.fetchone()
            if found is None:
                return "unknown", None
            return ("used" if found["used_at_ms"] is not None else "expired"), None

        return await self._run(body)
