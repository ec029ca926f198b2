"""The HTTP server: asyncio streams, each request's line and headers parsed by the standard
library's :class:`http.server.BaseHTTPRequestHandler` (no hand-written HTTP parsing), bounded in
header size, body size, connections at once and time per request.

Read-only: ``GET`` and ``HEAD`` only. The probes ``/livez`` and ``/readyz`` answer without a token,
as an orchestrator's probes need (a kubelet ``httpGet`` probe cannot send a header from a Secret):
they tell alive or ready and one line from :data:`PROBE_LINES`, fixed phrases that never carry a
value of the settings, the store or a task. With a token every other request (``/metrics``, the
status page, any other path) needs ``Authorization: Bearer <token>`` (compared with
:func:`hmac.compare_digest`); the token is never logged, and requests are not logged at all.
"""

from __future__ import annotations

import asyncio
import hmac
import io
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.errors import UserError
from qinglong.contracts.hookspecs import ComponentPhase

from ..settings import HttpSettings, split_listen
from .metrics import CONTENT_TYPE_LATEST, Metrics, StatsCache, grace_of

TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"

#: The paths served without the token: they reveal alive/ready and one line of PROBE_LINES.
PROBE_PATHS = frozenset({"/livez", "/readyz"})
_SCHEDULER_DEAD = "the scheduler loop is not running"
_DISPATCHER_DEAD = "the dispatcher is not running"
#: The start steps ``Lifecycle.start`` names in its readiness line (``starting: <step>``).
_START_STEPS = ("opening the database", "checking schema readiness", "startup recovery",
                "starting the dispatcher", "opening the admission phase")
#: Every line a probe may answer with, whoever asks: fixed phrases only. A readiness reason that
#: is not one of them (a future step whose line could carry a name, a path or an error's text) is
#: answered as the bare "not ready" instead of being passed on to an unauthenticated client.
PROBE_LINES = frozenset({
    "alive", "ready", "not alive", "not ready", "stopping: the process is shutting down",
    *(f"starting: {step}" for step in _START_STEPS),
    *(f"{verdict}: {problem}" for verdict in ("not alive", "not ready")
      for problem in (_SCHEDULER_DEAD, _DISPATCHER_DEAD)),
})


def probe_line(line: str, fallback: str) -> str:
    """``line`` if it is one of :data:`PROBE_LINES`, else ``fallback`` (itself one of them)."""
    return line if line in PROBE_LINES else fallback


class HttpStartError(UserError):
    """The HTTP surface could not listen (the address is taken, or not this host's)."""


