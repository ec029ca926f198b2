"""The worker gateway at ``/worker/v1``: registered workers speak the worker protocol to the API
tier over HTTP(S), and the API tier calls the store's worker functions for them.

Each request carries the worker's own token (``Authorization: Bearer qlw_...``), looked up by
its digest on every request (a revoked or rotated token fails at its next one). The identity is
the registration's: the worker id, its labels and its capacity come from it, never from the
body, so a worker can open sessions only for itself, is offered only Runs its registration
allows, and can name no other worker's session (the store checks every fence under the
authenticated id). A claim may wait (``wait_ms``) until a Run becomes claimable: the gateway
holds the request and wakes it on the store's notification, so idle workers cost no queries.
A job's end may claim for the slot it frees in the same request (``complete_and_claim``): one
round trip and one store transaction instead of two; that claim never waits.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from qinglong.contracts import worker_wire as wire
from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.errors import SchemaNotReady, SecretsError, StoreFailed, StoreUnavailable
from qinglong.contracts.secrets import opened_env_payload
from qinglong.contracts.worker import (
    CombinedCompletion,
    MAX_SESSION_CAPACITY,
    WORKER_TOKEN_PREFIX,
    WorkerRegistration,
    worker_token_digest,
)

from .api import json_body
from .app import WORKER, Method, RouteSpec, error_response
from .auth import FailureLimiter, RateLimited

#: Most Attempt ids a heartbeat may name.
MAX_RUNNING_IDS = MAX_SESSION_CAPACITY
#: Most requests of one worker served at once: a worker sends at most two (a claim that may wait,
#: and everything else), twice that while a replacing process overlaps the one it replaces. More
#: would let one token hold every request the API tier serves at once and starve the others'
#: heartbeats until their self-fences stop their jobs.
MAX_REQUESTS_PER_WORKER = 4


def _fence(body: dict, worker_id: str) -> Any:
    """The request's session fence, its id a UUID (the store could not even cast another)."""
    fence = wire.fence_of(body, worker_id)
    return dataclasses.replace(fence, session_id=wire.uuid_text(fence.session_id, "session_id"))


def _lease(body: dict) -> Any:
    """The request's lease fence, its Attempt id a UUID."""
    lease = wire.lease_of(body)
    return dataclasses.replace(lease, attempt_id=wire.uuid_text(lease.attempt_id, "lease.attempt_id"))


#: The digest of the token the request being served presented (its claim checks it again after
#: each wait: a rotation or revocation meanwhile must not hand that token a Run).
_PRESENTED: contextvars.ContextVar[str | None] = contextvars.ContextVar("presented_worker_token", default=None)


def _report(waiter: Any, taken: int, asked: int) -> None:
    """Tell a gateway's waiter what the claim after its wake-up took, where it wants to know
    (a store's gateway may pass an unused wake-up on to another waiting claim)."""
    claimed = getattr(waiter, "claimed", None)
    if claimed is not None:
        claimed(taken, asked)


def _discard(waiter: Any) -> None:
    """Let a gateway's waiter go (a wake-up it received and did not use goes on)."""
    discard = getattr(waiter, "discard", None)
    if discard is not None:
        discard()


def _stated(body: dict) -> dict[str, Any]:
    """What a completion may state besides its outcome, as the gateway's keywords: the worker's own
    stop and the time since the job's exit, each only when sent (a gateway of an earlier build
    takes neither). The store checks each against the Attempt the lease names and dates the end
    on its own clock."""
    stated: dict[str, Any] = {}
    own_stop = wire.own_stop_of(body)
    if own_stop is not None:
        stated["own_stop"] = own_stop
    exit_age_ms = wire.exit_age_of(body)
    if exit_age_ms is not None:
        stated["exit_age_ms"] = exit_age_ms
    return stated


def _busy() -> Response:
    return error_response(503, "worker_busy", f"at most {MAX_REQUESTS_PER_WORKER} requests of one worker "
                          "are served at once", headers={"Retry-After": "1"})


