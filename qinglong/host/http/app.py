"""The one HTTP application: the probes, ``/metrics``, the status page and the management API, on
Starlette. One router decides both the handler and its protection.

Every route is declared here with, per method, the protection it needs: a scope (``read`` <
``run`` < ``write`` < ``admin``) that a token must hold, or :data:`PUBLIC`, which only a path of
:data:`PUBLIC_PATHS` (the probes) may take; :func:`build_app` refuses any other. The check runs
in the route's own endpoint, on the route the router matched: no prefix test in a middleware, no
rewrite in front of the router. A path no route matches is answered 401 without a valid token and
404 with one; a method a route does not declare is answered 401 without a valid token, 405 with.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import field
from typing import Any, Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from qinglong.contracts.errors import SecretsError, UserError
from qinglong.contracts.frozen import record

from .auth import SCOPES, AuthFailure, Authenticator, Principal, RateLimited

TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
#: The probes: an orchestrator's probe cannot send a token.
PROBE_PATHS = frozenset({"/livez", "/readyz"})
#: The web console's shell, its two assets (no data in any of them), its sign-in and its one-time
#: link (``GET /console/link?code=``: the code is the credential, checked by its handler).
CONSOLE_PUBLIC_PATHS = frozenset({"/", "/console/app.js", "/console/app.css", "/console/session",
                                  "/console/link"})
#: The only paths whose methods may answer without a token (the explicit public list).
PUBLIC_PATHS = PROBE_PATHS | CONSOLE_PUBLIC_PATHS
#: The one changing method served without a token: the console's sign-in, which takes a token in
#: its body and changes nothing in the store.
PUBLIC_CHANGING = frozenset({("POST", "/console/session")})
#: The one changing method a read token may call: sign-out, which ends only the caller's session.
READ_CHANGING = frozenset({("DELETE", "/console/session")})
#: The console's session cookie and the header carrying its CSRF token.
SESSION_COOKIE = "qinglong_session"
CSRF_HEADER = "x-csrf-token"
#: The protection of a probe.
PUBLIC = "public"
#: Paths that answer without a token because each request proves itself another way, with why.
#: A route there takes :data:`SIGNED` and its handler does the proving.
SIGNED_PATHS = {
    "/api/v1/hooks/{project}/{trigger}": "an incoming webhook: the sender holds the trigger's secret, "
                                         "not a token; its HMAC signature and timestamp are checked",
}
#: The protection of a route of :data:`SIGNED_PATHS`.
SIGNED = "signed"
#: The worker gateway's paths: they answer a registered worker's token and nothing else (an API
#: token, the scrape token and a console session open none of them), and a worker's token opens
#: no other path (it is no API token). A route there takes :data:`WORKER`; its handler
#: authenticates the worker.
WORKER_PREFIX = "/worker/v1/"
#: The protection of a worker gateway route.
WORKER = "worker"
#: The methods a route answers without changing anything.
SAFE_METHODS = frozenset({"GET", "HEAD"})

Handler = Callable[[Request, "Principal | None"], Awaitable[Response]]


@record(slots=False)
class Method:
    """One method of a route: what it needs, what answers it, and what the API document says."""

    scope: str  # PUBLIC or one of SCOPES
    handler: Handler
    summary: str = ""
    #: the metrics and the status page: also open to the ``[http] token`` (a Prometheus scrape)
    scrape: bool = False
    body: Mapping[str, Any] | None = None  # the JSON schema of the request body (API document)
    query: Mapping[str, str] = field(default_factory=dict)  # query parameter -> description
    responses: Mapping[int, str] = field(default_factory=dict)
    #: what it reads or changes spans every project (tokens, the audit log, the status): a token
    #: limited to projects is refused, whatever its scope
    every_project: bool = False


@record(slots=False)
class RouteSpec:
    path: str
    methods: Mapping[str, Method]
    api: bool = False  # part of /api/v1 (in the API document)


class RouteRefused(Exception):
    """A route declared without a protection it may have (a bug in the route table)."""


def error_response(status: int, code: str, message: str, field_name: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The one error shape: ``{"error": {"code", "message", "field"}}``."""
    return JSONResponse({"error": {"code": code, "message": message, "field": field_name}},
                        status_code=status, headers=dict(headers or {}))