class _ParsedRequest(BaseHTTPRequestHandler):
    """The standard library's request parser run over a request head already read (never over a
    socket): :meth:`parse_request` fills ``command``, ``path``, ``headers`` and
    ``close_connection``, or keeps the error in ``error``."""

    protocol_version = "HTTP/1.1"  # keep-alive for HTTP/1.1 clients (probes reuse connections)

    def __init__(self, head: bytes) -> None:  # noqa: D107  (no socket server behind it)
        self.rfile = io.BytesIO(head)
        self.wfile = io.BytesIO()
        self.client_address = ("", 0)
        self.command = None
        self.close_connection = True
        self.error: tuple[HTTPStatus, str] = (HTTPStatus.BAD_REQUEST, "bad request")
        self.raw_requestline = self.rfile.readline(65_537)
        self.ok = self.parse_request()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Keep the parser's verdict; the server answers it (in HTTP/1.1, even to a request line
        the parser took for HTTP/0.9)."""
        self.error = (HTTPStatus(code), message or HTTPStatus(code).phrase)

    def handle_expect_100(self) -> bool:
        return True  # a body is small and bounded: no interim response

    def log_message(self, format: str, *args: Any) -> None:  # never log a request (or a token)
        pass


class HttpSurface:
    """The ``admission``-phase component serving ``/livez``, ``/readyz``, ``/metrics`` and ``/``."""

    name = "http"
    phase = ComponentPhase.ADMISSION

    def __init__(self, lifecycle: Any, settings: HttpSettings, token: bytes | None, profile: str,
                 version: str, *, required: bool = True) -> None:
        """``required``: an address that cannot be bound fails the start (else: a warning, and the
        process runs without the surface)."""
        self._lifecycle = lifecycle
        self._required = required
        self._settings = settings
        self._token = token
        self._profile = profile
        self._version = version
        self._server: asyncio.AbstractServer | None = None
        self._connections = 0
        self.cache = StatsCache(lifecycle.backend.reader(), grace_ms=grace_of(lifecycle))
        self.metrics = Metrics(self.cache, profile=profile, version=version, running=self._running)
        # built before the first round and the dispatcher's first pass: nothing goes uncounted
        lifecycle.round_observers.append(self.metrics.observe_round)
        lifecycle.dispatch_observers.append(self.metrics.observe_dispatch)
        lifecycle.finish_observers.append(self.metrics.observe_finished)

    # ------------------------------------------------------------------ lifecycle component

    async def start(self) -> None:
        """Listen (the counters already observe the loop and the dispatcher)."""
        lifecycle = self._lifecycle
        host, port = split_listen(self._settings.listen)
        try:
            self._server = await asyncio.start_server(
                self._serve, host, port, limit=self._settings.max_header_bytes, reuse_address=True)
        except OSError as exc:
            message = (f"the HTTP surface cannot listen on {self._settings.listen} (key 'http.listen'): "
                       f"{exc.strerror or exc.__class__.__name__}")
            if self._required:
                raise HttpStartError(message) from None
            lifecycle.diagnostics.emit(DiagnosticEvent(
                "warning", "http.not_listening",
                message + "; running without it (set [http] listen to require it, or \"\" to turn it off)"))
            return
        sockets = self._server.sockets or ()
        bound = ", ".join(_address(s.getsockname()) for s in sockets)
        lifecycle.diagnostics.emit(DiagnosticEvent(
            "info", "http.listening", f"HTTP surface listening on {bound}",
            {"listen": bound, "token": self._token is not None}))

    async def stop(self) -> None:
        """Stop accepting connections (the lifecycle already answers 503 on ``/readyz``); a
        connection already open is served until its idle bound or the end of the process."""
        if self._server is not None:
            self._server.close()
            self._server = None

    # ------------------------------------------------------------------ serving

    def _running(self) -> int | None:
        dispatcher = self._lifecycle.dispatcher
        return dispatcher.watched if dispatcher is not None else None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= self._settings.max_connections:
            try:
                await _send(writer, HTTPStatus.SERVICE_UNAVAILABLE, "too many connections, try again\n",
                            close=True, extra={"Retry-After": "1"})
            except ConnectionError:
                pass
            finally:
                writer.close()
            return
        self._connections += 1
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections -= 1
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; True to keep the connection for another."""
        timeout = self._settings.request_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        except asyncio.TimeoutError:
            await _send(writer, HTTPStatus.REQUEST_TIMEOUT, "request not received in time\n", close=True)
            return False
        except asyncio.LimitOverrunError:
            await _send(writer, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                        f"request line and headers over {self._settings.max_header_bytes} bytes\n", close=True)
            return False
        except asyncio.IncompleteReadError:
            return False  # the client closed the connection
        request = _ParsedRequest(head)
        if not request.ok:
            status, message = request.error
            await _send(writer, status, message[:200] + "\n", close=True)
            return False
        if request.headers.get("Transfer-Encoding"):
            await _send(writer, HTTPStatus.LENGTH_REQUIRED, "a body must come with Content-Length\n", close=True)
            return False
        try:
            length = int(request.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > self._settings.max_body_bytes:
            await _send(writer, HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"a request body may hold at most {self._settings.max_body_bytes} bytes\n", close=True)
            return False
        try:
            if length:
                await asyncio.wait_for(reader.readexactly(length), max(0.0, deadline - loop.time()))
            status, content_type, body, extra = await asyncio.wait_for(
                self._answer(request), max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            await _send(writer, HTTPStatus.REQUEST_TIMEOUT, "request not served in time\n", close=True)
            return False
        keep = not request.close_connection
        await _send(writer, status, body, content_type=content_type, close=not keep,
                    head_only=request.command == "HEAD", extra=extra)
        return keep

    async def _answer(self, request: _ParsedRequest) -> tuple[HTTPStatus, str, str | bytes, dict[str, str]]:
        path = request.path.split("?", 1)[0]
        # the probes answer anyone (their lines are fixed phrases); everything else needs the token
        if (path not in PROBE_PATHS and self._token is not None
                and not self._authorized(request.headers.get("Authorization", ""))):
            return (HTTPStatus.UNAUTHORIZED, TEXT, "a bearer token is required\n",
                    {"WWW-Authenticate": 'Bearer realm="qinglong"'})
        if request.command not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, TEXT, "read-only: GET or HEAD\n", {"Allow": "GET, HEAD"}
        if path == "/livez":
            problem = self._liveness_problem()
            if problem:
                line = probe_line(f"not alive: {problem}", "not alive")
                return HTTPStatus.SERVICE_UNAVAILABLE, TEXT, line + "\n", {}
            return HTTPStatus.OK, TEXT, "alive\n", {}
        if path == "/readyz":
            readiness = self._lifecycle.readiness
            problem = self._liveness_problem()
            if readiness.ready and not problem:
                return HTTPStatus.OK, TEXT, "ready\n", {}
            reason = readiness.reason if not readiness.ready else f"not ready: {problem}"
            return HTTPStatus.SERVICE_UNAVAILABLE, TEXT, probe_line(reason, "not ready") + "\n", {}
        if path == "/metrics":
            return HTTPStatus.OK, CONTENT_TYPE_LATEST, await self.metrics.scrape(), {}
        if path == "/":
            from .page import render_status_page

            page = await render_status_page(self._lifecycle, self.cache, self._profile, self._version,
                                            self._settings.status_rows)
            return HTTPStatus.OK, HTML, page, {}
        return HTTPStatus.NOT_FOUND, TEXT, "not found: try /, /livez, /readyz or /metrics\n", {}

    def _authorized(self, header: str) -> bool:
        scheme, _, presented = header.partition(" ")
        assert self._token is not None
        # compared whatever the scheme, so a wrong scheme takes as long as a wrong token
        same = hmac.compare_digest(presented.strip().encode("utf-8", "replace"), self._token)
        return same and scheme.lower() == "bearer"

    def _liveness_problem(self) -> str | None:
        lifecycle = self._lifecycle
        if lifecycle.readiness.stopping:
            return None  # a stop is orderly: the loops are stopped on purpose
        if lifecycle.loop is None or not lifecycle.loop.alive:
            return _SCHEDULER_DEAD
        if lifecycle.dispatcher is not None and not lifecycle.dispatcher.alive:
            return _DISPATCHER_DEAD
        return None


def _address(name: Any) -> str:
    host, port = name[0], name[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _send(writer: asyncio.StreamWriter, status: HTTPStatus, body: str | bytes, *,
                content_type: str = TEXT, close: bool = False, head_only: bool = False,
                extra: dict[str, str] | None = None) -> None:
    data = body.encode() if isinstance(body, str) else body
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Type: {content_type}",
             f"Content-Length: {len(data)}", "Cache-Control: no-store", "X-Content-Type-Options: nosniff"]
    if close:
        lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else data))
    await writer.drain()
