"""The worker gateway's side of the store: the worker protocol on a small bounded pool of
connections as the gateway's role (``gateway_role``: EXECUTE on the worker functions and
``worker_identity``, no table privilege), shared by every worker the API tier serves, plus one
listener connection waiting on channel ``qinglong_claimable`` to wake waiting claims.

So the database sees ``pool_size + 1`` connections of the gateway however many workers there
are; a worker host holds no database credential at all.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

import psycopg

from qinglong.contracts.errors import StoreUnavailable
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
    WorkerRegistration,
)

from .db import session_options, tcp_defaults
from .settings import ClusterPostgresSettings
from .roles import GATEWAY_FUNCTIONS, WORKER_FUNCTIONS
from .worker_client import CLAIMABLE_CHANNEL, CONNECT_TIMEOUT_S, STATEMENT_TIMEOUT_MS, PostgresWorkerProtocol

CHANNEL = CLAIMABLE_CHANNEL
#: ``[backend] gateway_role`` when it is not set.
DEFAULT_GATEWAY_ROLE: str = ClusterPostgresSettings.model_fields["gateway_role"].default
#: The most connections a gateway pool may hold.
MAX_POOL_SIZE = 64
#: After the listener connection failed, the next try waits this long, seconds.
LISTEN_RETRY_S = 1.0

_SQL_IDENTIFY = ("SELECT worker_id, labels, projects, capacity FROM qinglong.worker_identity(%s::bytea)")
#: Role settings and who else may execute the worker functions (readiness of the gateway).
_SQL_ROLE = """
SELECT current_user::text, session_user::text, r.rolconnlimit, r.rolsuper,
       coalesce((SELECT pg_catalog.array_agg(g.rolname::text ORDER BY g.rolname) FROM pg_catalog.pg_auth_members m
                 JOIN pg_catalog.pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid), '{}'),
       coalesce((SELECT pg_catalog.array_agg(g.rolname::text ORDER BY g.rolname) FROM pg_catalog.pg_auth_members m
                 JOIN pg_catalog.pg_roles g ON g.oid = m.member WHERE m.roleid = r.oid), '{}')
FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
"""
_SQL_EXECUTORS = """
SELECT DISTINCT p.proname, coalesce(g.rolname, 'PUBLIC')
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
WHERE n.nspname = 'qinglong' AND p.proname = ANY (%s) AND a.privilege_type = 'EXECUTE'
  AND a.grantee <> p.proowner AND (g.rolname IS NULL OR g.rolname <> current_user)