class GatewayService:
    """The ``/worker/v1`` routes over a :class:`~qinglong.contracts.worker.WorkerGateway`."""

    def __init__(self, gateway: Any, *, limiter: FailureLimiter, source_of: Callable[[Request], str],
                 max_claim_wait_ms: int, sealer: Any = None, diagnostics: Any = None) -> None:
        self.gateway = gateway
        #: opens the claimed payloads' env values: a worker gets them in clear only here, over
        #: its authenticated claim
        self.sealer = sealer
        self.diagnostics = diagnostics
        self.limiter = limiter
        self.source_of = source_of
        self.max_claim_wait_ms = max_claim_wait_ms
        #: figures for the benchmark and the metrics: requests served, claims that waited
        self.requests = 0
        self.waits = 0
        #: the store did not answer the last call (reported once until one succeeds)
        self._store_away = False
        #: requests being served, by worker id (at most MAX_REQUESTS_PER_WORKER each)
        self._serving: dict[str, int] = {}
        #: requests in flight by the digest of the token presented, from before it is identified
        self._identifying: dict[str, int] = {}

    @staticmethod
    def _presented(request: Request) -> str | None:
        """The digest of the worker token the request presents (exactly one ``Authorization:
        Bearer qlw_...`` header), or None: the key its requests are counted by before the store
        has said whose it is."""
        headers = request.headers.getlist("authorization")
        scheme, _, secret = (headers[0] if len(headers) == 1 else "").strip().partition(" ")
        secret = secret.strip()
        if scheme.lower() == "bearer" and secret.startswith(WORKER_TOKEN_PREFIX) and len(secret) <= 512:
            return worker_token_digest(secret)
        return None

    async def _worker(self, request: Request, presented: str | None) -> WorkerRegistration | Response:
        source = self.source_of(request)
        registration = None
        if presented is not None:
            registration = await self.gateway.identify(presented)
        if registration is None:
            self.limiter.failed(source)
            return error_response(401, "unauthorized", "a registered worker's token is required "
                                  "(Authorization: Bearer qlw_...); it is unknown, revoked or missing",
                                  headers={"WWW-Authenticate": f'Bearer realm="{wire.GATEWAY_REALM}"'})
        return registration

    def _handler(self, call: Callable[[WorkerRegistration, dict], Awaitable[Any]]) -> Any:
        async def handler(request: Request, principal: Any) -> Response:
            if self.gateway is None:
                return error_response(503, "unavailable", "the worker gateway is starting")
            try:
                self.limiter.check(self.source_of(request))
            except RateLimited as limited:
                return error_response(429, "rate_limited", "too many failed authentications from this address",
                                      headers={"Retry-After": str(limited.retry_after_s)})
            # counted by the token presented before the store says whose it is: while the store is
            # slow, one token's requests waiting to be identified would otherwise hold every
            # request the API tier serves at once
            presented = self._presented(request)
            worker_id: str | None = None  # once the store has said whose the token is
            _PRESENTED.set(presented)  # each request is served in its own task and context
            if presented is not None:
                waiting = self._identifying.get(presented, 0)
                if waiting >= MAX_REQUESTS_PER_WORKER:
                    return _busy()
                self._identifying[presented] = waiting + 1
            try:
                found = await self._worker(request, presented)
                if isinstance(found, Response):
                    return found
                held = self._serving.get(found.worker_id, 0)
                if held >= MAX_REQUESTS_PER_WORKER:
                    return _busy()
                self._serving[found.worker_id] = held + 1
                worker_id = found.worker_id
                try:
                    self.requests += 1
                    body = await json_body(request)
                    answer = JSONResponse(await call(found, body))
                finally:
                    left = self._serving.pop(found.worker_id) - 1
                    if left:
                        self._serving[found.worker_id] = left
                self._store_away = False
                return answer
            except SchemaNotReady as exc:
                # a worker function missing or its EXECUTE revoked: not an outage and not the
                # worker's fault; said as an error each time, answered as the API's table says
                self._call_failed("gateway.schema_not_ready", f"the store is not ready for the worker call "
                                  f"{call.__name__}: {exc}", call.__name__, worker_id)
                return error_response(503, "schema_not_ready", f"the store behind the gateway is not "
                                      f"ready for this call ({call.__name__}); the API tier's diagnostics say why")
            except StoreFailed as exc:
                # a defect, not an outage: said as an error each time, and never as a 503 the
                # worker would wait out as one (its words are for the operator, not the caller)
                self._call_failed("gateway.store_failed", f"the store failed the worker call {call.__name__}: "
                                  f"{exc}", call.__name__, worker_id)
                return error_response(500, "store_failed", f"the store failed this call "
                                      f"({call.__name__}); the API tier's diagnostics say why")
            except StoreUnavailable as exc:
                # where the store is (host, port, database, role, libpq's words) is for the
                # operator's diagnostics, never for a caller, who may not even be a worker
                self._store_unavailable(exc)
                return error_response(503, "store_unavailable", "the store behind the gateway is "
                                      "unavailable; try again")
            except Exception as exc:
                refusal = wire.refusal_json(exc)
                if refusal is None:
                    raise
                return JSONResponse(refusal[1], status_code=refusal[0])
            finally:
                if presented is not None:
                    left = self._identifying.pop(presented) - 1
                    if left:
                        self._identifying[presented] = left

        return handler

    def _call_failed(self, code: str, message: str, name: str, worker_id: str | None) -> None:
        """Say which call the store failed or was not ready for, and why, as an error each time
        (the store's words name its function and SQLSTATE and mask any DSN; no token is in them)."""
        if self.diagnostics is not None:
            fields = {"call": name} if worker_id is None else {"call": name, "worker_id": worker_id}
            self.diagnostics.emit(DiagnosticEvent("error", code, message, fields))

    def _store_unavailable(self, exc: StoreUnavailable) -> None:
        """Say why the store is away in the diagnostics, once until a call succeeds again."""
        if self._store_away:
            return
        self._store_away = True
        if self.diagnostics is not None:
            self.diagnostics.emit(DiagnosticEvent("warning", "gateway.store_unavailable",
                                                  f"the worker gateway's store is unavailable: {exc}"))

    # ------------------------------------------------------------------ the calls

    async def open_session(self, worker: WorkerRegistration, body: dict) -> Any:
        lease_ms = wire.field(body, "lease_ms", int)
        session = await self.gateway.open_session(worker.worker_id, worker.labels, worker.capacity, lease_ms)
        return wire.session_json(session)

    async def heartbeat(self, worker: WorkerRegistration, body: dict) -> Any:
        running = wire.field(body, "running", list)
        if len(running) > MAX_RUNNING_IDS:
            raise wire.WireError(f"running: expected at most {MAX_RUNNING_IDS} Attempt ids")
        running = [wire.uuid_text(a, "running") for a in running]
        reply = await self.gateway.heartbeat(_fence(body, worker.worker_id), running)
        return wire.heartbeat_json(reply)

    def _opened(self, claimed: Any) -> Any:
        """``claimed`` with its env values in clear. One that does not open stays sealed: the
        worker's spec parser refuses it, so the Attempt ends without its job ever starting."""
        try:
            payload = opened_env_payload(self.sealer, claimed.project_id, claimed.task_id, claimed.payload)
        except SecretsError as exc:  # its words name the task, variable and key id, never a value
            if self.diagnostics is not None:
                self.diagnostics.emit(DiagnosticEvent("error", "gateway.secrets_unopened", str(exc), {
                    "attempt_id": claimed.attempt_id, "project_id": claimed.project_id,
                    "task_id": claimed.task_id}))
            return claimed
        return dataclasses.replace(claimed, payload=payload)

    @staticmethod
    def _lease_tokens(worker: WorkerRegistration, body: dict) -> list[bytes]:
        """The request's fresh lease tokens, no more than the registration's capacity (the store
        bounds the claim by the session's free slots as well)."""
        tokens = [wire.unb64(t, "tokens") for t in wire.field(body, "tokens", list)]
        if len(tokens) > worker.capacity:
            raise wire.WireError(f"tokens: at most the registered capacity, {worker.capacity}")
        return tokens

    async def claim(self, worker: WorkerRegistration, body: dict) -> Any:
        fence = _fence(body, worker.worker_id)
        tokens = self._lease_tokens(worker, body)
        wait_ms = min(self.max_claim_wait_ms, max(0, wire.field(body, "wait_ms", int, optional=True) or 0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        woken = answered = None  # answered: the wake-up the next claim answers (told what it took)
        try:
            while True:
                woken = self.gateway.waiter() if wait_ms else None  # before the claim: no wake-up is missed
                claimed = await self.gateway.claim(fence, tokens) if tokens else []
                if answered is not None:
                    # a wake-up that found nothing, or everything it asked for, goes on to another
                    # waiting claim; the others stay waiting
                    _report(answered, len(claimed), len(tokens))
                    answered = None
                remaining = deadline - loop.time()
                if claimed or woken is None or remaining <= 0:
                    return {"claimed": [wire.claimed_json(self._opened(c)) for c in claimed]}
                self.waits += 1
                try:
                    await asyncio.wait_for(woken.wait(), remaining)
                except asyncio.TimeoutError:
                    return {"claimed": []}
                answered, woken = woken, None
                presented = _PRESENTED.get()
                if presented is None or await self.gateway.identify(presented) != worker:
                    # rotated, revoked or registered anew while it waited: what it would take now is
                    # no longer this token's to receive (its next request says why)
                    return {"claimed": []}
        finally:
            # a wake-up not answered by a claim (a timeout, a refusal, a failure, one that came
            # while a claim that took something was running) is passed on, never lost
            for waiter in (woken, answered):
                if waiter is not None:
                    _discard(waiter)

    async def started(self, worker: WorkerRegistration, body: dict) -> Any:
        reply = await self.gateway.started(_fence(body, worker.worker_id), _lease(body))
        return wire.started_json(reply)

    async def append_log(self, worker: WorkerRegistration, body: dict) -> Any:
        stored = await self.gateway.append_log(_fence(body, worker.worker_id), _lease(body),
                                               wire.field(body, "offset", int), wire.unb64(body.get("data"), "data"))
        return {"stored": stored}

    @staticmethod
    def _completion(worker: WorkerRegistration, body: dict) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``complete``'s arguments and keywords from the request, under the token's worker id."""
        keywords = {"started": bool(wire.field(body, "started", bool)),
                    "log_missing_bytes": wire.field(body, "log_missing_bytes", int), **_stated(body)}
        return (_fence(body, worker.worker_id), _lease(body), wire.outcome_of(body)), keywords

    async def complete(self, worker: WorkerRegistration, body: dict) -> Any:
        args, keywords = self._completion(worker, body)
        return wire.completion_json(await self.gateway.complete(*args, **keywords))

    async def complete_and_claim(self, worker: WorkerRegistration, body: dict) -> Any:
        """``complete``, and a claim with ``tokens`` for the slot it frees, in one store
        transaction: a refusal of either changes nothing. The claim never waits: it answers at
        once with what is claimable (the worker's own claim loop is what waits)."""
        args, keywords = self._completion(worker, body)
        tokens = self._lease_tokens(worker, body)  # refused before the store is asked anything
        combined = self.gateway.complete_and_claim if isinstance(self.gateway, CombinedCompletion) else None
        if tokens and combined is not None:
            reply, claimed = await combined(*args, tokens, **keywords)
        else:
            # a store that cannot do both in one transaction completes alone; the worker's claim
            # loop, woken by the job's end, claims for the freed slot as it would anyway
            reply, claimed = await self.gateway.complete(*args, **keywords), []
        return {"completion": wire.completion_json(reply),
                "claimed": [wire.claimed_json(self._opened(c)) for c in claimed]}

    async def complete_late(self, worker: WorkerRegistration, body: dict) -> Any:
        reply = await self.gateway.complete_late(worker.worker_id, _lease(body), wire.outcome_of(body),
                                                 **_stated(body))
        return wire.completion_json(reply)

    async def close_session(self, worker: WorkerRegistration, body: dict) -> Any:
        await self.gateway.close_session(_fence(body, worker.worker_id))
        return {"closed": True}

    # ------------------------------------------------------------------ the route table

    def routes(self) -> list[RouteSpec]:
        calls = {"open_session": self.open_session, "heartbeat": self.heartbeat, "claim": self.claim,
                 "started": self.started, "append_log": self.append_log, "complete": self.complete,
                 "complete_and_claim": self.complete_and_claim, "complete_late": self.complete_late,
                 "close_session": self.close_session}
        return [RouteSpec(wire.PATHS[name], {"POST": Method(WORKER, self._handler(call), f"worker protocol: {name}")})
                for name, call in calls.items()]


async def open_gateway(spec: Any, dsn: str, pool_size: int) -> Any:
    """The store's gateway pool (``spec``: the backend's WorkerProtocolSpec)."""
    return await spec.create_gateway(dsn, f"qinglong gateway {time.time_ns() % 100000}", pool_size)
