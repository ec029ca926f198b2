"""Who is asking: a bearer token checked against the ``[http] token`` (the metrics and the status
page only) or against the store's API tokens (hash only), with failed attempts rate-limited per
source address."""

from __future__ import annotations

import hmac
import time
from typing import Any, Callable

from qinglong.contracts.frozen import record
from qinglong.contracts.tokens import SCOPES, TokenRecord, scope_allows, token_digest

__all__ = ["SCOPES", "AuthFailure", "Authenticator", "FailureLimiter", "Principal", "RateLimited"]


class AuthFailure(Exception):
    """The credentials presented do not open anything (the message never carries them)."""


class RateLimited(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__("rate limited")
        self.retry_after_s = retry_after_s


@record(slots=False)
class Principal:
    name: str
    scope: str
    token_id: str | None = None
    projects: frozenset[str] | None = None  # None: every project
    scrape_only: bool = False  # the [http] token: metrics and page only
    source: str = ""

    def allows(self, needed: str) -> bool:
        return scope_allows(self.scope, needed)

    def sees(self, project_id: str) -> bool:
        return self.projects is None or project_id in self.projects


class FailureLimiter:
    """At most ``burst`` failed authentications per source address, refilled at ``per_second``;
    beyond that the address is answered 429 until a token is back, without reading the store.
    Other addresses are never slowed. Bounded in memory: the least recently seen addresses go first."""

    def __init__(self, burst: int = 20, per_second: float = 1.0, max_sources: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.per_second = per_second
        self.max_sources = max_sources
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def _level(self, source: str) -> float:
        now = self.clock()
        tokens, at = self._buckets.get(source, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.per_second)

    def check(self, source: str) -> None:
        """Raise :class:`RateLimited` when the address has no failure left to spend."""
        level = self._level(source)
        if level < 1:
            raise RateLimited(max(1, int((1 - level) / self.per_second + 0.999)))

    def failed(self, source: str) -> None:
        level = self._level(source)
        self._buckets.pop(source, None)
        self._buckets[source] = (level - 1, self.clock())
        while len(self._buckets) > self.max_sources:
            self._buckets.pop(next(iter(self._buckets)))


class Authenticator:
    """``Authorization: Bearer <secret>``: the scrape token, or an API token looked up by its
    digest (``lookup(digest) -> TokenRecord | None``, read on every request, so a revoked or
    expired token fails at its next request, kept-alive connection or not)."""

    def __init__(self, *, scrape_token: bytes | None, lookup: Callable[[str], Any] | None,
                 limiter: FailureLimiter | None = None, clock_ms: Callable[[], int] | None = None) -> None:
        self._scrape_token = scrape_token
        self._lookup = lookup
        self.limiter = limiter or FailureLimiter()
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)

    async def authenticate(self, header: str, source: str) -> Principal:
        self.limiter.check(source)
        scheme, _, presented = header.strip().partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented or len(presented) > 512:
            self.limiter.failed(source)
            raise AuthFailure("a bearer token is required (Authorization: Bearer <token>)")
        secret = presented.encode("utf-8", "replace")
        if self._scrape_token is not None and hmac.compare_digest(secret, self._scrape_token):
            return Principal("http-token", "read", scrape_only=True, source=source)
        return await self.by_digest(token_digest(presented), source)

    async def by_digest(self, digest: str, source: str) -> Principal:
        """The API token whose digest this is (a console session keeps the digest, never the secret)."""
        record: TokenRecord | None = None
        if self._lookup is not None:
            record = await self._lookup(digest)
        if record is None or record.revoked_at_ms is not None or (
                record.expires_at_ms is not None and record.expires_at_ms <= self._clock_ms()):
            self.limiter.failed(source)
            raise AuthFailure("the token is unknown, revoked or expired")
        return Principal(record.name, record.scope, token_id=record.token_id,
                         projects=frozenset(record.projects) if record.projects else None, source=source)
