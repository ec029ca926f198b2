"""The worker protocol over HTTP(S) to the API tier's gateway (``/worker/v1``), with the Python
standard library alone (``http.client``, ``ssl``): a worker host needs no database driver and
holds no database credential, only its own token (``[worker] token_file``, mode 0600).

Two kept-alive connections: one for claims (a claim may wait at the gateway until a Run is
claimable) and one for everything else (heartbeats must never queue behind a waiting claim).
Each call runs in a thread with a bound on the socket; a connection that fails is dropped and the
call raises :class:`~qinglong.contracts.errors.StoreUnavailable` (the worker retries it as it
retries a store); the next call connects again. A kept-alive connection the gateway closed
while idle is tried once more on a new one, but for ``complete_and_claim``, whose claim must
never be made twice: a connection found closed is replaced before it is sent, and a failure
after is raised (the worker repeats the completion alone). The token is sent only in the
Authorization header and never appears in an error; a 401 re-reads the token file once (a rotated
token), and a token still refused is not sent again before a pause that doubles at each refusal.
A 500 (the store failed the call: a defect, not an outage) raises
:class:`~qinglong.contracts.errors.StoreFailed`, a 503 ``schema_not_ready`` (a worker function
missing or its EXECUTE revoked) :class:`~qinglong.contracts.errors.StoreNotReady`, and that call
is not sent again before a pause that doubles at each failure.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import select
import socket
import ssl
import stat
import threading
from typing import Any, Sequence
from urllib.parse import urlsplit

from qinglong.contracts import worker_wire as wire
from qinglong.contracts.errors import SettingsError, StoreAuthFailed, StoreFailed, StoreUnavailable, quoted
from qinglong.contracts.execution import AttemptOutcome
from qinglong.contracts.worker import (
    ClaimedAttempt,
    CompletionReply,
    HeartbeatReply,
    LeaseFence,
    OwnStop,
    Session,
    SessionFence,
    StartedReply,
    WORKER_TOKEN_PREFIX,
)

#: Bound on one call's socket operations, seconds (a claim adds the time it may wait).
CALL_TIMEOUT_S = 8.0
#: After a refused token, the next try waits this long, doubling up to the maximum, seconds: a
#: wrong token is not hammered against the gateway (and its log) while an operator fixes it.
AUTH_BACKOFF_S = 1.0
AUTH_BACKOFF_MAX_S = 30.0
#: After a call the store failed (a defect behind the gateway, answered 500), that call is not
#: sent again before this pause, doubling up to the maximum, seconds: it would fail the same way
#: until the defect is fixed. Per call, so a failing completion holds back no heartbeat.
FAILED_BACKOFF_S = 1.0
FAILED_BACKOFF_MAX_S = 60.0
#: Log bytes per request: a chunk of the protocol is cut to fit the API's body limit (base64).
HTTP_LOG_CHUNK_BYTES = 64 * 1024


def read_token_file(path: str) -> str:
    """The worker's token from ``path``: refused, naming the key, when the file is missing, can be
    read or written by anyone but its owner, or holds no worker token. Never says the token."""
    key = "[worker] token_file"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise SettingsError(f"{key}: cannot open {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SettingsError(f"{key}: {path} is not a regular file")
        if info.st_mode & 0o077:
            raise SettingsError(f"{key}: {path} has mode {stat.S_IMODE(info.st_mode):04o}; expected 0600 "
                                f"(readable by its owner alone: chmod 600 {path})")
        if info.st_uid != os.geteuid():
            raise SettingsError(f"{key}: {path} belongs to uid {info.st_uid}, not to this worker's user "
                                f"({os.geteuid()})")
        data = os.read(fd, 1024)
    finally:
        os.close(fd)
    token = data.decode("utf-8", "replace").strip()
    if not token.startswith(WORKER_TOKEN_PREFIX) or len(token) > 512 or any(c.isspace() for c in token):
        raise SettingsError(f"{key}: {path} holds no worker token (one line starting with "
                            f"{WORKER_TOKEN_PREFIX}, as `qinglong worker register` prints it)")
    return token


class _Link:
    """One kept-alive connection, used by one call at a time."""

    def __init__(self, client: "HttpWorkerProtocol") -> None:
        self._client = client
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def abort(self) -> None:
        """End a request in flight (a claim waiting at the gateway): the thread blocked reading its
        answer returns at once, so a stopping worker does not wait out the claim's wait."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _dropped(self) -> bool:
        """Whether the kept-alive connection was closed by the gateway while idle (its socket
        reads the end, or anything, before a request was sent)."""
        sock = self._conn.sock if self._conn is not None else None
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def post(self, path: str, body: bytes, timeout_s: float, *, resend: bool = True) -> tuple[int, bytes, str]:
        """One request: its status, body and ``WWW-Authenticate`` header. A kept-alive connection that fails is tried once more on a
        new one when ``resend`` (the call may be repeated as it was); otherwise a connection that
        was closed while idle is replaced before sending, and a failure once the request may have
        reached the gateway is raised, never sent again."""
        with self._lock:
            if not resend and self._dropped():
                self.drop()
            for attempt in (0, 1):
                fresh = self._conn is None
                if fresh:
                    self._conn = self._client._connection(timeout_s)
                conn = self._conn
                conn.timeout = timeout_s
                if conn.sock is not None:
                    conn.sock.settimeout(timeout_s)
                try:
                    conn.request("POST", path, body=body, headers=self._client._headers(len(body)))
                    response = conn.getresponse()
                    data = response.read()
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    # a kept-alive connection the server closed while idle: once more on a new one
                    self.drop()
                    if fresh or attempt or not resend:
                        raise StoreUnavailable(f"{self._client.target}: the gateway closed the connection "
                                               f"({type(exc).__name__})") from None
                    continue
                except (OSError, http.client.HTTPException) as exc:
                    self.drop()
                    what = "no answer within the call's bound" if isinstance(exc, TimeoutError) else \
                        (getattr(exc, "strerror", None) or type(exc).__name__)
                    raise StoreUnavailable(f"{self._client.target}: {what}") from None
                if response.getheader("connection", "").lower() == "close":
                    self.drop()
                return response.status, data, response.getheader("www-authenticate", "")
        raise StoreUnavailable(f"{self._client.target}: no answer")  # not reached


