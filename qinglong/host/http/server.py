"""The HTTP surface of ``qinglong run`` (and of ``qinglong api``): a Starlette application served by
uvicorn's h11 server inside the process's own event loop, bounded in header size, body size,
requests served at once and time to receive a request (:mod:`.protocol`, :class:`.app.Bounded`).

The probes ``/livez`` and ``/readyz`` answer without a token, as an orchestrator's probes need (a
kubelet ``httpGet`` probe cannot send a header from a Secret): they tell alive or ready and one line
from :data:`PROBE_LINES`, fixed phrases that never carry a value of the settings, the store or a
task. They are answered whatever other clients hold: a connection over the cap evicts the oldest
idle one. Requests are never logged.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.errors import UserError
from qinglong.contracts.hookspecs import ComponentPhase

from ..settings import HttpSettings, split_listen
from .app import PROBE_PATHS, PUBLIC, Guard, Limits, Method, RouteSpec, build_app
from .auth import Authenticator, FailureLimiter
from .metrics import CONTENT_TYPE_LATEST, Metrics, StatsCache, grace_of

_SCHEDULER_DEAD = "the scheduler loop is not running"
_DISPATCHER_DEAD = "the dispatcher is not running"
#: The start steps ``Lifecycle.start`` names in its readiness line (``starting: <step>``).
_START_STEPS = ("waiting for the store", "opening the database", "checking schema readiness",
                "startup recovery", "starting the dispatcher", "opening the admission phase")
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


class Listener:
    """uvicorn's server over one socket this process binds, inside the running event loop (no
    signal handlers of its own, no logging of requests, no ``Server`` header)."""

    def __init__(self, app: Any, settings: HttpSettings, *, ssl_files: tuple[str, str] | None = None) -> None:
        from uvicorn import Config, Server

        from .protocol import BoundedH11Protocol

        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
            quiet = logging.getLogger(name)
            quiet.propagate = False
            quiet.handlers = [logging.NullHandler()]
        timeout_s = settings.request_timeout_ms / 1000
        kwargs: dict[str, Any] = {}
        if ssl_files is not None:
            kwargs.update(ssl_certfile=ssl_files[0], ssl_keyfile=ssl_files[1])
        config = Config(app, http=BoundedH11Protocol, ws="none", lifespan="off", interface="asgi3",
                        log_config=None, access_log=False, server_header=False, date_header=False,
                        proxy_headers=False, timeout_keep_alive=max(1, int(timeout_s)),
                        timeout_graceful_shutdown=max(1, int(timeout_s)),
                        h11_max_incomplete_event_size=settings.max_header_bytes, **kwargs)
        config.qinglong_bounds = {  # type: ignore[attr-defined]
            "max_connections": settings.max_connections, "request_timeout_s": timeout_s,
            "max_header_bytes": settings.max_header_bytes}
        config.load()
        self.server = Server(config)
        self.server.lifespan = config.lifespan_class(config)
        self.listen = settings.listen
        self.socket: socket.socket | None = None

    async def start(self) -> str:
        """Bind and serve; the bound address. OSError when the address cannot be bound."""
        host, port = split_listen(self.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=128)
        sock.setblocking(False)
        self.socket = sock
        await self.server.startup(sockets=[sock])
        return _address(sock.getsockname())

    async def stop_listening(self) -> None:
        """No new connection (one already open is served until its idle bound)."""
        for server in getattr(self.server, "servers", []):
            server.close()
        if self.socket is not None:
            self.socket.close()
            self.socket = None

    async def close(self) -> None:
        """Stop listening, then end every connection (in-flight requests get their bound)."""
        await self.stop_listening()
        if self.server.started:
            self.server.should_exit = True
            await self.server.shutdown()

    @property
    def port(self) -> int:
        assert self.server.servers and self.server.servers[0].sockets
        return self.server.servers[0].sockets[0].getsockname()[1]


class Probes:
    """What the probes say, from a lifecycle (``qinglong run``) or a store check (``qinglong api``)."""

    def __init__(self, liveness: Callable[[], str | None], readiness: Callable[[], tuple[bool, str]]) -> None:
        self.liveness = liveness
        self.readiness = readiness

    async def livez(self, request: Request, principal: Any) -> Response:
        problem = self.liveness()
        if problem:
            return PlainTextResponse(probe_line(f"not alive: {problem}", "not alive") + "\n", status_code=503)
        return PlainTextResponse("alive\n")

    async def readyz(self, request: Request, principal: Any) -> Response:
        ready, reason = self.readiness()
        if ready:
            return PlainTextResponse("ready\n")
        return PlainTextResponse(probe_line(reason, "not ready") + "\n", status_code=503)

    def routes(self) -> list[RouteSpec]:
        return [RouteSpec("/livez", {"GET": Method(PUBLIC, self.livez, "liveness")}),
                RouteSpec("/readyz", {"GET": Method(PUBLIC, self.readyz, "readiness")})]


def emitter(diagnostics: Any) -> Callable[[BaseException, Request], None]:
    """A handler's bug said as a diagnostic: the exception's class, the method and the route's
    template (never the text, which could hold a value)."""
    def emit(exc: BaseException, request: Request) -> None:
        route = request.scope.get("route")
        diagnostics.emit(DiagnosticEvent("error", "http.handler_failed",
                                         f"{request.method} {getattr(route, 'path', '?')} failed: "
                                         f"{exc.__class__.__name__}"))
    return emit


class HttpSurface:
    """The ``admission``-phase component serving the probes, ``/metrics``, ``/`` (and the API)."""

    name = "http"
    phase = ComponentPhase.ADMISSION

    def _wake_dispatcher(self) -> None:
        """A Run admitted or cancelled through the API is started or signalled at once."""
        dispatcher = getattr(self._lifecycle, "dispatcher", None)
        if dispatcher is not None:
            dispatcher.wake()

    def __init__(self, lifecycle: Any, settings: HttpSettings, token: bytes | None, profile: str,
                 version: str, *, required: bool = True, api: Any = None, api_settings: Any = None,
                 ssl_files: tuple[str, str] | None = None) -> None:
        """``required``: an address that cannot be bound fails the start (else: a warning, and the
        process runs without the surface). ``api``: the management API's routes and authenticator
        (:class:`qinglong.host.http.api.ApiService`), or None."""
        self._lifecycle = lifecycle
        self._required = required
        self._settings = settings
        self._token = token
        self._profile = profile
        self._version = version
        self._listener: Listener | None = None
        self._ssl_files = ssl_files
        self.cache = StatsCache(lifecycle.backend.reader(), grace_ms=grace_of(lifecycle))
        self.metrics = Metrics(self.cache, profile=profile, version=version, running=self._running)
        # built before the first round and the dispatcher's first pass: nothing goes uncounted
        lifecycle.round_observers.append(self.metrics.observe_round)
        lifecycle.dispatch_observers.append(self.metrics.observe_dispatch)
        lifecycle.finish_observers.append(self.metrics.observe_finished)
        probes = Probes(self._liveness_problem, self._readiness)
        specs = probes.routes() + [
            # its per-task series name every project's tasks
            RouteSpec("/metrics", {"GET": Method("read", self._metrics, "Prometheus metrics", scrape=True,
                                                 every_project=True)}),
            # with the API on, "/" is the web console and the status page moves to /status
            RouteSpec("/" if api is None else "/status",
                      {"GET": Method("read", self._page, "status page", scrape=True, every_project=True)}),
        ]
        lookup = None
        if api is not None:
            specs += api.routes()
            lookup = api.lookup_token
            api.on_runs_changed = self._wake_dispatcher
        limiter = None
        trusted: tuple[str, ...] = ()
        if api_settings is not None:
            limiter = FailureLimiter(api_settings.failed_auth_burst, api_settings.failed_auth_per_second)
            trusted = tuple(api_settings.trusted_proxies) if api_settings.behind_proxy else ()
        authenticator = Authenticator(scrape_token=token, lookup=lookup, limiter=limiter)
        # on loopback without any token and without the API, the metrics and page stay open
        guard = Guard(authenticator, open_scrape=token is None and api is None, trusted_proxies=trusted)
        if api is not None:
            from .console import Console

            specs += Console(guard, secure=ssl_files is not None or bool(trusted), links=api.tokens).routes()
        self.app = build_app(specs, guard, Limits(settings.max_body_bytes, settings.max_connections,
                                                     settings.max_header_bytes),
                             emitter(lifecycle.diagnostics))

    # ------------------------------------------------------------------ lifecycle component

    async def start(self) -> None:
        """Listen (the counters already observe the loop and the dispatcher)."""
        lifecycle = self._lifecycle
        listener = Listener(self.app, self._settings, ssl_files=self._ssl_files)
        try:
            bound = await listener.start()
        except OSError as exc:
            message = (f"the HTTP surface cannot listen on {self._settings.listen} (key 'http.listen'): "
                       f"{exc.strerror or exc.__class__.__name__}")
            if self._required:
                raise HttpStartError(message) from None
            lifecycle.diagnostics.emit(DiagnosticEvent(
                "warning", "http.not_listening",
                message + "; running without it (set [http] listen to require it, or \"\" to turn it off)"))
            return
        self._listener = listener
        lifecycle.diagnostics.emit(DiagnosticEvent(
            "info", "http.listening", f"HTTP surface listening on {bound}"
            + (" (TLS)" if self._ssl_files else ""),
            {"listen": bound, "token": self._token is not None}))

    async def stop(self) -> None:
        """Stop accepting connections (the lifecycle already answers 503 on ``/readyz``); a
        connection already open is served until its idle bound or the end of the process."""
        if self._listener is not None:
            await self._listener.stop_listening()

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.port

    # ------------------------------------------------------------------ serving

    def _running(self) -> int | None:
        dispatcher = self._lifecycle.dispatcher
        return dispatcher.watched if dispatcher is not None else None

    async def _metrics(self, request: Request, principal: Any) -> Response:
        return Response(await self.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    async def _page(self, request: Request, principal: Any) -> Response:
        from .page import render_status_page

        page = await render_status_page(self._lifecycle, self.cache, self._profile, self._version,
                                        self._settings.status_rows)
        return Response(page, media_type="text/html; charset=utf-8")

    def _readiness(self) -> tuple[bool, str]:
        readiness = self._lifecycle.readiness
        problem = self._liveness_problem()
        if readiness.ready and not problem:
            return True, "ready"
        return False, readiness.reason if not readiness.ready else f"not ready: {problem}"

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
