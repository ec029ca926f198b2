"""API tokens and the audit log: the rules both stores and the HTTP layer share.

A token's secret is ``qlt_`` + 43 characters of URL-safe base64 (256 random bits), shown once; the
store keeps only its SHA-256 digest (hex), looked up on every request. Scopes nest:
``admin`` > ``write`` > ``run`` > ``read``.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import field
from contextvars import ContextVar
from typing import Any, Protocol, Sequence, runtime_checkable

from .frozen import record

#: In order: each scope allows everything the ones before it allow.
SCOPES = ("read", "run", "write", "admin")
SECRET_PREFIX = "qlt_"
#: A console sign-in link's one-time code starts with this.
LINK_CODE_PREFIX = "qlc_"
#: What redeeming a console link can answer: signed in, or refused (and why).
LINK_OUTCOMES = ("ok", "used", "expired", "unknown")
#: Audit results.
AUDIT_RESULTS = ("ok", "refused", "failed")


def scope_allows(held: str, needed: str) -> bool:
    """True when a token of scope ``held`` may do what needs ``needed``."""
    return SCOPES.index(held) >= SCOPES.index(needed)


def new_secret() -> str:
    """A fresh token secret (256 bits from the OS's CSPRNG)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_link_code() -> str:
    """A fresh console sign-in code (256 bits from the OS's CSPRNG), shown once in a URL."""
    return LINK_CODE_PREFIX + secrets.token_urlsafe(32)


def token_digest(secret: str) -> str:
    """What the store keeps and looks up: the SHA-256 of the secret, hex. A secret is random and
    long, so no slow hash is needed (nothing to guess from the digest)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@record(slots=False)
class TokenRecord:
    """A token as stored (never its secret)."""

    token_id: str
    name: str
    scope: str
    projects: tuple[str, ...]  # empty: every project
    created_at_ms: int
    expires_at_ms: int | None
    revoked_at_ms: int | None
    last_used_at_ms: int | None = None

    def state(self, now_ms: int) -> str:
        if self.revoked_at_ms is not None:
            return "revoked"
        if self.expires_at_ms is not None and self.expires_at_ms <= now_ms:
            return "expired"
        return "active"

    def as_json(self, now_ms: int) -> dict[str, Any]:
        return {"id": self.token_id, "name": self.name, "scope": self.scope, "projects": list(self.projects),
                "created_at_ms": self.created_at_ms, "expires_at_ms": self.expires_at_ms,
                "revoked_at_ms": self.revoked_at_ms, "state": self.state(now_ms)}


@record(slots=False)
class AuditEntry:
    """One change, recorded with it: who (token name and id, or the host's CLI), from where, what,
    on which object, and how it ended. Never a secret or an env value."""

    at_ms: int
    actor: str  # the token's name, or "cli" on the host
    token_id: str | None
    source: str  # the client's address, or "local"
    action: str  # "token.create", "task.put", "run.cancel", ...
    object: str  # "ops/backup", a token's name, a run id
    result: str = "ok"
    detail: dict[str, Any] = field(default_factory=dict)
    entry_id: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.entry_id, "at_ms": self.at_ms, "actor": self.actor, "token_id": self.token_id,
                "source": self.source, "action": self.action, "object": self.object, "result": self.result,
                "detail": dict(self.detail)}


@runtime_checkable
class TokenStore(Protocol):
    """Tokens and the audit log, in a backend's store. Every change writes its audit entry in the
    same transaction."""

    async def create_token(self, record: TokenRecord, digest: str, audit: AuditEntry) -> None: ...

    async def revoke_token(self, name: str, now_ms: int, audit: AuditEntry) -> TokenRecord: ...

    async def list_tokens(self) -> Sequence[TokenRecord]: ...

    async def token_by_digest(self, digest: str) -> TokenRecord | None: ...

    async def record_audit(self, audit: AuditEntry) -> None: ...

    async def list_audit(self, since_ms: int | None = None, limit: int = 100) -> Sequence[AuditEntry]: ...

    async def create_console_link(self, link_id: str, digest: str, created_at_ms: int, expires_at_ms: int,
                                  audit: AuditEntry) -> None:
        """Keep a console sign-in link: its code's digest (never the code), until ``expires_at_ms``."""
        ...

    async def redeem_console_link(self, digest: str, now_ms: int, audit: AuditEntry) -> tuple[str, str | None]:
        """Use the link whose code hashes to ``digest`` once: ``("ok", link_id)`` and ``audit``
        (its object the link's id) written in the same transaction; else ``("used" | "expired" | "unknown", None)`` and
        nothing written. Two concurrent redemptions of one code: one ``ok``, one ``used``."""
        ...


class AuditScope:
    """The audit entry of the change under way (held in :data:`CURRENT_AUDIT` by the API while it
    calls the store): the store's write transaction inserts it before its commit, once, so the
    entry is durable exactly when the change is."""

    def __init__(self, entry: AuditEntry) -> None:
        self.entry = entry
        self.written = False


#: Set by the API around a changing call; read by each store's write transaction.
CURRENT_AUDIT: ContextVar[AuditScope | None] = ContextVar("qinglong_current_audit", default=None)


def pending_audit() -> AuditScope | None:
    """The audit entry a write transaction starting now must insert, if any."""
    scope = CURRENT_AUDIT.get()
    return scope if scope is not None and not scope.written else None


def check_token_name(name: str) -> str:
    """A token's name: 1-64 characters of letters, digits, ``-``, ``_``, ``.``, ``@``."""
    import re

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}", name):
        from .errors import UserError, quoted

        raise UserError(f"invalid token name {quoted(name)}: expected 1-64 letters, digits, '.', '_', '-' or '@', "
                        "starting with a letter or digit")
    return name


def check_scope(scope: str) -> str:
    if scope not in SCOPES:
        from .errors import UserError, quoted

        raise UserError(f"invalid scope {quoted(scope)}: expected one of {', '.join(SCOPES)}")
    return scope