def _completion_body(fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome, started: bool,
                     log_missing_bytes: int, own_stop: OwnStop | None = None,
                     exit_age_ms: int | None = None) -> dict[str, Any]:
    """What ``complete`` sends (``complete_and_claim`` adds its tokens). ``own_stop`` only when
    there is one: a gateway of an earlier build ignores a key it does not read."""
    body = {**wire.fence_json(fence), "lease": wire.lease_json(lease), "outcome": wire.outcome_json(outcome),
            "started": bool(started), "log_missing_bytes": int(log_missing_bytes)}
    if own_stop is not None:
        body["own_stop"] = wire.own_stop_json(own_stop)
    if exit_age_ms is not None:
        body["exit_age_ms"] = max(0, int(exit_age_ms))
    return body


class HttpWorkerProtocol:
    """:class:`~qinglong.contracts.worker.WorkerProtocol` over HTTP(S) to the gateway."""

    #: a claim may wait at the gateway (the worker need not sleep between claims)
    long_polls = True

    def __init__(self, url: str, token_file: str, application_name: str, *, ca_file: str | None = None) -> None:
        try:
            parts = urlsplit(url)
            parts.port  # urllib checks the port only when it is read
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"[worker] url: expected http(s)://host[:port] of the API tier, got {quoted(url)}")
        self.target = f"{parts.scheme}://{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._base = parts.path.rstrip("/")
        self._token_file = token_file
        self._token = read_token_file(token_file)
        #: after a refused token: the refusal, when the next try may be made, and the pause after it
        self._auth_error: StoreAuthFailed | None = None
        self._auth_retry_at = 0.0
        self._auth_failed_at = 0.0
        self._auth_backoff_s = AUTH_BACKOFF_S
        #: per call the store failed: the failure, when it may be sent again, and the next pause
        self._failed: dict[str, tuple[StoreFailed, float, float]] = {}
        self._agent = application_name
        self._ssl: ssl.SSLContext | None = None
        if self._scheme == "https":
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._control = _Link(self)
        self._claims = _Link(self)
        self.calls = 0

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._ssl is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)

    def _headers(self, length: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json",
                "Content-Length": str(length), "User-Agent": self._agent[:100]}

    async def _call(self, name: str, body: dict[str, Any], *, link: _Link | None = None,
                    wait_s: float = 0.0, resend: bool = True) -> Any:
        loop = asyncio.get_running_loop()
        if self._auth_error is not None and loop.time() < self._auth_retry_at:
            raise self._auth_error  # pausing after a refused token
        failed = self._failed.get(name)
        if failed is not None and loop.time() < failed[1]:
            raise failed[0]  # pausing after the store failed this call
        payload = json.dumps(body, separators=(",", ":")).encode()
        link = link or self._control
        path = self._base + wire.PATHS[name]
        for reread in (False, True):
            self.calls += 1
            sent_at = loop.time()
            status, data, challenge = await asyncio.to_thread(link.post, path, payload, CALL_TIMEOUT_S + wait_s,
                                                              resend=resend)
            if status == 401 and not reread:
                try:
                    self._token = read_token_file(self._token_file)  # rotated meanwhile?
                except SettingsError:
                    pass
                continue
            break
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = None
        if status == 200 and not isinstance(answer, dict):
            # a captive portal, a proxy's page, another server: away, as an unreachable gateway is
            raise StoreUnavailable(f"{self.target}: the answer to {name} is not the worker protocol (a JSON "
                                   "object); is [worker] url the API tier's worker gateway?")
        if not isinstance(answer, dict):
            answer = {}
        if status == 401:
            if self._auth_error is not None and loop.time() < self._auth_retry_at:
                raise self._auth_error  # sent before the pause began: the same refusal
            if f'realm="{wire.GATEWAY_REALM}"' in challenge:
                self._auth_error = StoreAuthFailed(
                    f"{self.target} refused the worker's token ({name}): it is unknown or revoked; check "
                    "[worker] token_file (`qinglong worker rotate` prints a new one)")
            else:  # not the gateway's refusal: the token was never looked at
                self._auth_error = StoreAuthFailed(
                    f"{self.target} answered {name} with 401, but not as a worker gateway does: it serves "
                    "no worker gateway at [worker] url (an API tier needs [api] gateway_dsn to serve one), "
                    "or something in between asks for its own credentials")
            self._auth_failed_at = loop.time()
            self._auth_retry_at = self._auth_failed_at + self._auth_backoff_s
            self._auth_backoff_s = min(AUTH_BACKOFF_MAX_S, self._auth_backoff_s * 2)
            raise self._auth_error
        if self._auth_error is None or sent_at >= self._auth_failed_at:
            # an answer to a request sent before the refusal (a long-polled claim) proves nothing
            # about the token now: the refusal and its growing pause stand
            self._auth_error = None
            self._auth_backoff_s = AUTH_BACKOFF_S
        if status == 200:
            self._failed.pop(name, None)
            return answer
        if status == 429:
            raise StoreUnavailable(f"{self.target}: too many failed authentications from this address")
        refusal = wire.refusal_of(status, answer)
        if isinstance(refusal, StoreFailed):
            refusal = type(refusal)(f"{self.target}: {name}: {refusal}")
            pause = failed[2] if failed is not None else FAILED_BACKOFF_S
            self._failed[name] = (refusal, loop.time() + pause, min(FAILED_BACKOFF_MAX_S, pause * 2))
        raise refusal

    # ------------------------------------------------------------------ the calls

    async def open_session(self, worker_id: str, labels: Sequence[str], capacity: int, lease_ms: int) -> Session:
        # the gateway binds the id, the labels and the capacity to the token's registration
        return wire.session_of(await self._call("open_session", {"lease_ms": int(lease_ms)}))

    async def heartbeat(self, fence: SessionFence, running: Sequence[str]) -> HeartbeatReply:
        return wire.heartbeat_of(await self._call("heartbeat", {**wire.fence_json(fence), "running": list(running)}))

    async def claim(self, fence: SessionFence, tokens: Sequence[bytes], wait_ms: int = 0) -> Sequence[ClaimedAttempt]:
        if not tokens:
            return []
        wait_ms = max(0, min(int(wait_ms), wire.MAX_CLAIM_WAIT_MS))
        answer = await self._call("claim", {**wire.fence_json(fence), "tokens": [wire.b64(t) for t in tokens],
                                            "wait_ms": wait_ms}, link=self._claims, wait_s=wait_ms / 1000)
        return [wire.claimed_of(item) for item in wire.field(answer, "claimed", list)]

    async def started(self, fence: SessionFence, lease: LeaseFence) -> StartedReply:
        return wire.started_of(await self._call("started", {**wire.fence_json(fence), "lease": wire.lease_json(lease)}))

    async def append_log(self, fence: SessionFence, lease: LeaseFence, offset: int, data: bytes) -> int:
        stored = offset
        for at in range(0, max(1, len(data)), HTTP_LOG_CHUNK_BYTES):
            piece = bytes(data[at:at + HTTP_LOG_CHUNK_BYTES])
            answer = await self._call("append_log", {**wire.fence_json(fence), "lease": wire.lease_json(lease),
                                                     "offset": offset + at, "data": wire.b64(piece)})
            stored = wire.field(answer, "stored", int)
        return stored

    async def complete(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome, *,
                       started: bool = True, log_missing_bytes: int = 0,
                       own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        return wire.completion_of(await self._call("complete", _completion_body(
            fence, lease, outcome, started, log_missing_bytes, own_stop, exit_age_ms)))

    async def complete_and_claim(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome,
                                 tokens: Sequence[bytes], *, started: bool = True, log_missing_bytes: int = 0,
                                 own_stop: OwnStop | None = None, exit_age_ms: int | None = None,
                                 ) -> tuple[CompletionReply, list[ClaimedAttempt]]:
        """``complete``, and a claim with ``tokens`` for the slot it frees, in one request and one
        store transaction (a refusal of either changes nothing and is raised as ``complete``
        raises it). The claim does not wait. Never sent twice: its claim is not idempotent (a
        second one would lease other Attempts with the same tokens), so a failure after sending
        raises StoreUnavailable and the caller repeats the completion alone; what the lost answer
        claimed goes back to the queue when its lease, which no heartbeat renews, runs out."""
        answer = await self._call("complete_and_claim", {
            **_completion_body(fence, lease, outcome, started, log_missing_bytes, own_stop, exit_age_ms),
            "tokens": [wire.b64(t) for t in tokens]}, resend=False)
        return wire.completion_and_claims_of(answer)

    async def complete_late(self, worker_id: str, lease: LeaseFence, outcome: AttemptOutcome, *,
                            own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        body: dict[str, Any] = {"lease": wire.lease_json(lease), "outcome": wire.outcome_json(outcome)}
        # only when there are: a gateway of an earlier build ignores keys it does not read
        if own_stop is not None:
            body["own_stop"] = wire.own_stop_json(own_stop)
        if exit_age_ms is not None:
            body["exit_age_ms"] = max(0, int(exit_age_ms))
        return wire.completion_of(await self._call("complete_late", body))

    async def close_session(self, fence: SessionFence) -> None:
        await self._call("close_session", wire.fence_json(fence))

    async def close(self) -> None:
        # after the session's close: whatever a waiting claim still takes is fenced or requeued
        self._claims.abort()
        self._control.drop()
        self._claims.drop()


async def connect_http_protocol(url: str, token_file: str, application_name: str,
                                ca_file: str | None = None) -> HttpWorkerProtocol:
    """The gateway's client (nothing is sent until the first call)."""
    return HttpWorkerProtocol(url, token_file, application_name, ca_file=ca_file)