ORDER BY 1, 2
"""


class PostgresWorkerGateway:
    """:class:`~qinglong.contracts.worker.WorkerGateway` over PostgreSQL."""

    def __init__(self, dsn: str, application_name: str, pool_size: int, *,
                 gateway_role: str = DEFAULT_GATEWAY_ROLE) -> None:
        if not 1 <= pool_size <= MAX_POOL_SIZE:
            raise ValueError(f"pool size: expected 1 to {MAX_POOL_SIZE}")
        self._dsn = dsn
        #: ``[backend] gateway_role``: the only role the gateway's sessions may be
        self.gateway_role = gateway_role
        self._members = [PostgresWorkerProtocol(dsn, f"{application_name} {i}") for i in range(pool_size)]
        self._free: asyncio.Queue[PostgresWorkerProtocol] = asyncio.Queue()
        for member in self._members:
            self._free.put_nowait(member)
        self._application_name = application_name
        self._woken = asyncio.Event()
        self._listener: asyncio.Task | None = None
        self._listening = False
        self._closed = False

    # ------------------------------------------------------------------ pool

    async def _with(self, call: Callable[[PostgresWorkerProtocol], Awaitable[Any]]) -> Any:
        member = await self._free.get()
        try:
            return await call(member)
        finally:
            self._free.put_nowait(member)

    @property
    def connections(self) -> int:
        """Connections open now (the pool's and the listener's)."""
        opened = sum(1 for m in self._members if m._conn is not None and not m._conn.closed)
        return opened + (1 if self._listening else 0)

    # ------------------------------------------------------------------ identity, readiness

    async def identify(self, digest: bytes) -> WorkerRegistration | None:
        row = await self._with(lambda m: m._call("worker_identity", _SQL_IDENTIFY, (bytes(digest),)))
        if row is None:
            return None
        worker_id, labels, projects, capacity = row
        return WorkerRegistration(worker_id, tuple(labels or ()), tuple(projects or ()), int(capacity))

    async def check(self) -> list[str]:
        async def body(member: PostgresWorkerProtocol) -> list[str]:
            problems: list[str] = []
            current, session, limit, superuser, member_of, members = await member._call(
                "gateway_role", _SQL_ROLE, ())
            if current != self.gateway_role or session != self.gateway_role:
                # another login (the owner's, a superuser switching to the gateway's role with
                # SET ROLE) would pass the checks below while acting with its own privileges
                problems.append(f"[api] gateway_dsn logs in as current_user {current!r}, session_user "
                                f"{session!r}; expected the gateway's role {self.gateway_role!r} "
                                "([backend] gateway_role)")
            if superuser:
                problems.append("the gateway's role is a superuser")
            if member_of:
                problems.append(f"the gateway's role is a member of {', '.join(member_of)}")
            if members:
                problems.append(f"the gateway's role has member(s) {', '.join(members)}, who could act "
                                "with its privileges")
            if limit is None or int(limit) < 0:
                problems.append("the gateway's role has no CONNECTION LIMIT (ALTER ROLE ... CONNECTION LIMIT n)")
            for name, grantee in await member._call("gateway_executors", _SQL_EXECUTORS,
                                                    (list(WORKER_FUNCTIONS + GATEWAY_FUNCTIONS),), many=True):
                problems.append(f"{grantee} may execute qinglong.{name}, which only the gateway's role may")
            return problems

        return await self._with(body)

    # ------------------------------------------------------------------ waking claims

    def waiter(self) -> asyncio.Event:
        """An event set at the next notification that an Attempt became claimable (take it before
        the claim that found nothing, so a notification in between is not missed)."""
        if self._listener is None and not self._closed:
            self._listener = asyncio.create_task(self._listen())
        return self._woken

    def _wake(self) -> None:
        woken, self._woken = self._woken, asyncio.Event()
        woken.set()

    async def _listen(self) -> None:
        while not self._closed:
            try:
                extra: dict[str, Any] = dict(tcp_defaults(self._dsn))
                if "connect_timeout" not in self._dsn:
                    extra["connect_timeout"] = CONNECT_TIMEOUT_S
                conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, options=session_options(STATEMENT_TIMEOUT_MS),
                    application_name=f"{self._application_name} listener"[:63], **extra)
            except psycopg.Error:
                await asyncio.sleep(LISTEN_RETRY_S)
                continue
            try:
                await conn.execute(f"LISTEN {CHANNEL}")
                self._listening = True
                self._wake()  # anything admitted while nobody listened is looked for now
                async for _ in conn.notifies():
                    self._wake()
            except psycopg.Error:
                pass
            finally:
                self._listening = False
                try:
                    conn.pgconn.finish()
                except Exception:
                    pass
            if not self._closed:
                await asyncio.sleep(LISTEN_RETRY_S)

    # ------------------------------------------------------------------ the protocol

    async def open_session(self, worker_id: str, labels: Sequence[str], capacity: int, lease_ms: int) -> Session:
        return await self._with(lambda m: m.open_session(worker_id, labels, capacity, lease_ms))

    async def heartbeat(self, fence: SessionFence, running: Sequence[str]) -> HeartbeatReply:
        return await self._with(lambda m: m.heartbeat(fence, running))

    async def claim(self, fence: SessionFence, tokens: Sequence[bytes]) -> Sequence[ClaimedAttempt]:
        return await self._with(lambda m: m.claim(fence, tokens))

    async def started(self, fence: SessionFence, lease: LeaseFence) -> StartedReply:
        return await self._with(lambda m: m.started(fence, lease))

    async def append_log(self, fence: SessionFence, lease: LeaseFence, offset: int, data: bytes) -> int:
        return await self._with(lambda m: m.append_log(fence, lease, offset, data))

    async def complete(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome, *,
                       started: bool = True, log_missing_bytes: int = 0,
                       own_stop: OwnStop | None = None) -> CompletionReply:
        return await self._with(lambda m: m.complete(fence, lease, outcome, started=started,
                                                     log_missing_bytes=log_missing_bytes, own_stop=own_stop))

    async def complete_and_claim(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome,
                                 tokens: Sequence[bytes], *, started: bool = True, log_missing_bytes: int = 0,
                                 own_stop: OwnStop | None = None,
                                 ) -> tuple[CompletionReply, Sequence[ClaimedAttempt]]:
        """``complete`` and ``claim`` in one transaction on one member (see
        :meth:`.worker_client.PostgresWorkerProtocol.complete_and_claim`)."""
        return await self._with(lambda m: m.complete_and_claim(fence, lease, outcome, tokens, started=started,
                                                               log_missing_bytes=log_missing_bytes,
                                                               own_stop=own_stop))

    async def complete_late(self, worker_id: str, lease: LeaseFence, outcome: AttemptOutcome) -> CompletionReply:
        return await self._with(lambda m: m.complete_late(worker_id, lease, outcome))

    async def close_session(self, fence: SessionFence) -> None:
        await self._with(lambda m: m.close_session(fence))

    async def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.cancel()
            try:
                await self._listener
            except (asyncio.CancelledError, Exception):
                pass
        for member in self._members:
            await member.close()
        self._wake()


async def create_worker_gateway(dsn: str, application_name: str, pool_size: int, *,
                                gateway_role: str = DEFAULT_GATEWAY_ROLE) -> PostgresWorkerGateway:
    """A gateway pool (connections open on first use; an unreachable store is StoreUnavailable
    at the call that needs it); its check refuses a login that is not ``gateway_role``."""
    from .worker_client import _gateway_dsn

    _gateway_dsn(dsn)
    return PostgresWorkerGateway(dsn, application_name, pool_size, gateway_role=gateway_role)


__all__ = ["CHANNEL", "PostgresWorkerGateway", "StoreUnavailable", "create_worker_gateway"]
