"""The worker's session with the store and its heartbeat.

With no session (the start, after a fence) the heartbeat loop opens one; a new session is a new
generation. Then, every ``heartbeat_ms``, it renews the session (and with it every Attempt's
lease); the monotonic time each heartbeat *started* gives the self-fence schedule
(:func:`~qinglong.contracts.worker.fence_deadlines`), handed to :class:`~.fence.SelfFence`. Its
reply's stop orders are acted on: a cancel request sets the job's cancel reason (the watchdog
sends TERM, KILL after the grace; the outcome is then ``cancelled``/``timed_out`` by
:func:`~qinglong.contracts.execution.classify_outcome`), a lost lease stops the job and forgets
it (its outcome is no longer ours to report).

A session the store refuses ends every job of it at once (:meth:`Sessions.session_lost`).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from qinglong.contracts.errors import QinglongError, StoreAuthFailed, StoreUnavailable, UserError
from qinglong.contracts.execution import CancelReason
from qinglong.contracts.worker import (
    LEASE_LOST,
    SESSION_REPLACED,
    Session,
    SessionFence,
    SessionFenced,
    WorkerProtocol,
    fence_deadlines,
)

from .core import RETRY_S, WorkerCore
from .fence import SelfFence


class Sessions:
    """Opens, renews, loses and closes the worker's session (see the module docstring)."""

    def __init__(self, core: WorkerCore, fence: SelfFence,
                 connect: Callable[[], Awaitable[WorkerProtocol]]) -> None:
        """``connect()`` makes the protocol (again, while the store cannot be reached at start)."""
        self._core = core
        self._fence = fence
        self._connect = connect

    async def protocol_ready(self) -> WorkerProtocol | None:
        """The store's protocol, connected now if it was not yet; None while the store is away."""
        core = self._core
        if core.protocol is not None:
            return core.protocol
        try:
            core.protocol = await self._connect()
        except StoreUnavailable as exc:
            core.store_down(exc)
            return None
        return core.protocol

    async def heartbeat_loop(self) -> None:
        """Open a session when there is none, then renew it every ``heartbeat_ms``."""
        core = self._core
        while not core.closing:
            protocol = await self.protocol_ready()
            if protocol is None:
                await asyncio.sleep(RETRY_S)
                continue
            if core.session is None:
                if core.draining:
                    await asyncio.sleep(RETRY_S)  # nothing left to hold a session for
                    continue
                if core.abandoned is not None and not await self._abandoned_not_replaced(protocol):
                    continue
                if not await self._open_session(protocol):
                    await asyncio.sleep(RETRY_S)
                continue
            due = (core.last_heartbeat_mono or core.mono()) + core.config.heartbeat_ms / 1000
            await asyncio.sleep(max(0.0, due - core.mono()))
            if core.session is None or core.closing or self._fence.due():
                continue  # past the TERM point (woken from a freeze): fenced, never renewed
            if not await self._heartbeat(protocol, core.session):
                # the store did not answer: try again soon, the self-fence runs on its own clock
                await asyncio.sleep(min(RETRY_S, core.config.heartbeat_ms / 1000))

    async def _abandoned_not_replaced(self, protocol: WorkerProtocol) -> bool:
        """After a self-fence: ask the store about the abandoned session before opening a new one.
        A worker frozen while another process took its id over would otherwise open a session
        again on waking (its watchdog acts before any call is refused) and fence that process.
        True when a new session may be opened; False to try again (store away) or when this
        process was replaced (it stops, as :meth:`session_lost` says)."""
        core = self._core
        fence = core.abandoned
        assert fence is not None
        try:
            await protocol.heartbeat(fence, [])
        except SessionFenced as exc:
            if exc.reason == SESSION_REPLACED:
                core.abandoned = None
                self._replaced(fence)
                return False
        except StoreUnavailable as exc:
            core.store_down(exc)
            await asyncio.sleep(RETRY_S)
            return False
        core.abandoned = None
        return True

    async def _open_session(self, protocol: WorkerProtocol) -> bool:
        core = self._core
        config = core.config
        started = core.mono()
        try:
            # the gateway binds the labels (and the id and capacity) to the token's registration
            session = await protocol.open_session(config.worker_id, (), config.max_running,
                                                  config.session_lease_ms)
        except StoreAuthFailed as exc:
            core.store_down(exc)
            if core.stats.sessions == 0 and core.fatal is None:
                # refused before it ever held a session: a wrong token, not an outage (exit 5)
                core.fatal = exc
                core.request_stop()
            return False
        except StoreUnavailable as exc:
            core.store_down(exc)
            return False
        core.store_up()
        core.session = session
        self._set_deadlines(started)
        core.stats.sessions += 1
        if 0 < session.capacity < config.max_running and core.stats.sessions == 1:
            core.emit("warning", "worker.capacity_bound",
                      f"worker {config.worker_id} is registered for {session.capacity} job(s) at once; "
                      f"[worker] max_running = {config.max_running} is bounded to that",
                      capacity=session.capacity, max_running=config.max_running)
        core.emit("info", "worker.session_opened",
                  f"session of worker {config.worker_id} opened (generation {session.fence.generation})",
                  worker_id=config.worker_id, generation=session.fence.generation,
                  session_id=session.fence.session_id, lease_ms=session.lease_ms)
        core.wake.set()
        return True

    def _set_deadlines(self, started_mono: float) -> None:
        core = self._core
        config = core.config
        core.last_heartbeat_mono = started_mono
        core.deadlines = fence_deadlines(started_mono, config.session_lease_ms, config.self_fence_margin_ms,
                                         config.kill_grace_ms)
        if core.session is not None:
            self._fence.renewed(core.session.fence, core.deadlines)

    async def _heartbeat(self, protocol: WorkerProtocol, session: Session) -> bool:
        core = self._core
        # the store renews only the Attempts named here: every job this worker holds, the ones
        # reporting their outcome too (an Attempt it does not know of runs out its lease)
        running = [j.attempt_id for j in core.jobs.values()
                   if not j.forgotten and j.fence == session.fence]
        started = core.mono()
        try:
            reply = await protocol.heartbeat(session.fence, running)
        except SessionFenced as exc:
            self.session_lost(session.fence, exc)
            return True
        except StoreUnavailable as exc:
            core.stats.failed_heartbeats += 1
            core.store_down(exc)
            return False
        if core.session is not session or self._fence.due():
            # self-fenced while the call was out, or its TERM point passed meanwhile (the keeper
            # acts on it): the reply renews nothing of ours
            return True
        core.store_up()
        core.stats.heartbeats += 1
        self._set_deadlines(started)
        core.emit("debug", "worker.heartbeat", "session renewed", generation=session.fence.generation,
                  heartbeat_started_mono=started, lease_expires_at_ms=reply.lease_expires_at_ms,
                  db_now_ms=reply.db_now_ms, running=len(running))
        for order in reply.stop:
            job = core.jobs.get(order.attempt_id)
            if job is None or job.forgotten or job.finishing:
                continue
            if order.reason == LEASE_LOST:
                core.emit("warning", "worker.lease_lost",
                          f"run {job.run_id}: its attempt is no longer leased to this worker; stopping it",
                          run_id=job.run_id, attempt_id=job.attempt_id)
                core.forget(job, kill_now=True)
                continue
            try:
                reason = CancelReason(order.reason)
            except ValueError:
                reason = CancelReason.OPERATOR
            if job.request_stop(reason):
                core.emit("info", "worker.cancel_requested",
                          f"run {job.run_id}: cancel requested ({reason.value}); stopping its process group",
                          run_id=job.run_id, attempt_id=job.attempt_id, reason=reason.value)
        return True

    def session_lost(self, fence: SessionFence, refusal: SessionFenced) -> None:
        """The store refused the session: every job of it is stopped at once and forgotten. A
        session that expired or was closed is opened again (a new generation); one that another
        process replaced (a second worker with this id) is not: opening again would fence that
        live worker, which would do the same in turn, so this process stops instead."""
        core = self._core
        if core.session is None or core.session.fence != fence:
            return
        core.session = None
        core.deadlines = None
        replaced = refusal.reason == SESSION_REPLACED
        for job in list(core.jobs.values()):
            if job.fence == fence:
                core.forget(job, kill_now=True)
        if replaced:
            self._replaced(fence)
            return
        core.emit("warning", "worker.session_fenced",
                  f"the store refused this worker's session ({refusal.message}); stopping its jobs and "
                  "opening a new one", generation=fence.generation, why=refusal.reason)

    def _replaced(self, fence: SessionFence) -> None:
        """Another process holds this worker id now: stop (never open a session again)."""
        core = self._core
        core.emit("error", "worker.replaced",
                  f"another process opened a newer session of worker id {fence.worker_id!r}; this one "
                  "stopped its jobs and stops (give every worker its own worker_id)",
                  generation=fence.generation)
        if core.fatal is None:
            core.fatal = UserError(f"worker id {fence.worker_id!r} was taken over by a newer session of "
                                   "another process: give every running worker its own [worker] worker_id")
        core.draining = True
        core.request_stop()

    async def close_session(self) -> None:
        """At the end: the session is closed in the store (it ends by its lease otherwise)."""
        core = self._core
        session, core.session = core.session, None
        if session is None or core.protocol is None:
            return
        for _ in range(3):
            try:
                await core.protocol.close_session(session.fence)
                core.emit("info", "worker.session_closed",
                          f"session of worker {core.config.worker_id} closed", generation=session.fence.generation)
                return
            except SessionFenced:
                return  # already fenced: nothing of it remains to close
            except (StoreUnavailable, QinglongError) as exc:
                core.store_down(exc)
                await asyncio.sleep(RETRY_S)
        core.emit("warning", "worker.session_not_closed",
                  "the session could not be closed; the store ends it when its lease expires",
                  generation=session.fence.generation)
