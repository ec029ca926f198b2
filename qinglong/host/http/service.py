"""``qinglong api``: the management API as a process of its own (the cluster's, any number behind
a Service, holding the admin role's DSN so the scheduler replicas keep only the runtime role).
Stateless: every request reads the store. Probes: alive while the process serves; ready while the
store answered its last readiness check (read at most once per second)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.errors import QinglongError

from ..settings import LoadedSettings
from . import build_api, check_api_exposure, require_http_extra, resolve_token
from .app import Guard, Limits, Method, RouteSpec, build_app
from .auth import Authenticator, FailureLimiter
from .server import HttpStartError, Listener, Probes, emitter

READINESS_EVERY_S = 1.0


class ApiProcess:
    def __init__(self, loaded: LoadedSettings, backend: Any, providers: Any, diagnostics: Any, version: str,
                 worker_spec: Any = None) -> None:
        if not loaded.settings.http.listen:
            from qinglong.contracts.errors import SettingsError

            raise SettingsError(f"invalid settings: {loaded.origin(('http', 'listen'))}: key 'http.listen': "
                                "`qinglong api` serves on the [http] listener: set [http] listen.")
        require_http_extra(loaded)
        token = resolve_token(loaded)
        self.ssl_files = check_api_exposure(loaded, always=True)
        self.loaded = loaded
        self.backend = backend
        self.diagnostics = diagnostics
        self.stopping = False
        self._ready: tuple[float, bool] = (0.0, False)
        #: the reason last reported for not being ready (None while ready)
        self._unready_reported: tuple[str, str] | None = None
        api = build_api(loaded, backend, providers)
        from .metrics import CONTENT_TYPE_LATEST, Metrics, StatsCache

        self.cache = StatsCache(backend.reader())
        self.metrics = Metrics(self.cache, profile=loaded.profile.name, version=version, running=lambda: None)

        async def scrape(request: Any, principal: Any) -> Any:
            from starlette.responses import Response

            return Response(await self.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

        probes = Probes(lambda: None, self._readiness)
        specs = probes.routes() + [
            RouteSpec("/metrics", {"GET": Method("read", scrape, "Prometheus metrics", scrape=True)})] + api.routes()
        settings = loaded.settings.api
        authenticator = Authenticator(scrape_token=token, lookup=api.lookup_token,
                                      limiter=FailureLimiter(settings.failed_auth_burst, settings.failed_auth_per_second))
        guard = Guard(authenticator, trusted_proxies=tuple(settings.trusted_proxies) if settings.behind_proxy else ())
        from .console import Console

        specs += Console(guard, secure=self.ssl_files is not None or settings.behind_proxy,
                         links=api.tokens).routes()
        self.gateway = gateway_service(loaded, worker_spec, guard, backend, diagnostics)
        if self.gateway is not None:
            specs += self.gateway.routes()
        http = loaded.settings.http
        self.app = build_app(specs, guard, Limits(http.max_body_bytes, http.max_connections, http.max_header_bytes),
                             emitter(diagnostics))
        self.listener = Listener(self.app, http, ssl_files=self.ssl_files)
        self._checker: asyncio.Task | None = None

    def _readiness(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "stopping: the process is shutting down"
        return (True, "ready") if self._ready[1] else (False, "not ready")

    def _unready(self, code: str, message: str) -> None:
        """Say why the API tier is not ready: at the first check that finds it (at start too) and
        each time the reason changes, not at every check."""
        if self._unready_reported != (code, message):
            self._unready_reported = (code, message)
            self.diagnostics.emit(DiagnosticEvent("warning", code, message))

    async def _check_store(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.backend.check_readiness(), 5)
                ready = True
                if self.gateway is not None and self.gateway.gateway is not None:
                    problems = await asyncio.wait_for(self.gateway.gateway.check(), 5)
                    if problems:
                        self._unready("api.gateway_not_ready", "the worker gateway is not ready: "
                                      + "; ".join(problems))
                        ready = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # our errors' words are written for the operator, as the CLI prints them (what
                # drifted, the RESET that ends it); anything else could hold a value: its class
                why = str(exc) if isinstance(exc, QinglongError) else type(exc).__name__
                self._unready("api.store_not_ready", f"the store is not ready: {why}")
                ready = False
            if ready:
                self._unready_reported = None
            self._ready = (time.monotonic(), ready)
            await asyncio.sleep(READINESS_EVERY_S)

    async def start(self) -> None:
        if self.gateway is not None:
            await self.gateway.open()
        self._checker = asyncio.create_task(self._check_store())
        try:
            bound = await self.listener.start()
        except OSError as exc:
            raise HttpStartError(f"the API cannot listen on {self.loaded.settings.http.listen} (key 'http.listen'): "
                                 f"{exc.strerror or exc.__class__.__name__}") from None
        self.diagnostics.emit(DiagnosticEvent("info", "http.listening", f"HTTP surface listening on {bound}"
                                              + (" (TLS)" if self.ssl_files else ""), {"listen": bound}))

    async def stop(self) -> None:
        self.stopping = True
        await self.listener.close()
        if self.gateway is not None:
            await self.gateway.close()
        if self._checker is not None:
            self._checker.cancel()
            try:
                await self._checker
            except (asyncio.CancelledError, QinglongError):
                pass


def gateway_service(loaded: LoadedSettings, worker_spec: Any, guard: Any, backend: Any = None,
                    diagnostics: Any = None) -> Any:
    """The ``/worker/v1`` routes when ``[api] gateway_dsn`` is set (refused, naming the key, on a
    store that offers no gateway), else None."""
    api = loaded.settings.api
    if api.gateway_dsn is None:
        return None
    if worker_spec is None or getattr(worker_spec, "create_gateway", None) is None:
        from qinglong.contracts.errors import SettingsError

        raise SettingsError(f"invalid settings: {loaded.origin(('api', 'gateway_dsn'))}: key 'api.gateway_dsn': "
                            f"the {loaded.profile.name} profile's store offers no worker gateway (use the cluster "
                            "profile)")
    from .gateway import GatewayService

    from ..secrets import host_sealer

    sealer = getattr(getattr(backend, "context", None), "sealer", None) or host_sealer(loaded, None)
    service = GatewayService(None, limiter=guard.authenticator.limiter, source_of=guard.source_of,
                             max_claim_wait_ms=api.gateway_claim_wait_ms, sealer=sealer,
                             diagnostics=diagnostics)
    dsn = api.gateway_dsn.get_secret_value()
    backend_settings = getattr(getattr(backend, "context", None), "settings", None)

    async def open_() -> None:
        # the backend's own settings, opaque here: they name the role the gateway must log in as
        service.gateway = await worker_spec.create_gateway(dsn, "qinglong gateway", api.gateway_pool_size,
                                                           backend_settings=backend_settings)

    async def close() -> None:
        gateway, service.gateway = service.gateway, None
        if gateway is not None:
            await gateway.close()

    service.open = open_  # type: ignore[attr-defined]
    service.close = close  # type: ignore[attr-defined]
    return service
