"""Making and revoking API tokens, and reading the audit log: one implementation for the CLI
(``qinglong token``, ``qinglong audit``) and the API (``/api/v1/tokens``, ``/api/v1/audit``)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Sequence

from qinglong.contracts.capabilities import TokenBackend
from qinglong.contracts.errors import UserError
from qinglong.contracts.store import check_granted_projects
from qinglong.contracts.tokens import (
    AuditEntry,
    TokenRecord,
    TokenStore,
    check_scope,
    check_token_name,
    new_secret,
    token_digest,
)

#: The longest a token may live (``--expires``): ten years.
MAX_EXPIRY_MS = 10 * 365 * 86_400_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def token_store_of(backend: Any) -> TokenStore:
    if not isinstance(backend, TokenBackend):
        raise UserError(f"the {getattr(backend, 'name', 'profile')} backend keeps no API tokens")
    return backend.tokens()


async def create_token(store: TokenStore, name: str, scope: str, projects: Sequence[str] = (),
                       expires_in_ms: int | None = None, *, actor: str = "cli", actor_id: str | None = None,
                       source: str = "local") -> tuple[TokenRecord, str]:
    """A new token and its secret (shown once; only its digest is stored), with its audit entry."""
    check_token_name(name)
    check_scope(scope)
    check_granted_projects("token projects", projects)
    if expires_in_ms is not None and not 0 < expires_in_ms <= MAX_EXPIRY_MS:
        raise UserError("--expires: expected a duration from 1s to 3650d")
    at = now_ms()
    record = TokenRecord(uuid.uuid4().hex, name, scope, tuple(sorted(set(projects))), at,
                         at + expires_in_ms if expires_in_ms is not None else None, None)
    secret = new_secret()
    audit = AuditEntry(at, actor, actor_id, source, "token.create", name, "ok",
                       {"scope": scope, "projects": list(record.projects), "expires_at_ms": record.expires_at_ms,
                        "token_id": record.token_id})
    await store.create_token(record, token_digest(secret), audit)
    return record, secret


async def revoke_token(store: TokenStore, name: str, *, actor: str = "cli", actor_id: str | None = None,
                       source: str = "local") -> TokenRecord:
    check_token_name(name)
    at = now_ms()
    audit = AuditEntry(at, actor, actor_id, source, "token.revoke", name, "ok")
    return await store.revoke_token(name, at, audit)


#: The principal a console link signs a browser in as: the host's operator, admin of every
#: project (the name is no valid token name, so no token can pass for it).
LINK_ACTOR = "console link"


async def create_console_link(store: TokenStore, ttl_ms: int) -> tuple[str, str, int]:
    """A one-time console sign-in code, its link id and its expiry (epoch ms): only the code's
    digest is stored, with the audit entry ``console.link`` of the host's CLI."""
    from qinglong.contracts.tokens import new_link_code

    at = now_ms()
    link_id = uuid.uuid4().hex
    code = new_link_code()
    audit = AuditEntry(at, "cli", None, "local", "console.link", link_id, "ok",
                       {"expires_at_ms": at + ttl_ms, "scope": "admin"})
    await store.create_console_link(link_id, token_digest(code), at, at + ttl_ms, audit)
    return code, link_id, at + ttl_ms
