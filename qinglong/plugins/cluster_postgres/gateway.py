"""The worker gateway's side of the store: the worker protocol on a small bounded pool of
connections as the gateway's role (``gateway_role``: EXECUTE on the worker functions and
``worker_identity``, no table privilege), shared by every worker the API tier serves, plus one
listener connection waiting on channel ``qinglong_claimable`` to wake waiting claims.

So the database sees ``pool_size + 1`` connections of the gateway however many workers there
are; a worker host holds no database credential at all.

A notification wakes ONE waiting claim, not every one: each woken claim is one statement on
the pool, and 20 waiting workers all claiming for the one Run an admission notified queued 20
claims (and their token checks) on 4 connections ahead of everything else. The woken claim
reports what it took (:meth:`ClaimWaiter.claimed`): nothing (the Run may be for another
worker's labels or projects) passes the wake-up to the next waiter, at most once around the
waiters there were; all it asked for (more may be claimable) passes it on once more; less than
it asked for ends it there. A waiter that leaves without claiming after its wake-up passes it on.
"""

from __future__ import annotations

import asyncio
import collections
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


class ClaimWaiter:
    """One waiting claim's place in the gateway's queue of waiters (first come, first woken).

    Set at most once, by a notification or a wake-up passed on. Whoever took it says what the
    claim after the wake-up took (:meth:`claimed`) or that it leaves (:meth:`discard`), so a
    wake-up it did not use goes on to the next waiter instead of being lost."""

    __slots__ = ("_gateway", "_event", "_passes", "_settled", "_gone", "_queued")

    def __init__(self, gateway: "PostgresWorkerGateway") -> None:
        self._gateway = gateway
        self._event = asyncio.Event()
        #: once woken: how many more waiters a claim that finds nothing may pass the wake-up to
        self._passes = 0
        #: its wake-up was used (reported) or passed on
        self._settled = False
        #: it left (its place, if still queued, is skipped)
        self._gone = False
        #: its place is in the gateway's queue
        self._queued = False

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> bool:
        return await self._event.wait()

    def _set(self, passes: int) -> None:
        self._passes = passes
        self._event.set()

    def claimed(self, taken: int, asked: int) -> None:
        """The claim after this wake-up took ``taken`` of the ``asked`` Attempts: nothing passes
        the wake-up on (to the waiters not tried yet), everything asked passes it on once (there
        may be more), anything between ends it (the store had no more for this claim)."""
        self._leave()
        if not self._event.is_set() or self._settled:
            return
        self._settled = True
        if taken <= 0:
            if self._passes > 0:
                self._gateway._wake_one(self._passes - 1)
        elif taken >= asked:
            self._gateway._wake_one(0)

    def discard(self) -> None:
        """Leave the queue; a wake-up received and not reported is passed on as it came."""
        self._leave()
        if self._event.is_set() and not self._settled:
            self._settled = True
            self._gateway._wake_one(self._passes)

    def _leave(self) -> None:
        if not self._gone:
            self._gone = True
            if self._queued:
                self._gateway._left()


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
        #: waiting claims, first come first woken (places of those gone are skipped, and
        #: dropped once they outnumber the waiting)
        self._waiting: collections.deque[ClaimWaiter] = collections.deque()
        self._gone = 0
        #: figures: notifications read, and waiters woken (by a notification or passed on)
        self.notifications = 0
        self.wakeups = 0
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

    def waiter(self) -> ClaimWaiter:
        """A place in the queue of waiting claims, set when a notification (or a wake-up passed
        on) reaches it. Take it before the claim that found nothing, so a notification in between
        is not missed; report that claim's result or discard it (see :class:`ClaimWaiter`)."""
        if self._listener is None and not self._closed:
            self._listener = asyncio.create_task(self._listen())
        waiter = ClaimWaiter(self)
        if self._closed:
            waiter._set(0)
        else:
            waiter._queued = True
            self._waiting.append(waiter)
        return waiter

    def _left(self) -> None:
        self._gone += 1
        if self._gone > 64 and self._gone * 2 > len(self._waiting):
            for waiter in self._waiting:
                waiter._queued = not waiter._gone
            self._waiting = collections.deque(w for w in self._waiting if not w._gone)
            self._gone = 0

    def _wake_one(self, passes: int) -> None:
        """Wake the first waiter still waiting; ``passes``: how often a claim that finds nothing
        may pass this wake-up on."""
        while self._waiting:
            waiter = self._waiting.popleft()
            waiter._queued = False
            if waiter._gone:
                self._gone -= 1
                continue
            if waiter.is_set():
                continue
            self.wakeups += 1
            waiter._set(passes)
            return

    def _notified(self) -> None:
        """A notification: one waiter claims; one that finds nothing passes it on, at most around
        the waiters there are now."""
        self.notifications += 1
        self._wake_one(max(0, len(self._waiting) - self._gone - 1))

    def _wake_all(self) -> None:
        """Every waiter claims (the listener (re)started: what was admitted while nobody listened
        is unknown; or the gateway closes)."""
        waiting, self._waiting, self._gone = self._waiting, collections.deque(), 0
        for waiter in waiting:
            waiter._queued = False
            if not waiter._gone and not waiter.is_set():
                self.wakeups += 1
                waiter._set(0)

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
                self._wake_all()  # anything admitted while nobody listened is looked for now
                async for _ in conn.notifies():
                    self._notified()
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
                       own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        return await self._with(lambda m: m.complete(fence, lease, outcome, started=started,
                                                     log_missing_bytes=log_missing_bytes, own_stop=own_stop,
                                                     exit_age_ms=exit_age_ms))

    async def complete_and_claim(self, fence: SessionFence, lease: LeaseFence, outcome: AttemptOutcome,
                                 tokens: Sequence[bytes], *, started: bool = True, log_missing_bytes: int = 0,
                                 own_stop: OwnStop | None = None, exit_age_ms: int | None = None,
                                 ) -> tuple[CompletionReply, Sequence[ClaimedAttempt]]:
        """``complete`` and ``claim`` in one transaction on one member (see
        :meth:`.worker_client.PostgresWorkerProtocol.complete_and_claim`)."""
        return await self._with(lambda m: m.complete_and_claim(fence, lease, outcome, tokens, started=started,
                                                               log_missing_bytes=log_missing_bytes,
                                                               own_stop=own_stop, exit_age_ms=exit_age_ms))

    async def complete_late(self, worker_id: str, lease: LeaseFence, outcome: AttemptOutcome, *,
                            own_stop: OwnStop | None = None, exit_age_ms: int | None = None) -> CompletionReply:
        return await self._with(lambda m: m.complete_late(worker_id, lease, outcome, own_stop=own_stop,
                                                          exit_age_ms=exit_age_ms))

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
        self._wake_all()


async def create_worker_gateway(dsn: str, application_name: str, pool_size: int, *,
                                gateway_role: str = DEFAULT_GATEWAY_ROLE) -> PostgresWorkerGateway:
    """A gateway pool (connections open on first use; an unreachable store is StoreUnavailable
    at the call that needs it); its check refuses a login that is not ``gateway_role``."""
    from .worker_client import _gateway_dsn

    _gateway_dsn(dsn)
    return PostgresWorkerGateway(dsn, application_name, pool_size, gateway_role=gateway_role)


__all__ = ["CHANNEL", "ClaimWaiter", "PostgresWorkerGateway", "StoreUnavailable", "create_worker_gateway"]
