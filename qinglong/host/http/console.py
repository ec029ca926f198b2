"""The web console: a static shell at ``/`` with its script and style (shipped in the package, no
build step), over the management API, signed in with a session cookie.

Sign-in (``POST /console/session``, JSON ``{"token": ...}``, the one changing route on the public
list) checks the token as a bearer token is checked and answers an HttpOnly, SameSite=Strict
cookie (Secure under TLS or behind a TLS-terminating proxy) and a CSRF token. The session keeps
the token's digest, never its secret: every request looks the token up again, so a revoked token
fails at its next request. A changing request made with the cookie must carry the CSRF token in
``X-CSRF-Token`` (:class:`.app.Guard`). A session unused for ``idle_ms`` is gone.

A one-time link made on the host (``qinglong console link``: ``GET /console/link?code=...``) is
redeemed once in the store, with its audit entry, and signs the browser in as the host's admin (no
token behind it); the answer is a redirect to ``/``, so the code does not stay in the address bar.
A used, expired or unknown code answers a page saying so and changes nothing.

Sessions are bounded per principal (a token, or the host's links together): signing in past its
own bound ends that principal's least recently used session, never another's. The console's
total is bounded too: when it is reached (idle sessions swept first) a new sign-in is refused
(503), so no principal can sign another out by signing in many times.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from .app import CSRF_HEADER, PUBLIC, SESSION_COOKIE, Method, RouteSpec, error_response
from .auth import AuthFailure, Principal, RateLimited

#: A session unused this long is signed out.
SESSION_IDLE_MS = 30 * 60 * 1000
#: Sessions kept at most in all: past it a sign-in is refused, nobody is signed out.
MAX_SESSIONS = 1024
#: Sessions one principal keeps at most (its own least recently used go first).
MAX_SESSIONS_PER_PRINCIPAL = 16
#: The principal of every session a one-time link opened (the host's admin).
LINK_OWNER = "link"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
       "form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
ASSETS = {"/console/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/console/app.css": ("app.css", "text/css; charset=utf-8")}


@dataclass
class Session:
    digest: str  # the token's digest; empty for a link's session
    csrf: str
    last_used_ms: int
    principal: Principal | None = None  # a link's session: the host's admin, no token behind it
    owner: str = ""  # whose session it is: the per-principal bound counts by it


class SessionsFull(Exception):
    """The console holds its most sessions: a sign-in is refused rather than signing anyone out."""

    def __init__(self, limit: int, idle_ms: int) -> None:
        super().__init__(f"the console holds its most sessions ({limit}) signed in: sign in again once "
                         f"others sign out or stay unused for {idle_ms // 60_000} minutes")


class Sessions:
    """The signed-in browsers, in memory (a restart signs everyone out), least recently used first."""

    def __init__(self, idle_ms: int = SESSION_IDLE_MS, clock_ms: Callable[[], int] | None = None,
                 limit: int = MAX_SESSIONS, per_principal: int = MAX_SESSIONS_PER_PRINCIPAL) -> None:
        self.idle_ms = idle_ms
        self.clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.limit = limit
        self.per_principal = per_principal
        self._sessions: dict[str, Session] = {}

    def _own(self, owner: str) -> list[str]:
        """The owner's sessions, least recently used first."""
        return [sid for sid, s in self._sessions.items() if s.owner == owner]

    def _sweep_idle(self) -> None:
        now = self.clock_ms()
        for sid in [sid for sid, s in self._sessions.items() if now - s.last_used_ms >= self.idle_ms]:
            del self._sessions[sid]

    def has_room(self, owner: str) -> bool:
        """Whether ``owner`` may sign in now without anyone else's session ending."""
        if len(self._sessions) < self.limit or len(self._own(owner)) >= self.per_principal:
            return True
        self._sweep_idle()
        return len(self._sessions) < self.limit

    def create(self, owner: str, digest: str, principal: Principal | None = None, *,
               past_bound: bool = False) -> tuple[str, Session]:
        """A new session of ``owner``: its own least recently used end past its bound; the
        console full, :class:`SessionsFull` (``past_bound``: a link already used up, checked
        with :meth:`has_room` before, goes past the total rather than being lost)."""
        own = self._own(owner)
        while len(own) >= self.per_principal:
            self._sessions.pop(own.pop(0))
        if len(self._sessions) >= self.limit and not past_bound:
            self._sweep_idle()
            if len(self._sessions) >= self.limit:
                raise SessionsFull(self.limit, self.idle_ms)
        session_id = secrets.token_urlsafe(32)
        session = Session(digest, secrets.token_urlsafe(32), self.clock_ms(), principal, owner)
        self._sessions[session_id] = session
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        """The session, its idle clock restarted; None when unknown or idle too long."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        now = self.clock_ms()
        if now - session.last_used_ms >= self.idle_ms:
            return None
        session.last_used_ms = now
        self._sessions[session_id] = session  # most recently used last
        return session

    def drop(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)


#: What a refused link's page says, by the store's answer.
LINK_REFUSALS = {
    "used": (410, "This sign-in link was used already: each link works once."),
    "expired": (410, "This sign-in link has expired."),
    "unknown": (404, "This sign-in link is not valid."),
}


def _link_page(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """A refused link's page: what happened and what to do, no script, nothing else."""
    from html import escape

    body = ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width, initial-scale=1'>"
            "<title>Qinglong: sign-in link refused</title><link rel=stylesheet href='/console/app.css'></head>"
            f"<body><main><h1>Sign-in link refused</h1><p id=link-refused>{escape(message)}</p>"
            "<p>Make a new one on the host: <code>qinglong console link</code>, or "
            "<a href='/'>sign in with a token</a>.</p></main></body></html>")
    return HTMLResponse(body, status_code=status,
                        headers={"Content-Security-Policy": CSP, "Referrer-Policy": "no-referrer",
                                 "X-Frame-Options": "DENY", **(headers or {})})


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("assets", name).read_bytes()


