"""Claiming Attempts and running each one as a job, held by the job supervisor.

The **claim loop** runs while there are free slots, a session and time before the self-fence's
TERM: one fresh lease token per free slot; each claimed Attempt becomes a :class:`~.core.WorkerJob`
with a task of its own. It claims again the moment a job ends; a claim waits at the gateway for an Attempt to
become claimable, and after an empty answer the loop rests ``poll_ms`` or until a job ends.

A job's task: parse the spec (a refusal ends the Attempt ``failed``, never started), call
``started`` *before* spawning (the lease file is written and synced meanwhile, off the event loop)
and spawn only if it was accepted and the self-fence's TERM is still ahead, watch the process
(shipping its log about every second), then ship the rest of the log and ``complete`` (repeated
after a lost reply; after ``log_incomplete`` the missing bytes are shipped first; its first try
also claims for the slot it frees where the protocol offers ``complete_and_claim``).
``LeaseFenced`` at any step stops the job if it is alive and forgets it.

Secrets: tokens and env values never reach a diagnostic; messages name runs and attempts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from typing import Any, Awaitable, Callable, Mapping, Sequence

from qinglong.contracts.errors import StoreUnavailable, UserError
from qinglong.contracts.execution import (
    CONTRACT_LIMITS,
    AttemptOutcome,
    CancelReason,
    Executor,
    FencedExecutor,
    ProcessState,
    StartError,
    StartRequest,
    classify_outcome,
    parse_execution_spec,
)
from qinglong.contracts.worker import (
    BadWorkerCall,
    bounded_event_payload,
    ClaimedAttempt,
    CombinedCompletion,
    CompletionResult,
    OWN_STOP_REASONS,
    LeaseFenced,
    LogRefused,
    OwnStop,
    SessionFence,
    SessionFenced,
    new_lease_token,
)
from qinglong.supervisor import NO_COMMAND, missing_executor, start_failure, wall_clock_ms

from .core import RETRY_S, WorkerCore, WorkerJob
from .fence import SelfFence
from .late import StoredStop, mark_reported, report_found, report_late, write_lease
from .logship import log_size, ship_log
from .session import Sessions

#: How often a running job's log is shipped, seconds (at most every heartbeat).
SHIP_S = 1.0
#: A reason the store keeps is cut to this many characters.
MAX_REASON_CHARS = 1000
#: Tries of a call the store called malformed before the job is given up (a bug, reported).
MAX_BAD_CALLS = 3


async def _outcome_of(work: "asyncio.Future[None]") -> OSError | None:
    """Wait for ``work`` (a thread's, which runs on even when its waiter is cancelled): None when
    it succeeded, the OSError it raised otherwise."""
    try:
        await asyncio.shield(work)
    except OSError as exc:
        return exc
    except asyncio.CancelledError:
        await asyncio.wait({work})  # the file is never written behind a cancelled job's back
        raise
    return None


def _own_stop(job: WorkerJob) -> OwnStop | None:
    """The stop request this worker made for the job itself (its timeout, its drain's shutdown),
    as its completion states it: the store keeps it as the local dispatcher keeps its own, also
    when the job's own exit came first and stays the outcome. None for a request the store made
    (it holds that one already) or none at all."""
    if job.cancel not in OWN_STOP_REASONS or job.cancel_requested_at_ms is None:
        return None
    return OwnStop(job.cancel, max(0, wall_clock_ms() - job.cancel_requested_at_ms))


def _stored_stop(job: WorkerJob) -> StoredStop | None:
    """The job's own stop request as a late report states it (see :func:`_own_stop`)."""
    if job.cancel not in OWN_STOP_REASONS or job.cancel_requested_at_ms is None:
        return None
    return StoredStop(job.cancel, job.cancel_requested_at_ms)


def _exit_age(outcome: AttemptOutcome) -> int | None:
    """How long ago, on this worker's clock, the job exited (the store dates the Attempt's end
    from it on its own clock, so the drain of the output after the exit is not the job's
    duration); None without a noted end."""
    if outcome.ended_at_ms is None:
        return None
    return max(0, wall_clock_ms() - outcome.ended_at_ms)


class Jobs:
    """The claim loop and every job's task (see the module docstring)."""

    def __init__(self, core: WorkerCore, sessions: Sessions, fence: SelfFence,
                 executors: Mapping[str, Executor]) -> None:
        self._core = core
        self._sessions = sessions
        self._fence = fence
        self._executors = dict(executors)

    async def report_found(self) -> None:
        """Once the store answers: the outcomes a previous process of this worker left on disk
        unreported (:mod:`.late`)."""
        core = self._core
        while core.protocol is None and not core.closing:
            await asyncio.sleep(RETRY_S)
        if core.closing:
            return
        try:
            recorded = await report_found(core, self._executors)
        except Exception as exc:
            core.emit("error", "worker.late_scan_failed", f"looking for unreported outcomes failed: "
                      f"{exc.__class__.__name__}: {exc}")
            return
        if recorded:
            core.emit("info", "worker.late_found", f"{recorded} outcome(s) a previous process of this worker "
                      "left unreported were recorded", recorded=recorded)

    # ---------------------------------------------------------------------------------- claiming

    def _may_claim(self) -> bool:
        core = self._core
        d = core.deadlines
        return not core.draining and core.session is not None and d is not None and core.mono() < d.term_at

    def _claim_wait_ms(self) -> int:
        """How long a claim may wait at a gateway that can hold it: the configured bound, ending
        a second before the self-fence's TERM (no claim may outlive the right to spawn)."""
        core = self._core
        if not getattr(core.protocol, "long_polls", False) or not core.config.claim_wait_ms:
            return 0
        d = core.deadlines
        if d is None:
            return 0
        room_ms = int((d.term_at - core.mono() - 1.0) * 1000)
        return max(0, min(core.config.claim_wait_ms, room_ms))

    async def claim_loop(self) -> None:
        """Claim up to the free slots while claiming is allowed; woken by a job's end."""
        core = self._core
        while not core.closing and not core.draining:
            core.wake.clear()
            more = False
            free = core.slots() - len(core.jobs)
            session = core.session
            if free > 0 and self._may_claim() and core.protocol is not None and session is not None:
                waited = False
                try:
                    tokens = [new_lease_token() for _ in range(free)]
                    wait_ms = self._claim_wait_ms()
                    if wait_ms:
                        claimed = await core.protocol.claim(session.fence, tokens, wait_ms=wait_ms)
                        waited = True  # the gateway already waited: claim again at once
                    else:
                        claimed = await core.protocol.claim(session.fence, tokens)
                except SessionFenced as exc:
                    self._sessions.session_lost(session.fence, exc)
                    continue
                except (StoreUnavailable, BadWorkerCall) as exc:
                    core.store_down(exc)
                    claimed = []
                if self._left_to_close(claimed):
                    break
                for attempt in claimed:
                    self._adopt_claim(attempt, session.fence)
                more = (bool(claimed) and len(claimed) == free) or (waited and not claimed)
            if more:
                continue
            await self._idle()

    def _left_to_close(self, claimed: Sequence[ClaimedAttempt]) -> bool:
        """Whether a claim answered after the stop began (one that waited at the gateway, or
        one sent with a job's completion) is left alone: nothing it took is started, and closing
        the session puts each back in the queue at once."""
        core = self._core
        if not claimed or not (core.draining or core.closing or core.stop.is_set()):
            return False
        core.emit("info", "worker.claim_left", f"{len(claimed)} attempt(s) claimed while stopping "
                  "are left to the session's close", attempts=len(claimed))
        return True

    async def _idle(self) -> None:
        """Until a job ends (``wake``) or the poll interval passed."""
        core = self._core
        try:
            await asyncio.wait_for(core.wake.wait(), core.config.poll_ms / 1000)
        except asyncio.TimeoutError:
            pass

    def _adopt_claim(self, attempt: ClaimedAttempt, fence: SessionFence) -> None:
        core = self._core
        job = WorkerJob(attempt.run_id, attempt.attempt_id, claimed=attempt, fence=fence)
        core.stats.claimed += 1
        core.emit("info", "worker.claimed", f"run {attempt.run_id}: attempt {attempt.attempt_no} claimed",
                  run_id=attempt.run_id, attempt_id=attempt.attempt_id, attempt_no=attempt.attempt_no,
                  project_id=attempt.project_id, task_id=attempt.task_id, lease_version=attempt.lease.lease_version)
        core.supervisor.track(job, self._run_job, self._job_ended)

    # ---------------------------------------------------------------------------------- a job

    def _may_spawn(self, job: WorkerJob) -> bool:
        core = self._core
        d = core.deadlines
        return core.holds(job) and not core.no_spawn and d is not None and core.mono() < d.term_at

    async def _run_job(self, job: WorkerJob) -> None:
        try:
            if await self._start_job(job):
                await self._watch_job(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._core.emit("error", "worker.job_failed", f"run {job.run_id}: handling its attempt failed: "
                            f"{exc.__class__.__name__}: {exc}", run_id=job.run_id, attempt_id=job.attempt_id)
            self._core.forget(job, kill_now=True)
            await self._core.supervisor.wait_gone(job)

    def _job_ended(self, job: WorkerJob) -> None:
        core = self._core
        if job.handle is not None and not core.supervisor.alive(job):
            core.keeper.done(job.handle)
        core.wake.set()

    async def _retrying(self, job: WorkerJob, call: Callable[[], Awaitable[Any]]) -> Any:
        """``await call()`` until it answers; None when the job is no longer ours (a fence refused
        it, or the session was lost meanwhile). A lost reply is repeated as it was."""
        core = self._core
        bad_calls = 0
        while core.holds(job):
            try:
                result = await call()
                core.store_up()
                return result
            except LeaseFenced as exc:
                core.emit("warning", "worker.lease_fenced", f"run {job.run_id}: the store refused its lease "
                          f"({exc.message}); stopping it", run_id=job.run_id, attempt_id=job.attempt_id)
                core.forget(job, kill_now=True)
                return None
            except SessionFenced as exc:
                self._sessions.session_lost(job.fence, exc)
                return None
            except StoreUnavailable as exc:
                core.store_down(exc)
            except BadWorkerCall as exc:
                bad_calls += 1
                core.emit("error", "worker.bad_call", f"run {job.run_id}: the store refused a call as "
                          f"malformed: {exc}", run_id=job.run_id, attempt_id=job.attempt_id)
                if bad_calls >= MAX_BAD_CALLS:
                    core.forget(job, kill_now=True)
                    return None
            await asyncio.sleep(RETRY_S)
        return None

    async def _start_job(self, job: WorkerJob) -> bool:
        """Started, then spawned: True when the process runs."""
        core = self._core
        attempt = job.claimed
        try:
            spec = parse_execution_spec(attempt.task_id, attempt.payload, CONTRACT_LIMITS)
        except UserError as err:
            await self._finish(job, self._failure(str(err)), started=False)
            return False
        if spec is None:
            await self._finish(job, self._failure(NO_COMMAND), started=False)
            return False
        executor = self._executors.get(spec.executor)
        if executor is None:
            await self._finish(job, self._failure(missing_executor(spec.executor, self._executors,
                                                                   f" on worker {core.config.worker_id}")),
                               started=False)
            return False
        job.spec, job.executor = spec, executor
        job.attempt_dir = os.path.join(core.config.log_dir, attempt.attempt_id)
        protocol = core.protocol
        assert protocol is not None
        if not self._may_spawn(job):
            core.forget(job)
            return False
        called_at = [0.0]
        # the lease file (written and synced off the loop) while the started call travels: both
        # are done before the spawn, and a lease beside a job that never started reports nothing
        lease_written = asyncio.ensure_future(asyncio.to_thread(
            write_lease, job.attempt_dir, attempt.run_id, attempt.attempt_no, spec.executor, attempt.lease))

        async def started():
            called_at[0] = core.mono()
            return await protocol.started(job.fence, attempt.lease)

        try:
            reply = await self._retrying(job, started)
        finally:
            lease_error = await _outcome_of(lease_written)
        if reply is None:
            return False
        # the deadline in the store's clock, moved onto ours from the call's start (never later)
        job.deadline_mono = called_at[0] + (reply.deadline_ms - reply.db_now_ms) / 1000
        if job.cancel is not None:
            await self._finish(job, classify_outcome(None, job.cancel), started=False)
            return False
        if not self._may_spawn(job):
            if core.no_spawn and core.holds(job):
                await self._finish(job, classify_outcome(None, CancelReason.SHUTDOWN), started=False)
            else:
                core.forget(job)
            return False
        # an executor that can fence the job itself gets the KILL point: the job's group dies there
        # unless a heartbeat moves it later, whatever happens to this worker and its keeper
        d = core.deadlines
        fence_at = d.kill_at if d is not None and isinstance(executor, FencedExecutor) else None
        request = StartRequest(attempt.run_id, attempt.attempt_id, attempt.attempt_no, attempt.scheduled_for_ms,
                               spec, job.attempt_dir, fence_deadline_mono=fence_at,
                               # an event's payload: the executor writes it 0600 beside the job
                               event_payload=bounded_event_payload(attempt.event_payload))
        if lease_error is not None:
            # the token beside the job is how a restarted worker reports the outcome it finds
            await self._finish(job, self._failure(f"cannot write the attempt's lease file: {lease_error}"),
                               started=False)
            return False
        try:
            await core.supervisor.spawn(job, executor, request)
        except StartError as err:
            core.emit("warning", "worker.start_failed", f"run {attempt.run_id} could not start: {err}",
                      run_id=attempt.run_id, attempt_id=attempt.attempt_id)
            await self._finish(job, self._failure(str(err) or err.__class__.__name__), started=False)
            return False
        except Exception as exc:
            # whether a process exists is unknown: look at the directory
            state = executor.probe(job.attempt_dir, None)
            handle = executor.find_handle(job.attempt_dir) if state is ProcessState.ALIVE else None
            if handle is None and state is not ProcessState.ENDED:
                await self._finish(job, self._failure(f"the executor failed while starting: "
                                                      f"{exc.__class__.__name__}: {exc}"), started=False)
                return False
            job.handle = handle
            core.stats.started += 1
        if job.handle is not None:
            core.keeper.job(job.fence.generation, job.handle)
        core.emit("info", "worker.job_started", f"run {attempt.run_id}: attempt {attempt.attempt_no} started",
                  run_id=attempt.run_id, attempt_id=attempt.attempt_id,
                  pid=job.handle.pid if job.handle else None)
        if job.forgotten:  # fenced while it was being spawned: stop it at once
            core.supervisor.signal(job, signal.SIGTERM)
            core.supervisor.signal(job, signal.SIGKILL)
        return True

    def _failure(self, reason: str) -> AttemptOutcome:
        return start_failure(reason[:MAX_REASON_CHARS], wall_clock_ms())

    async def _watch_job(self, job: WorkerJob) -> None:
        core = self._core

        async def ship_while_held() -> None:
            if core.holds(job) and not job.log_refused:
                await self._ship(job, final=False)

        await core.supervisor.wait_for_exit(job, every_s=min(SHIP_S, core.config.heartbeat_ms / 1000),
                                            meanwhile=ship_while_held)
        # woken past the TERM point (frozen): the keeper or the executor's fence may be what
        # ended the job, so the session is abandoned first and only the job's own end reported
        self._fence.due()
        if job.forgotten:
            outcome = self._own_end(job)
            if outcome is not None:
                # it ended on its own before the lease was lost: the token still proves the outcome
                await report_late(core, job.run_id, job.attempt_dir, job.claimed.lease, outcome,
                                  _stored_stop(job))
                return
            core.emit("info", "worker.job_forgotten", f"run {job.run_id}: its process ended; its outcome is "
                      "not this worker's to report", run_id=job.run_id, attempt_id=job.attempt_id)
            return
        # a job that ended before this worker took up its stop request keeps its own exit
        await self._finish(job, core.supervisor.outcome(job, job.cancel, job.cancel_requested_at_ms),
                           started=True)

    def _log_refused(self, job: WorkerJob, why: str) -> None:
        """Stop shipping the job's log (said once): it completes with what the store holds."""
        if job.log_refused:
            return
        job.log_refused = True
        self._core.emit("error", "worker.log_tail_incomplete",
                        f"run {job.run_id}: the store refuses its log ({why}); it keeps {job.shipped} bytes and "
                        "the rest is marked missing when the attempt completes", run_id=job.run_id,
                        attempt_id=job.attempt_id, log_bytes_stored=job.shipped)

    def _own_end(self, job: WorkerJob) -> AttemptOutcome | None:
        """The outcome of a forgotten job whose process ended by itself before it was forgotten
        (its receipt is older than the forget, so no signal of ours ended it), else None."""
        if job.executor is None or job.forgotten_wall_ms is None:
            return None
        try:
            receipt = job.executor.read_receipt(job.attempt_dir)
        except Exception:
            return None
        # a signal may be the fence's own; an end within the clock's slack of the forget may be
        # an exit the forget's TERM caused (a job that traps it)
        if (receipt is None or receipt.exit_code is None
                or receipt.ended_at_ms + max(0, receipt.ended_slack_ms) >= job.forgotten_wall_ms):
            return None
        return classify_outcome(receipt, job.cancel, requested_at_ms=job.cancel_requested_at_ms)

    # ---------------------------------------------------------------------------------- reporting

    async def _ship(self, job: WorkerJob, *, final: bool) -> str:
        """Ship what the local log holds beyond what the store has: ``"ok"``; ``"retry"`` when the
        store did not answer (shipped again later); ``"refused"`` when it refused a chunk (its
        count of stored bytes, which ``complete`` returns, tells where to go on from)."""
        core = self._core
        protocol = core.protocol
        if protocol is None:
            return "retry"
        lease = job.claimed.lease

        async def append(offset: int, data: bytes) -> int:
            stored = await protocol.append_log(job.fence, lease, offset, data)
            core.stats.log_bytes_shipped += len(data)
            return stored

        try:
            job.shipped = await ship_log(job.attempt_dir, job.shipped, append)
            return "ok"
        except LeaseFenced as exc:
            core.emit("warning", "worker.lease_fenced", f"run {job.run_id}: the store refused its lease "
                      f"({exc.message}); stopping it", run_id=job.run_id, attempt_id=job.attempt_id)
            core.forget(job, kill_now=True)
        except SessionFenced as exc:
            self._sessions.session_lost(job.fence, exc)
        except StoreUnavailable as exc:
            core.store_down(exc)
        except LogRefused as exc:
            self._log_refused(job, str(exc))
            return "refused"
        except (BadWorkerCall, RuntimeError, OSError) as exc:
            core.emit("error" if final else "warning", "worker.log_ship_failed",
                      f"run {job.run_id}: shipping its log failed: {exc}", run_id=job.run_id,
                      attempt_id=job.attempt_id)
            return "refused"
        return "retry"

    def _completing(self, job: WorkerJob, final: AttemptOutcome, started: bool, missing: int, *,
                    first: bool) -> Callable[[], Awaitable[Any]]:
        """The ``complete`` call of a job. Its first try, when the protocol can and claiming is
        allowed, also claims for the slot the job frees (and the others free now), in the same
        round trip; a repeat (a lost reply) completes only, so no claim is ever made twice."""
        core = self._core
        protocol = core.protocol
        assert protocol is not None
        combined = protocol.complete_and_claim if isinstance(protocol, CombinedCompletion) else None
        tries = [0]

        async def call() -> Any:
            tries[0] += 1
            free = core.slots() - len(core.jobs) + 1
            # only with one: a gateway or store of an earlier build is called as it was
            stop = {"own_stop": own} if (own := _own_stop(job)) is not None else {}
            if (age := _exit_age(final)) is not None:
                stop["exit_age_ms"] = age
            if (combined is not None and first and tries[0] == 1 and free > 0 and self._may_claim()
                    and core.session is not None and core.session.fence == job.fence):
                reply, claimed = await combined(job.fence, job.claimed.lease, final,
                                                [new_lease_token() for _ in range(free)], started=started,
                                                log_missing_bytes=missing, **stop)
                if not self._left_to_close(claimed):
                    for attempt in claimed:
                        self._adopt_claim(attempt, job.fence)
                return reply
            return await protocol.complete(job.fence, job.claimed.lease, final, started=started,
                                           log_missing_bytes=missing, **stop)

        return call

    async def _finish(self, job: WorkerJob, outcome: AttemptOutcome, *, started: bool) -> None:
        """Ship the whole log, then complete; repeated until the store answers (or the job is no
        longer ours). ``log_incomplete`` ships the missing bytes from what the store holds."""
        core = self._core
        protocol = core.protocol
        assert protocol is not None
        job.finishing = True
        if outcome.reason is not None and len(outcome.reason) > MAX_REASON_CHARS:
            outcome = dataclasses.replace(outcome, reason=outcome.reason[:MAX_REASON_CHARS])
        refusals = 0
        first = True  # the first complete call may claim for the freed slot too
        while core.holds(job):
            shipped = await self._ship(job, final=True) if started and not job.log_refused else "ok"
            if shipped == "retry":
                await asyncio.sleep(RETRY_S)
                continue
            if shipped == "refused":
                refusals += 1
                if refusals > MAX_BAD_CALLS:
                    self._log_refused(job, "the store keeps refusing it")
            # completion never waits on the log: what the store could not take is counted missing
            missing = max(0, (outcome.log_bytes or log_size(job.attempt_dir)) - job.shipped) \
                if started and job.log_refused else 0
            final = dataclasses.replace(outcome, log_bytes=job.shipped if started else 0)
            reply = await self._retrying(job, self._completing(job, final, started, missing, first=first))
            first = False
            if reply is None:
                break
            if reply.result is CompletionResult.LOG_INCOMPLETE:
                core.emit("warning", "worker.log_incomplete",
                          f"run {job.run_id}: the store holds {reply.log_bytes_stored} of {final.log_bytes} log "
                          "bytes; shipping the rest", run_id=job.run_id, attempt_id=job.attempt_id)
                # ship the rest from what the store holds (or, refused, complete with just that)
                job.shipped = reply.log_bytes_stored if job.log_refused else min(job.shipped,
                                                                                  reply.log_bytes_stored)
                continue
            job.done = True
            if started:
                mark_reported(job.attempt_dir)
            core.stats.completed += 1
            core.emit("info", "worker.completed",
                      f"run {job.run_id}: attempt {job.claimed.attempt_no} {final.state.value}"
                      + (f" ({final.reason})" if final.reason else ""),
                      run_id=job.run_id, attempt_id=job.attempt_id, state=final.state.value,
                      run_state=reply.run_state.value, exit_code=final.exit_code, signal=final.signal,
                      log_bytes=final.log_bytes, result=reply.result.value)
            return
        if started and not job.done:
            # the lease was lost while the outcome was being reported: the token still proves it
            await report_late(core, job.run_id, job.attempt_dir, job.claimed.lease, outcome, _stored_stop(job))
