"""The worker protocol over PostgreSQL, the gateway's store side: each of the eight calls is one
statement calling one of the store's SECURITY DEFINER functions (``qinglong.worker_*``), as the
gateway role. No worker program uses it: workers speak to the gateway.

Each member of the gateway's pool (:mod:`.gateway`) is ONE autocommit connection, opened with
the same session options as every other session of this plugin (:func:`.db.session_options`:
the pinned ``search_path``, a statement timeout), its ``application_name`` and the TCP keepalive
defaults. Calls are serialised on it: one connection answers one statement at a time.

A job's completion may also claim for the slot it frees (``complete_and_claim``): both
statements in one transaction, pipelined, so one round trip and one commit serve both; a repeat
after a lost reply is a plain ``complete``.

Refusals come back as the functions' SQLSTATEs and are raised as the contract's types:
``QL001`` :class:`~qinglong.contracts.worker.SessionFenced`, ``QL002``
:class:`~qinglong.contracts.worker.LeaseFenced`, ``QL003``
:class:`~qinglong.contracts.worker.BadWorkerCall`. A connection that cannot be made, breaks, or
does not answer within :data:`CALL_TIMEOUT_S`, and a server that refuses for a while (shutting
down, too many connections, a serialization failure) are dropped and the call raises
:class:`~qinglong.contracts.errors.StoreUnavailable`; the next call connects again. Any other
error (a violated constraint, an error in a function's SQL) is a defect, not an outage:
:class:`~qinglong.contracts.errors.StoreFailed`, and the connection is kept. A call whose
reply was lost may be repeated as it was (the protocol makes every call after claim idempotent).

Secrets: lease tokens travel only as bytea parameters, never in SQL text or any message; the
gateway's DSN and its password are masked in every error (:class:`.db.Secrets`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, Sequence

import psycopg

from qinglong.contracts.errors import (
    SchemaNotReady, SettingsError, StoreAuthFailed, StoreFailed, StoreUnavailable, StoreUnreachable)
from qinglong.contracts.execution import AttemptOutcome, RunState
from qinglong.contracts.worker import (
    SQLSTATE_BAD_CALL,
    SQLSTATE_LEASE_FENCED,
    SQLSTATE_SESSION_FENCED,
    SESSION_CLOSED,
    SESSION_EXPIRED,
    SESSION_REPLACED,
    BadWorkerCall,
    ClaimedAttempt,
    CompletionReply,
    CompletionResult,
    HeartbeatReply,
    LeaseFence,
    LeaseFenced,
    LogRefused,
    OwnStop,
    Session,
    SessionFence,
    SessionFenced,
    StartedReply,
    StopOrder,
    bounded_event_payload,
)

from .db import (
    Secrets, auth_refused, check_dsn, describe_error, describe_target, sever_after, session_options,
    tcp_defaults)

#: Server-side bound on one call (``statement_timeout``).
STATEMENT_TIMEOUT_MS = 5_000
#: Client-side bound on one call: a peer gone silent (a partition) would otherwise hold the call
#: forever; the connection is severed and the call raises StoreUnavailable.
CALL_TIMEOUT_S = 8.0
#: ``connect_timeout`` where the DSN does not set one, seconds.
CONNECT_TIMEOUT_S = 5
#: After a refused login, the next try waits this long, doubling up to the maximum, seconds: a
#: wrong password is not hammered against the server (and its log) while an operator fixes it.
AUTH_BACKOFF_S = 1.0
AUTH_BACKOFF_MAX_S = 30.0

#: The channel the store notifies when an Attempt becomes claimable.
CLAIMABLE_CHANNEL = "qinglong_claimable"

#: SQLSTATEs that mean the store is not there as this worker expects (not migrated, no grant).
_NOT_READY = {"42883": "a worker function is missing (is the database migrated?)",
              "42501": "the role may not execute the worker functions (is the DSN the gateway role's?)",
              "3F000": "the qinglong schema is missing (is the database migrated?)"}

#: Errors of the link or the server rather than of the call (psycopg's OperationalError covers
#: SQLSTATE classes 08, 40, 53-58: a lost connection, a shutdown, too many connections, a
#: statement timeout, a serialization failure or deadlock): retried as an outage.
_OUTAGES = (psycopg.OperationalError, psycopg.InterfaceError)

_SQL_OPEN = ("SELECT session_id::text, generation, lease_expires_at_ms, db_now_ms FROM "
             "qinglong.worker_open_session(%s::text, %s::text[], %s::integer, %s::bigint)")
_SQL_HEARTBEAT = ("SELECT lease_expires_at_ms, db_now_ms, stop_attempt_ids::text[], stop_reasons FROM "
                  "qinglong.worker_heartbeat(%s::text, %s::uuid, %s::bigint, %s::uuid[])")
_SQL_CLAIM = ("SELECT run_id::text, attempt_id::text, attempt_no, lease_version, token_index, "
              "lease_expires_at_ms, project_id, task_id, task_revision, scheduled_for_ms, payload_json, "
              "db_now_ms, event_payload FROM qinglong.worker_claim(%s::text, %s::uuid, %s::bigint, "
              "%s::bytea[])")
_SQL_STARTED = ("SELECT deadline_ms, db_now_ms FROM qinglong.worker_started(%s::text, %s::uuid, %s::bigint, "
                "%s::uuid, %s::bigint, %s::bytea)")
_SQL_APPEND = ("SELECT qinglong.worker_append_log(%s::text, %s::uuid, %s::bigint, %s::uuid, %s::bigint, "
               "%s::bytea, %s::bigint, %s::bytea)")
_SQL_COMPLETE = ("SELECT result, run_state, log_bytes_stored, next_attempt_no, next_not_before_ms FROM "
                 "qinglong.worker_complete(%s::text, %s::uuid, %s::bigint, %s::uuid, %s::bigint, %s::bytea, "
                 "%s::text, %s::integer, %s::integer, %s::bigint, %s::bigint, %s::text, %s::boolean, %s::bigint, "
                 "%s::text, %s::bigint, %s::bigint)")
_SQL_COMPLETE_LATE = ("SELECT result, run_state, log_bytes_stored, next_attempt_no, next_not_before_ms FROM "
                      "qinglong.worker_complete_late(%s::text, %s::uuid, %s::bigint, %s::bytea, %s::text, "
                      "%s::integer, %s::integer, %s::bigint, %s::bigint, %s::text, %s::text, %s::bigint, "
                      "%s::bigint)")
_SQL_CLOSE = "SELECT qinglong.worker_close_session(%s::text, %s::uuid, %s::bigint)"


def _gateway_dsn(dsn: str) -> None:
    """:func:`.db.check_dsn` for ``[api] gateway_dsn`` (its message names that key)."""
    try:
        check_dsn("dsn", dsn)
    except SettingsError as exc:
        raise SettingsError(str(exc).replace("[backend] dsn", "[api] gateway_dsn", 1)) from None


class PostgresWorkerProtocol:
    """:class:`~qinglong.contracts.worker.WorkerProtocol` on one PostgreSQL connection."""

    def __init__(self, dsn: str, application_name: str) -> None:
        _gateway_dsn(dsn)
        self._dsn = dsn
        self._application_name = application_name[:63]
        self._secrets = Secrets([dsn])
        self._target = describe_target(dsn)
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        #: after a refused login: when the next connection may be tried, and the delay after it
        self._auth_retry_at = 0.0
        self._auth_backoff_s = AUTH_BACKOFF_S
        self._auth_error: StoreAuthFailed | None = None
        #: statements sent (a cheap figure for the diagnostics)
        self.calls = 0

    # ------------------------------------------------------------------------------ connection

    async def connect(self) -> None:
        """Open the connection now (the first call would otherwise)."""
        async with self._lock:
            await self._connection()

    async def _connection(self) -> psycopg.AsyncConnection:
        if self._closed:
            raise StoreUnavailable("the gateway's store connection was closed")
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._conn = None
        loop = asyncio.get_running_loop()
        if self._auth_error is not None and loop.time() < self._auth_retry_at:
            raise self._auth_error  # backing off after a refused login
        extra: dict[str, Any] = dict(tcp_defaults(self._dsn))
        if "connect_timeout" not in self._dsn:
            extra["connect_timeout"] = CONNECT_TIMEOUT_S
        try:
            conn = await asyncio.wait_for(psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, options=session_options(STATEMENT_TIMEOUT_MS),
                application_name=self._application_name, **extra), CALL_TIMEOUT_S + CONNECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise StoreUnreachable(f"cannot connect to PostgreSQL ({self._target}): no answer") from None
        except psycopg.Error as exc:
            if auth_refused(exc):
                self._auth_error = StoreAuthFailed(
                    f"PostgreSQL ({self._target}) refused the gateway's login: "
                    f"{describe_error(exc, self._secrets)}; check [api] gateway_dsn (its user and password) "
                    "and the server's access rules")
                self._auth_retry_at = loop.time() + self._auth_backoff_s
                self._auth_backoff_s = min(AUTH_BACKOFF_MAX_S, self._auth_backoff_s * 2)
                raise self._auth_error from None
            raise StoreUnreachable(f"cannot connect to PostgreSQL ({self._target}): "
                                   f"{describe_error(exc, self._secrets)}") from None
        self._auth_error = None
        self._auth_backoff_s = AUTH_BACKOFF_S
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                # a broken or severed connection: closing it sends nothing that could hang
                conn.pgconn.finish()
            except Exception:
                pass

    async def _call(self, name: str, sql: str, params: Sequence[Any], *, many: bool = False) -> Any:
        """Run one statement; its rows (``many``) or its first row. Refusals and failures raised
        as the contract's types (see the module docstring)."""
        async def send(conn: psycopg.AsyncConnection) -> list[Any]:
            cur = await conn.execute(sql, params, prepare=True)
            return await cur.fetchall()

        rows = await self._exchange(name, send)
        return rows if many else (rows[0] if rows else None)

    async def _exchange(self, name: str, send: Callable[[psycopg.AsyncConnection], Awaitable[Any]]) -> Any:
        """``send`` on the connection, alone and bounded; what it returns. Refusals and failures
        are raised as the contract's types (``name`` says which call)."""
        async with self._lock:
            conn = await self._connection()
            self.calls += 1
            try:
                with sever_after(conn, CALL_TIMEOUT_S) as severance:
                    result = await send(conn)
            except asyncio.CancelledError:
                # the caller gave up: whatever was in flight is abandoned with the connection
                self._drop()
                raise
            except psycopg.Error as exc:
                raise self._translate(name, exc, severance.severed) from None
        return result

    def _translate(self, name: str, exc: psycopg.Error, severed: bool) -> Exception:
        sqlstate = getattr(exc, "sqlstate", None)
        primary = ""
        diag = getattr(exc, "diag", None)
        if diag is not None and diag.message_primary:
            primary = self._secrets.mask(diag.message_primary)
        if sqlstate == SQLSTATE_SESSION_FENCED:
            detail = (diag.message_detail if diag is not None else None) or ""
            return SessionFenced(_session_reason(detail), f"{name}: {primary or 'the session is fenced'}")
        if sqlstate == SQLSTATE_LEASE_FENCED:
            return LeaseFenced("lease_fenced", f"{name}: {primary or 'the lease is fenced'}")
        if sqlstate is not None and sqlstate.startswith("53") and name == "worker_append_log":
            # insufficient resources (a full disk): the store answers, it only keeps no more log
            return LogRefused(f"{name}: the database cannot store more log ({sqlstate}: "
                              f"{primary or 'insufficient resources'})")
        if sqlstate == SQLSTATE_BAD_CALL:
            return BadWorkerCall(f"{name}: {primary or 'an argument is out of bounds'}")
        if sqlstate in _NOT_READY:
            return SchemaNotReady(f"{name} ({self._target}): {_NOT_READY[sqlstate]}: "
                                  f"{describe_error(exc, self._secrets)}")
        conn = self._conn
        if severed or isinstance(exc, _OUTAGES) or conn is None or conn.broken:
            # the link or the server (lost, shutting down, too many connections, a statement
            # timeout, a serialization failure or deadlock): the connection is not trusted
            # again; the caller retries the same call
            self._drop()
            why = "no answer within the call's bound" if severed else describe_error(exc, self._secrets)
            return StoreUnavailable(f"{name} ({self._target}): {why}")
        # the store answered, and the call itself failed (a violated constraint, an error in the
        # SQL): a defect that the same call repeats, never an outage to wait out
        return StoreFailed(f"{name}: {describe_error(exc, self._secrets)}")

    # ------------------------------------------------------------------------------ the calls

    async def open_session(self, worker_id: str, labels: Sequence[str], capacity: int,
                           lease_ms: int) -> Session:
        row = await self._call("worker_open_session", _SQL_OPEN,
                               (worker_id, list(labels), int(capacity), int(lease_ms)))
        session_id, generation, expires, now = row
        return Session(SessionFence(worker_id, session_id, int(generation)), int(lease_ms), int(capacity),
                       tuple(labels), int(expires), int(now))

    async def heartbeat(self, fence: SessionFence, running: Sequence[str]) -> HeartbeatReply:
        row = await self._call("worker_heartbeat", _SQL_HEARTBEAT,
                               (*_session(fence), list(running)))
        expires, now, ids, reasons = row
        stops = tuple(StopOrder(str(a), str(r)) for a, r in zip(ids or (), reasons or ()))
        return HeartbeatReply(int(expires), int(now), stops)

    async def claim(self, fence: SessionFence, tokens: Sequence[bytes]) -> Sequence[ClaimedAttempt]:
        if not tokens:
            return []
        rows = await self._call("worker_claim", _SQL_CLAIM, (*_session(fence), [bytes(t) for t in tokens]),
                                many=True)
        return _claimed(rows, tokens)

    async def started(self, fence: SessionFence, lease: LeaseFence) -> StartedReply:
        row = await self._call("worker_started", _SQL_STARTED, (*_session(fence), *_lease(lease)))
        return StartedReply(int(row[0]), int(row[1]))

    async def append_log(self, fence: SessionFence, lease: LeaseFence, offset: int, data: bytes) -> int:
        row = await self._call("worker_append_log", _SQL_APPEND,
                               (*_session(fence), *_lease(lease), int(offset), bytes(data)))
        return int(row[0])

    async def complete(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome, *,
                       started: bool = True, log_missing_bytes: int = 0,
                       own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        row = await self._call("worker_complete", _SQL_COMPLETE,
                               _completion_params(fence, lease, outcome, started, log_missing_bytes, own_stop,
                                                  exit_age_ms))
        return _completion(row)

    async def complete_and_claim(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome,
                                 tokens: Sequence[bytes], *, started: bool = True, log_missing_bytes: int = 0,
                                 own_stop: OwnStop | None = None, exit_age_ms: int | None = None,
                                 ) -> tuple[CompletionReply, Sequence[ClaimedAttempt]]:
        """``complete``, then ``claim`` with ``tokens`` for the slot it frees, in ONE transaction
        sent at once: one round trip and one commit instead of two. A refusal of either undoes
        both and is raised as ``complete`` raises it."""
        params = _completion_params(fence, lease, outcome, started, log_missing_bytes, own_stop, exit_age_ms)
        token_list = [bytes(t) for t in tokens]

        async def send(conn: psycopg.AsyncConnection) -> tuple[Any, list[Any]]:
            # the statements before the pipeline's one Sync are one implicit transaction:
            # committed together at the Sync, or undone together by an error in either
            async with conn.pipeline():
                done = await conn.execute(_SQL_COMPLETE, params, prepare=True)
                more = await conn.execute(_SQL_CLAIM, (*_session(fence), token_list), prepare=True)
            return await done.fetchone(), await more.fetchall()

        row, rows = await self._exchange("worker_complete", send)
        return _completion(row), _claimed(rows, tokens)

    async def complete_late(self, worker_id: str, lease: LeaseFence, outcome: AttemptOutcome, *,
                            own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        row = await self._call("worker_complete_late", _SQL_COMPLETE_LATE, (
            worker_id, *_lease(lease), outcome.state.value, outcome.exit_code, outcome.signal,
            int(outcome.log_bytes or 0), int(outcome.log_dropped_bytes or 0), outcome.reason,
            None if own_stop is None else getattr(own_stop.reason, "value", own_stop.reason),
            None if own_stop is None else int(own_stop.age_ms), None if exit_age_ms is None else int(exit_age_ms)))
        return _completion(row)

    async def close_session(self, fence: SessionFence) -> None:
        await self._call("worker_close_session", _SQL_CLOSE, _session(fence))

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await asyncio.wait_for(conn.close(), 2.0)
            except Exception:
                conn.pgconn.finish()


def _completion_params(fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome, started: bool,
                       log_missing_bytes: int, own_stop: OwnStop | None,
                       exit_age_ms: int | None) -> tuple[Any, ...]:
    """``worker_complete``'s arguments (its form with the worker's own stop request and the age
    of the job's exit)."""
    return (*_session(fence), *_lease(lease), outcome.state.value, outcome.exit_code, outcome.signal,
            int(outcome.log_bytes or 0), int(outcome.log_dropped_bytes or 0), outcome.reason, bool(started),
            int(log_missing_bytes), None if own_stop is None else getattr(own_stop.reason, "value", own_stop.reason),
            None if own_stop is None else int(own_stop.age_ms), None if exit_age_ms is None else int(exit_age_ms))


def _completion(row: Sequence[Any]) -> CompletionReply:
    result, run_state, stored, next_no, next_at = row
    return CompletionReply(CompletionResult(result), RunState(run_state), int(stored or 0),
                           None if next_no is None else int(next_no),
                           None if next_at is None else int(next_at))


def _claimed(rows: Sequence[Sequence[Any]], tokens: Sequence[bytes]) -> list[ClaimedAttempt]:
    claimed = []
    for (run_id, attempt_id, attempt_no, lease_version, token_index, expires, project_id, task_id,
         revision, scheduled_for, payload_json, now, event_payload) in rows:
        try:
            payload = json.loads(payload_json) if payload_json else {}
        except ValueError:
            payload = {"command": None}  # refused by the spec parser, naming the key
        if not isinstance(payload, dict):
            payload = {"command": None}
        token = tokens[int(token_index) - 1]
        claimed.append(ClaimedAttempt(
            run_id, attempt_id, int(attempt_no), project_id, task_id, int(revision), int(scheduled_for),
            payload, LeaseFence(attempt_id, int(lease_version), token), int(expires), int(now),
            bounded_event_payload(event_payload)))
    return claimed


def _session_reason(detail: str) -> str:
    """Why a session was refused: the DETAIL code of the store's QL001 (``qinglong._session``)."""
    if detail in (SESSION_REPLACED, SESSION_EXPIRED, SESSION_CLOSED):
        return detail
    return "session_fenced"


def _session(fence: SessionFence) -> tuple[str, str, int]:
    return fence.worker_id, fence.session_id, int(fence.generation)


def _lease(lease: LeaseFence) -> tuple[str, int, bytes]:
    return lease.attempt_id, int(lease.lease_version), bytes(lease.token)