class Console:
    """The console's routes; ``guard`` is the application's (its authenticator and sessions)."""

    def __init__(self, guard: Any, *, secure: bool, sessions: Sessions | None = None, links: Any = None,
                 wall_ms: Callable[[], int] | None = None) -> None:
        self.guard = guard
        #: the store's :class:`~qinglong.contracts.tokens.TokenStore` (console links), or None
        self.links = links
        self.wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self.sessions = sessions or Sessions()
        guard.sessions = self.sessions
        self.secure = secure
        self._files = {name: _asset(name) for name in ("index.html", "app.js", "app.css")}

    def _static(self, name: str, media_type: str) -> Response:
        return Response(self._files[name], media_type=media_type,
                        headers={"Content-Security-Policy": CSP, "Referrer-Policy": "no-referrer",
                                 "X-Frame-Options": "DENY"})

    async def shell(self, request: Request, principal: Any) -> Response:
        return self._static("index.html", "text/html; charset=utf-8")

    async def asset(self, request: Request, principal: Any) -> Response:
        name, media_type = ASSETS[request.url.path]
        return self._static(name, media_type)

    async def sign_in(self, request: Request, principal: Any) -> Response:
        """A token in a JSON body: a session cookie and its CSRF token. A cross-site form cannot
        send JSON, and a browser's Origin from another site is refused."""
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            return error_response(403, "csrf", "sign-in from another origin is refused")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return error_response(415, "invalid", "sign-in takes a JSON body: {\"token\": \"...\"}")
        from .api import _field, _known_keys, json_body

        body = await json_body(request)
        _known_keys(body, "token")
        token = _field(body, "token", str)
        source = self.guard.source_of(request)
        try:
            found: Principal = await self.guard.authenticator.authenticate(f"Bearer {token.strip()}", source)
        except RateLimited as limited:
            return error_response(429, "rate_limited", "too many failed authentications from this address",
                                  headers={"Retry-After": str(limited.retry_after_s)})
        except AuthFailure as failure:
            return error_response(401, "unauthorized", str(failure))
        if found.scrape_only or found.token_id is None:
            return error_response(401, "unauthorized", "sign in with an API token (qinglong token create)")
        from qinglong.contracts.tokens import token_digest

        try:
            session_id, session = self.sessions.create(f"token:{found.token_id}", token_digest(token.strip()))
        except SessionsFull as full:
            return error_response(503, "sessions_full", str(full), headers={"Retry-After": "60"})
        response = JSONResponse(self._who(found, session.csrf))
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict", secure=self.secure,
                            path="/")
        return response

    async def link(self, request: Request, principal: Any) -> Response:
        """Redeem a one-time link: a session cookie (the host's admin) and a redirect to ``/``; a
        used, expired or unknown code a page saying so, nothing changed."""
        from qinglong.contracts.tokens import LINK_CODE_PREFIX, AuditEntry, token_digest

        from ..tokens import LINK_ACTOR

        if request.method != "GET":  # a HEAD (a link preview's probe) uses nothing up
            return Response(status_code=405, headers={"Allow": "GET"})
        source = self.guard.source_of(request)
        limiter = self.guard.authenticator.limiter
        try:
            limiter.check(source)
        except RateLimited as limited:
            return _link_page(429, "Too many failed sign-ins from this address. Wait a moment and try again.",
                              {"Retry-After": str(limited.retry_after_s)})
        code = request.query_params.get("code", "")
        if not self.sessions.has_room(LINK_OWNER):  # refused before the code is used up
            full = SessionsFull(self.sessions.limit, self.sessions.idle_ms)
            return _link_page(503, f"{full} The link is not used up: open it again then.", {"Retry-After": "60"})
        outcome, link_id = "unknown", None
        if self.links is not None and code.startswith(LINK_CODE_PREFIX) and len(code) <= 128:
            now = self.wall_ms()
            audit = AuditEntry(now, LINK_ACTOR, None, source, "console.sign_in", "", "ok", {"scope": "admin"})
            outcome, link_id = await self.links.redeem_console_link(token_digest(code), now, audit)
        if outcome != "ok" or link_id is None:
            limiter.failed(source)
            return _link_page(*LINK_REFUSALS[outcome])
        found = Principal(f"{LINK_ACTOR} {link_id[:8]}", "admin", source=source)
        session_id, _ = self.sessions.create(LINK_OWNER, "", principal=found, past_bound=True)
        response = RedirectResponse("/", status_code=303, headers={"Referrer-Policy": "no-referrer"})
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict", secure=self.secure,
                            path="/")
        return response

    @staticmethod
    def _who(principal: Principal, csrf: str) -> dict[str, Any]:
        return {"name": principal.name, "scope": principal.scope, "csrf": csrf,
                "projects": sorted(principal.projects) if principal.projects is not None else None}

    def _current(self, request: Request) -> tuple[str, Any] | None:
        session_id = request.cookies.get(SESSION_COOKIE, "")
        session = self.sessions.get(session_id) if session_id else None
        return (session_id, session) if session is not None else None

    async def who(self, request: Request, principal: Principal) -> Response:
        """Who is signed in, the scope and the CSRF token (a reloaded page reads them here)."""
        current = self._current(request)
        if current is None:
            return error_response(401, "unauthorized", "not signed in to the console")
        return JSONResponse(self._who(principal, current[1].csrf))

    async def sign_out(self, request: Request, principal: Principal) -> Response:
        current = self._current(request)
        if current is not None:
            self.sessions.drop(current[0])
        response = Response(status_code=204)
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=self.secure)
        return response

    def routes(self) -> list[RouteSpec]:
        return [
            RouteSpec("/", {"GET": Method(PUBLIC, self.shell, "the web console")}),
            RouteSpec("/console/app.js", {"GET": Method(PUBLIC, self.asset, "the console's script")}),
            RouteSpec("/console/app.css", {"GET": Method(PUBLIC, self.asset, "the console's style")}),
            RouteSpec("/console/link", {"GET": Method(PUBLIC, self.link, "a one-time sign-in link "
                                                      "(qinglong console link): a session, then /")}),
            RouteSpec("/console/session", {
                "POST": Method(PUBLIC, self.sign_in, "sign in with a token: a session cookie"),
                "GET": Method("read", self.who, "the signed-in token's name and scope"),
                "DELETE": Method("read", self.sign_out, "sign out")}),
        ]


__all__ = ["CSRF_HEADER", "Console", "Session", "Sessions", "SessionsFull"]