def _unauthorized(message: str = "a valid bearer token is required") -> JSONResponse:
    return error_response(401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="qinglong"'})


class Guard:
    """Authentication and rate limiting of failed attempts, shared by every protected route."""

    def __init__(self, authenticator: Authenticator, *, open_scrape: bool = False,
                 trusted_proxies: tuple[str, ...] = ()) -> None:
        import ipaddress

        self.authenticator = authenticator
        #: the console's sessions (:class:`.console.Sessions`), or None without the console
        self.sessions: Any = None
        self.trusted = tuple(ipaddress.ip_network(p, strict=False) for p in trusted_proxies)
        #: legacy loopback without any token: the metrics and the page are open (nothing else)
        self.open_scrape = open_scrape

    def source_of(self, request: Request) -> str:
        """The client's address: the peer's, or behind a trusted proxy the last address of
        ``X-Forwarded-For`` that is not itself a trusted proxy."""
        import ipaddress

        peer = request.client.host if request.client else ""
        if not self.trusted:
            return peer
        try:
            hops = [peer] + [h.strip() for h in reversed(",".join(
                request.headers.getlist("x-forwarded-for")).split(",")) if h.strip()]
            for hop in hops:
                address = ipaddress.ip_address(hop)
                if not any(address in net for net in self.trusted):
                    return hop
        except ValueError:
            return peer
        return peer

    async def principal(self, request: Request) -> Principal | Response | None:
        """The request's principal, None without credentials, or the refusal to answer."""
        headers = request.headers.getlist("authorization")
        source = self.source_of(request)
        if not headers:
            cookie = request.cookies.get(SESSION_COOKIE) if self.sessions is not None else None
            return await self._from_session(request, cookie, source) if cookie else None
        if len(headers) > 1:
            return _unauthorized("one Authorization header, not several")
        try:
            return await self.authenticator.authenticate(headers[0], source)
        except RateLimited as limited:
            return error_response(429, "rate_limited", "too many failed authentications from this address",
                                  headers={"Retry-After": str(limited.retry_after_s)})
        except AuthFailure as failure:
            return _unauthorized(str(failure))

    async def _from_session(self, request: Request, session_id: str, source: str) -> Principal | Response:
        """The principal of a console session: its token looked up again (a revoked token fails at
        its next request), and on a changing request the session's CSRF token in its header."""
        import hmac

        limiter = self.authenticator.limiter
        try:
            limiter.check(source)
        except RateLimited as limited:
            return error_response(429, "rate_limited", "too many failed authentications from this address",
                                  headers={"Retry-After": str(limited.retry_after_s)})
        session = self.sessions.get(session_id)
        if session is None:
            limiter.failed(source)
            return _unauthorized("the session is unknown or expired: sign in again")
        if request.method not in SAFE_METHODS:
            presented = request.headers.getlist(CSRF_HEADER)
            if len(presented) != 1 or not hmac.compare_digest(presented[0].encode(), session.csrf.encode()):
                return error_response(403, "csrf", "a changing request made with the session cookie needs "
                                      "the session's CSRF token in X-CSRF-Token")
        if session.principal is not None:  # signed in by a console link: the host's admin
            from dataclasses import replace

            return replace(session.principal, source=source)
        try:
            principal = await self.authenticator.by_digest(session.digest, source)
        except AuthFailure as failure:
            self.sessions.drop(session_id)
            return _unauthorized(str(failure))
        return principal


def _endpoint(spec: RouteSpec, guard: Guard, emit_error: Callable[[BaseException, Request], None]) -> Any:
    async def endpoint(request: Request) -> Response:
        method = request.method if request.method != "HEAD" else "GET"
        declared = spec.methods.get(method)
        if spec.path in SIGNED_PATHS and declared is not None and declared.scope == SIGNED:
            return await _run(declared, request, None, emit_error)  # the handler checks the signature
        if spec.path.startswith(WORKER_PREFIX):
            if declared is None:
                return error_response(405, "method_not_allowed", f"{request.method} is not served here",
                                      headers={"Allow": "POST"})
            return await _run(declared, request, None, emit_error)  # the handler authenticates the worker
        if spec.path in PUBLIC_PATHS:
            if declared is not None and declared.scope == PUBLIC:
                return await _run(declared, request, None, emit_error)
            if declared is None:  # a probe's path: nothing to hide, nothing else to serve
                return error_response(405, "method_not_allowed", "read-only: GET or HEAD",
                                      headers={"Allow": "GET, HEAD"})
        found = await guard.principal(request)
        if isinstance(found, Response):
            return found
        principal = found
        if principal is None:
            if declared is not None and declared.scrape and guard.open_scrape:
                return await _run(declared, request, None, emit_error)
            return _unauthorized()
        if declared is None:
            allowed = ", ".join(sorted(set(spec.methods) | ({"HEAD"} if "GET" in spec.methods else set())))
            return error_response(405, "method_not_allowed", f"{request.method} is not served here",
                                  headers={"Allow": allowed})
        if principal.scrape_only and not declared.scrape:
            return _unauthorized("this token opens the metrics and the status page only")
        if not principal.scrape_only and not principal.allows(declared.scope):
            return error_response(403, "forbidden", f"this needs a {declared.scope} token; "
                                  f"the token presented holds {principal.scope}")
        if declared.every_project and principal.projects is not None:
            return error_response(403, "forbidden", "this spans every project: a token limited to "
                                  "projects cannot use it")
        return await _run(declared, request, principal, emit_error)

    return GuardedEndpoint(spec, endpoint)


class GuardedEndpoint:
    """A route's ASGI endpoint (so the router passes it every method: the protection is checked
    before the method is)."""

    def __init__(self, spec: RouteSpec, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        self.qinglong_route = spec
        self._endpoint = endpoint

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        response = await self._endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


async def _run(declared: Method, request: Request, principal: Principal | None,
               emit_error: Callable[[BaseException, Request], None]) -> Response:
    try:
        return await declared.handler(request, principal)
    except asyncio.CancelledError:
        raise
    except (UserError, SecretsError) as exc:  # SecretsError: 503, its message names the setting
        from .errors import response_for

        return response_for(exc)
    except Exception as exc:  # a bug: the class is said, never the text (it may hold a value)
        emit_error(exc, request)
        return error_response(500, "internal", f"internal error ({exc.__class__.__name__})")


async def _not_found(request: Request, guard: Guard) -> Response:
    found = await guard.principal(request)
    if isinstance(found, Response):
        return found
    if found is None:
        return _unauthorized()
    return error_response(404, "unknown", "no such path")


def build_app(specs: list[RouteSpec], guard: Guard, limits: "Limits",
              emit_error: Callable[[BaseException, Request], None]) -> Starlette:
    """The application: each spec a route whose endpoint checks its protection first."""
    routes = []
    for spec in specs:
        for name, declared in spec.methods.items():
            if declared.scope == PUBLIC and spec.path not in PUBLIC_PATHS:
                raise RouteRefused(f"{name} {spec.path} is declared public but is not on the public list")
            if declared.scope == SIGNED and spec.path not in SIGNED_PATHS:
                raise RouteRefused(f"{name} {spec.path} is declared signed but is not a signed path")
            if (declared.scope == WORKER) != spec.path.startswith(WORKER_PREFIX):
                raise RouteRefused(f"{name} {spec.path}: worker routes, and only they, live under {WORKER_PREFIX}")
            if declared.scope not in (PUBLIC, SIGNED, WORKER) and declared.scope not in SCOPES:
                raise RouteRefused(f"{name} {spec.path}: unknown scope {declared.scope!r}")
            if name not in SAFE_METHODS and declared.scope in (PUBLIC, "read") and not (
                    (name, spec.path) in (PUBLIC_CHANGING if declared.scope == PUBLIC else READ_CHANGING)):
                raise RouteRefused(f"{name} {spec.path} changes state, so it needs more than {declared.scope}")
        routes.append(Route(spec.path, _endpoint(spec, guard, emit_error), methods=None))

    async def not_found(request: Request, exc: Exception) -> Response:
        return await _not_found(request, guard)

    app = Starlette(routes=routes, exception_handlers={404: not_found})
    app.router.redirect_slashes = False  # "/metrics/" is another path, never a redirect
    app.state.specs = specs
    return Bounded(app, limits)  # type: ignore[return-value]


@record(slots=False)
class Limits:
    max_body_bytes: int
    max_in_flight: int
    max_header_bytes: int = 8192


class Bounded:
    """Outermost ASGI layer: no chunked bodies (411), no body over the limit (413, read or
    announced), at most ``max_in_flight`` requests served at once outside the probes (503),
    counted from the moment a request's whole body has arrived, and headers every answer carries. It decides nothing about protection."""

    def __init__(self, app: Starlette, limits: Limits) -> None:
        self.app = app
        self.limits = limits
        self.in_flight = 0
        self.routes = app.routes
        self.state = app.state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # lifespan and websockets are not served
        head = len(scope.get("raw_path") or b"") + len(scope["query_string"]) + sum(
            len(name) + len(value) + 4 for name, value in scope["headers"])
        if head > self.limits.max_header_bytes or len(scope["headers"]) > 100:
            return await _plain(send, 431, f"request line and headers over {self.limits.max_header_bytes} bytes")
        raw_path = (scope.get("raw_path") or b"").lower()
        if b"%2f" in raw_path or b"%5c" in raw_path:
            # routed by its decoded path, it would reach a route that a proxy in front, reading
            # the path as sent, saw as another one (its rules for /worker/v1/ or /api/ bypassed)
            return await _plain(send, 400, "an encoded slash or backslash in the path is refused")
        headers = dict(scope["headers"])
        if b"transfer-encoding" in headers:
            return await _plain(send, 411, "a body must come with Content-Length")
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.limits.max_body_bytes:
            return await _plain(send, 413, f"a request body may hold at most {self.limits.max_body_bytes} bytes")
        probe = scope["path"] in PROBE_PATHS
        if not probe:
            # the whole body first: a client sending it slowly holds its own connection (until
            # its deadline), never one of the requests served at once
            receive = await _buffered(receive)
            if receive is None:
                return  # gone, or cut at its deadline, before its body arrived: nobody to answer
        if not probe and self.in_flight >= self.limits.max_in_flight:
            return await _plain(send, 503, "too many requests at once, try again", retry_after=True)
        if not probe:
            self.in_flight += 1

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), (b"cache-control", b"no-store"),
                                      (b"x-content-type-options", b"nosniff")]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            if not probe:
                self.in_flight -= 1


async def _buffered(receive: Any) -> Any:
    """A ``receive`` that hands the application the request's whole body at once (read here,
    within the announced length the bounds above allowed), then passes on to ``receive``; None
    when the client went away first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    pending: list[dict] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

    async def replay() -> dict:
        return pending.pop() if pending else await receive()

    return replay


async def _plain(send: Any, status: int, message: str, *, retry_after: bool = False) -> None:
    body = json.dumps({"error": {"code": "request_refused", "message": message, "field": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"cache-control", b"no-store")]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
