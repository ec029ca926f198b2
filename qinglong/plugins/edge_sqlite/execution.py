"""The execution side of the SQLite store: :class:`~qinglong.contracts.execution.ExecutionStore`.

Every method is one short ``BEGIN IMMEDIATE`` transaction run as one call on the connection's
thread (see ``store.py``), and every write is a compare-and-set on the state the transaction read:
two dispatchers (two processes on one file) racing for one Attempt find one winner, and a second
completion of an ended Attempt changes nothing. Each change of a Run's state is checked with the
contracts' :func:`~qinglong.contracts.execution.check_run_transition` (an illegal one raises
:class:`~qinglong.contracts.execution.IllegalTransition` and writes nothing), and the retry
decision after an Attempt ended is the contracts' :func:`~qinglong.contracts.execution.retry_decision`.

Shape of the rows (migration ``0004_local_execution``):

* A Run's state mirrors its current (latest) Attempt; ``retry_wait`` is a Run whose latest
  Attempt is ``claimed`` with ``not_before_ms`` set, after an earlier one ended. A terminal Run has
  ``finished_at_ms`` (when it was recorded) and a ``reason`` in words (None for a success).
* Events: ``run.created`` and ``run.queued`` at admission, then ``run.dispatching``,
  ``run.started``, ``run.requeued``, ``run.cancel_requested``, ``run.skipped``,
  ``run.retry_scheduled`` and ``run.finished``, with consecutive ``seq`` per Run.
* A manual Run (``qinglong task run``) has no trigger: ``trigger_id`` is ``''`` and
  ``trigger_revision`` 0 (no trigger id is empty, revisions start at 1), it is scheduled for its
  admission time, and its idempotency key (``ql3:manual:v1:<key>``) is also kept in
  ``manual_run_keys``, which pruning never deletes: the same key refuses a second Run for ever.
  A trigger's occurrence needs no such row: its cursor has passed it.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
import uuid
from typing import Any, Mapping, Sequence

from qinglong.contracts.chain import chain_fires, chain_idempotency_key
from qinglong.contracts.event_sources import AdmitResult, occurrence_key, payload_json
from qinglong.contracts.errors import (
    AlreadyExists,
    NotFound,
    SecretsError,
    UserError,
    project_not_found,
    quoted,
    task_not_found,
)
from qinglong.contracts.execution import (
    run_state_filter,
    CONTRACT_LIMITS,
    TERMINAL_ATTEMPT_STATES,
    ActiveAttempt,
    Actor,
    AttemptOutcome,
    AttemptState,
    AttemptView,
    CancelReason,
    DispatchCandidate,
    ExecutionLimits,
    ExecutionSpec,
    FinishResult,
    PruneReport,
    ProcessHandle,
    RetryAt,
    RetryPolicy,
    RunDetail,
    RunSkipView,
    SkipPruneReport,
    RunState,
    RunSummary,
    cancel_words,
    check_run_transition,
    check_manual_key,
    manual_idempotency_key,
    parse_execution_spec,
    retry_decision,
    skip_prune_limit,
)
from qinglong.contracts.reasons import reason as reason_words
from qinglong.contracts.records import canonical_json
from qinglong.contracts.secrets import opened_env_payload
from qinglong.contracts.store import listing_bound

from .queries import query
from .scheduler_read import pinned_execution_digest
from .store import SqliteStore, named_one, named_rows, transaction

#: The largest batch one :meth:`SqliteExecutionStore.prune` call deletes, whatever it is asked:
#: a prune shares the write lock with the scheduler's rounds and must stay short.
MAX_PRUNE_BATCH = 500

#: How many parsed execution specs the store remembers (revisions never change once published).
_SPEC_CACHE_BOUND = 256

def _utc(ms: int) -> str:
    """An instant as an operator reads it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


def _status_words(outcome: AttemptOutcome) -> str | None:
    if outcome.exit_code is not None:
        return reason_words("status_exit", code=outcome.exit_code)
    if outcome.signal is not None:
        return reason_words("status_signal", signal=outcome.signal)
    return None


class SqliteExecutionStore:
    """Implements :class:`qinglong.contracts.execution.ExecutionStore` on the backend's store
    (its one connection and thread). ``limits`` supplies the defaults of a stored payload that
    leaves a key of the execution spec out (publishers write every key out; older revisions may
    not have)."""

    def __init__(self, store: SqliteStore, limits: ExecutionLimits = CONTRACT_LIMITS,
                 rng: random.Random | None = None, *, sealer: Any = None) -> None:
        self._store = store
        self._sealer = sealer
        self._limits = limits
        self._rng = rng or random.Random()
        self._specs: dict[tuple, tuple[ExecutionSpec | None, str | None]] = {}

    # ---------------------------------------------------------------- helpers (connection thread)

    def _spec(self, project_id: str, task_id: str, revision: int, task_digest: str,
              payload_json: str | None) -> tuple[ExecutionSpec | None, str | None]:
        """The execution spec of a pinned task revision and, when it has none, why: no command,
        an invalid spec, or a revision that is not stored."""
        key = (project_id, task_id, revision, task_digest)
        found = self._specs.get(key)
        if found is not None:
            return found
        if payload_json is None:
            found = (None, f"task {task_id!r} revision {revision} is not stored with the digest "
                           "the run recorded")
        else:
            try:
                payload = json.loads(payload_json)
                if isinstance(payload, dict):  # env values in clear, for the job only
                    payload = opened_env_payload(self._sealer, project_id, task_id, payload)
                spec = parse_execution_spec(task_id, payload, self._limits)
            except SecretsError as exc:
                found = (None, f"env values cannot be opened: {exc}")
            except UserError as exc:
                found = (None, f"invalid execution spec: {exc}")
            else:
                found = (spec, None) if spec is not None else (None, reason_words("spec_no_command"))
        if len(self._specs) >= _SPEC_CACHE_BOUND:
            self._specs.clear()
        self._specs[key] = found
        return found

    @staticmethod
    def _event(conn: sqlite3.Connection, run_id: str, kind: str, now_ms: int) -> None:
        conn.execute(query("exec_append_event"), {"run_id": run_id, "type": kind, "now": now_ms})

    @staticmethod
    def _move_run(conn: sqlite3.Connection, run_id: str, current: str, target: RunState,
                  actor: Actor, now_ms: int, reason: str | None = None) -> None:
        """Check the transition, then compare-and-set it (inside the caller's transaction); a
        terminal state admits the chained Runs it starts in the same transaction."""
        check_run_transition(current, target, actor)
        finished = now_ms if target.terminal else None
        changed = conn.execute(query("exec_move_run"), {
            "target": target.value, "finished": finished, "reason": reason,
            "set_reason": int(target.terminal or reason is not None), "run_id": run_id,
            "current": current}).rowcount
        if changed != 1:  # the transaction read this state: only a bug gets here
            raise RuntimeError(f"run {run_id} was not in state {current!r}")
        if target.terminal:
            admit_chained(conn, run_id, target.value, now_ms)

    @staticmethod
    def _end_attempt(conn: sqlite3.Connection, attempt_id: str, current: str,
                     outcome: AttemptOutcome, now_ms: int, *,
                     cancel: CancelReason | None = None) -> bool:
        return conn.execute(query("exec_end_attempt"), {
            "state": outcome.state.value,
            "finished": outcome.ended_at_ms if outcome.ended_at_ms is not None else now_ms,
            "exit_code": outcome.exit_code, "signal": outcome.signal,
            "log_bytes": outcome.log_bytes, "dropped": outcome.log_dropped_bytes,
            "reason": outcome.reason, "cancel_reason": cancel.value if cancel else None,
            "cancel_at": now_ms if cancel else None,
            "attempt_id": attempt_id, "current": current}).rowcount == 1

    # ---------------------------------------------------------------- reads

    async def dispatch_candidates(self, now_ms: int, limit: int) -> Sequence[DispatchCandidate]:
        """Due claimed Attempts in dispatch order (at most ``limit``)."""
        bound = listing_bound(limit)

        def work(conn: sqlite3.Connection) -> list[DispatchCandidate]:
            rows = named_rows(conn, query("exec_dispatch_candidates"), {"now": now_ms, "limit": bound})
            found = []
            for row in rows:
                spec, error = self._spec(row["project_id"], row["task_id"], row["task_revision"],
                                         row["task_digest"], row["payload_json"])
                found.append(DispatchCandidate(
                    row["run_id"], row["attempt_id"], row["attempt_no"], row["project_id"],
                    row["task_id"], row["task_revision"], row["scheduled_for_ms"],
                    row["admitted_at_ms"], RunState(row["run_state"]), spec, error))
            return found

        return await self._store.call(work)

    async def active_attempts(self) -> Sequence[ActiveAttempt]:
        """Every dispatching or running Attempt, in dispatch order."""
        def work(conn: sqlite3.Connection) -> list[ActiveAttempt]:
            found = []
            for row in named_rows(conn, query("exec_active_attempts")):
                spec, _ = self._spec(row["project_id"], row["task_id"], row["task_revision"],
                                     row["task_digest"], row["payload_json"])
                handle = None
                if row["handle_json"] is not None:
                    handle = ProcessHandle.from_json(json.loads(row["handle_json"]))
                cancel = row["cancel_reason"]
                found.append(ActiveAttempt(
                    row["run_id"], row["attempt_id"], row["attempt_no"], row["project_id"],
                    row["task_id"], row["scheduled_for_ms"], AttemptState(row["state"]),
                    row["executor"], row["attempt_dir"], handle, row["started_at_ms"],
                    row["deadline_ms"], CancelReason(cancel) if cancel is not None else None,
                    row["cancel_requested_at_ms"], spec))
            return found

        return await self._store.call(work)

    # ---------------------------------------------------------------- the dispatcher's steps

    async def begin_dispatch(self, attempt_id: str, attempt_dir: str, deadline_ms: int,
                             now_ms: int) -> bool:
        """claimed -> dispatching (Run -> dispatching), recording the Attempt's directory and
        deadline. False, nothing changed, unless the Attempt is its Run's current one, claimed
        and due (another dispatcher won, it was cancelled or skipped, or its backoff runs)."""
        def work(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                return self._begin_one(conn, attempt_id, attempt_dir, deadline_ms, now_ms) is not None

        return await self._store.call(work)

    async def begin_dispatches(self, starts: Sequence[tuple[str, str, int]],
                               now_ms: int) -> Mapping[str, str | None]:
        """:meth:`begin_dispatch` of each start in one transaction; the event payload of each
        Attempt moved (see the contract)."""
        def work(conn: sqlite3.Connection) -> dict[str, str | None]:
            began: dict[str, str | None] = {}
            with transaction(conn):
                for attempt_id, attempt_dir, deadline_ms in starts:
                    run_id = self._begin_one(conn, attempt_id, attempt_dir, deadline_ms, now_ms)
                    if run_id is not None:
                        began[attempt_id] = _event_payload_of(conn, run_id)
            return began

        return await self._store.call(work)

    def _begin_one(self, conn: sqlite3.Connection, attempt_id: str, attempt_dir: str, deadline_ms: int,
                   now_ms: int) -> str | None:
        """claimed -> dispatching inside the caller's transaction: the Run's id, or None (nothing
        changed) unless the Attempt is its Run's current one, claimed and due."""
        row = named_one(conn, query("exec_attempt"), (attempt_id,))
        if (row is None or row["state"] != AttemptState.CLAIMED.value
                or row["attempt_no"] != row["latest_no"]):
            return None
        if row["not_before_ms"] is not None and row["not_before_ms"] > now_ms:
            return None
        check_run_transition(row["run_state"], RunState.DISPATCHING, Actor.DISPATCHER)
        if conn.execute(query("exec_begin_dispatch"), {
                "attempt_dir": attempt_dir, "deadline": deadline_ms, "now": now_ms,
                "attempt_id": attempt_id}).rowcount != 1:
            return None
        self._move_run(conn, row["run_id"], row["run_state"], RunState.DISPATCHING,
                       Actor.DISPATCHER, now_ms)
        self._event(conn, row["run_id"], "run.dispatching", now_ms)
        return row["run_id"]

    async def record_started(self, attempt_id: str, handle: ProcessHandle, started_at_ms: int,
                             actor: Actor = Actor.DISPATCHER) -> bool:
        """dispatching -> running with the process's handle. False if not dispatching."""
        handle_json = canonical_json(handle.to_json())

        def work(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                row = named_one(conn, query("exec_attempt"), (attempt_id,))
                if row is None or row["state"] != AttemptState.DISPATCHING.value:
                    return False
                check_run_transition(row["run_state"], RunState.RUNNING, actor)
                if conn.execute(query("exec_record_started"), {
                        "handle": handle_json, "started": started_at_ms,
                        "attempt_id": attempt_id}).rowcount != 1:
                    return False
                self._move_run(conn, row["run_id"], row["run_state"], RunState.RUNNING, actor,
                               started_at_ms)
                self._event(conn, row["run_id"], "run.started", started_at_ms)
                return True

        return await self._store.call(work)

    async def return_to_queue(self, attempt_id: str, now_ms: int) -> bool:
        """dispatching -> claimed (Run -> queued) for a start that provably never happened.

        An Attempt that carries a durable cancel request is not queued again: it ends
        ``cancelled`` (a Run cancelled while its start was pending stays cancelled), and True is
        returned as well. False, nothing changed, if the Attempt is not dispatching."""
        def work(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                row = named_one(conn, query("exec_attempt"), (attempt_id,))
                if row is None or row["state"] != AttemptState.DISPATCHING.value:
                    return False
                run_id = row["run_id"]
                if row["cancel_reason"] is not None:
                    cancel = CancelReason(row["cancel_reason"])
                    reason = reason_words("cancelled_before_start", cancel=cancel_words(cancel))
                    check_run_transition(row["run_state"], RunState.CANCELLED, Actor.RECONCILER)
                    self._end_attempt(conn, attempt_id, row["state"],
                                      AttemptOutcome(AttemptState.CANCELLED, reason=reason), now_ms)
                    self._move_run(conn, run_id, row["run_state"], RunState.CANCELLED,
                                   Actor.RECONCILER, now_ms, reason)
                    self._event(conn, run_id, "run.finished", now_ms)
                    return True
                check_run_transition(row["run_state"], RunState.QUEUED, Actor.RECONCILER)
                if conn.execute(query("exec_return_to_queue"),
                                {"attempt_id": attempt_id}).rowcount != 1:
                    return False
                self._move_run(conn, run_id, row["run_state"], RunState.QUEUED, Actor.RECONCILER,
                               now_ms)
                self._event(conn, run_id, "run.requeued", now_ms)
                return True

        return await self._store.call(work)

    async def record_finished(self, attempt_id: str, outcome: AttemptOutcome, now_ms: int,
                              actor: Actor, *, started: bool = True) -> FinishResult:
        """End the Attempt exactly once with ``outcome``, then apply the contracts'
        :func:`retry_decision`: a new ``claimed`` Attempt N+1 held back to its backoff (Run ->
        ``retry_wait``), or the Run's terminal state with its finish time and reason.

        An Attempt that already ended is left as it is (``recorded=False``). A transition the state
        machine forbids (an Attempt never dispatched, an actor that may not end it) raises
        :class:`~qinglong.contracts.execution.IllegalTransition` and writes nothing. A cancel
        requested by an operator, a replacing Run or a stop is never followed by a retry."""
        if AttemptState(outcome.state) not in TERMINAL_ATTEMPT_STATES:
            raise ValueError(f"an outcome must be a terminal attempt state, not {outcome.state!r}")

        def work(conn: sqlite3.Connection) -> FinishResult:
            with transaction(conn):
                row = named_one(conn, query("exec_attempt"), (attempt_id,))
                if row is None:
                    raise NotFound(f"attempt {quoted(attempt_id)} does not exist")
                run_id, run_state = row["run_id"], row["run_state"]
                if AttemptState(row["state"]).terminal:
                    return FinishResult(False, RunState(run_state))
                spec, _ = self._spec(row["project_id"], row["task_id"], row["task_revision"],
                                     row["task_digest"], row["payload_json"])
                policy = spec.retry if spec is not None else RetryPolicy()
                idempotent = spec.idempotent if spec is not None else False
                decision = retry_decision(policy, idempotent, row["attempt_no"], outcome, now_ms,
                                          self._rng, started=started)
                cancel = row["cancel_reason"]
                if (isinstance(decision, RetryAt) and cancel is not None
                        and CancelReason(cancel) is not CancelReason.TIMEOUT):
                    decision = None  # cancelled on purpose: no successor
                status = _status_words(outcome)
                if isinstance(decision, RetryAt):
                    check_run_transition(run_state, RunState.RETRY_WAIT, actor)
                    if not self._end_attempt(conn, attempt_id, row["state"], outcome, now_ms):
                        return FinishResult(False, RunState(run_state))
                    conn.execute(query("exec_insert_retry"), {
                        "attempt_id": uuid.uuid4().hex, "run_id": run_id,
                        "attempt_no": decision.attempt_no, "executor": row["executor"],
                        "digest": row["execution_digest"], "not_before": decision.at_ms,
                        "now": now_ms})
                    what = outcome.reason or status or outcome.state.value
                    reason = reason_words(
                        "retry_scheduled", attempt_no=row["attempt_no"], state=outcome.state.value,
                        what=what, next_attempt_no=decision.attempt_no,
                        not_before=_utc(decision.at_ms))
                    self._move_run(conn, run_id, run_state, RunState.RETRY_WAIT, actor, now_ms,
                                   reason)
                    self._event(conn, run_id, "run.retry_scheduled", now_ms)
                    return FinishResult(True, RunState.RETRY_WAIT, decision)
                target = RunState(outcome.state.value)
                check_run_transition(run_state, target, actor)
                if not self._end_attempt(conn, attempt_id, row["state"], outcome, now_ms):
                    return FinishResult(False, RunState(run_state))
                reason = None
                if target is not RunState.SUCCEEDED:
                    parts = [p for p in (outcome.reason, status) if p]
                    if decision is not None and policy.max_attempts > 1:
                        parts.append(decision.reason)
                    reason = "; ".join(parts) or target.value
                self._move_run(conn, run_id, run_state, target, actor, now_ms, reason)
                self._event(conn, run_id, "run.finished", now_ms)
                return FinishResult(True, target)

        return await self._store.call(work)

    async def request_cancel(self, run_id: str, reason: CancelReason, now_ms: int,
                             actor: Actor = Actor.OPERATOR) -> RunState:
        """A durable cancel request on the Run's active Attempt (the first request's reason
        stays; its process is then signalled by whoever runs it); a Run without a process
        (queued, retry_wait) ends ``cancelled`` at once. A terminal Run is left as it is.
        :class:`~qinglong.contracts.errors.NotFound` for an unknown Run."""
        reason = CancelReason(reason)

        def work(conn: sqlite3.Connection) -> RunState:
            with transaction(conn):
                row = named_one(conn, query("exec_latest_attempt_of_run"), (run_id,))
                if row is None:
                    raise NotFound(f"run {quoted(run_id)} does not exist")
                run_state = RunState(row["run_state"])
                if run_state.terminal or row["attempt_id"] is None:
                    return run_state
                attempt_state = AttemptState(row["state"])
                if attempt_state is AttemptState.CLAIMED:
                    words = cancel_words(reason)
                    check_run_transition(run_state, RunState.CANCELLED, actor)
                    self._end_attempt(conn, row["attempt_id"], attempt_state.value,
                                      AttemptOutcome(AttemptState.CANCELLED, reason=words),
                                      now_ms, cancel=reason)
                    self._event(conn, run_id, "run.cancel_requested", now_ms)
                    self._move_run(conn, run_id, run_state.value, RunState.CANCELLED, actor,
                                   now_ms, words)
                    self._event(conn, run_id, "run.finished", now_ms)
                    return RunState.CANCELLED
                if attempt_state in (AttemptState.DISPATCHING, AttemptState.RUNNING):
                    if conn.execute(query("exec_request_cancel"), {
                            "reason": reason.value, "now": now_ms,
                            "attempt_id": row["attempt_id"]}).rowcount == 1:
                        self._event(conn, run_id, "run.cancel_requested", now_ms)
                return run_state

        return await self._store.call(work)

    async def skip_run(self, run_id: str, attempt_id: str, reason: str, now_ms: int) -> bool:
        """Skip a Run whose current Attempt is still ``claimed`` because its overlap rules skip
        it, with ``reason``: it ends ``cancelled`` (its end event is written as for any end),
        then becomes a skip record (:meth:`recent_run_skips`) and its rows leave the store.
        False, nothing changed, otherwise."""
        def work(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                row = named_one(conn, query("exec_attempt"), (attempt_id,))
                if (row is None or row["run_id"] != run_id
                        or row["state"] != AttemptState.CLAIMED.value
                        or row["attempt_no"] != row["latest_no"]):
                    return False
                check_run_transition(row["run_state"], RunState.CANCELLED, Actor.DISPATCHER)
                self._end_attempt(conn, attempt_id, row["state"],
                                  AttemptOutcome(AttemptState.CANCELLED, reason=reason), now_ms)
                self._event(conn, run_id, "run.skipped", now_ms)
                self._move_run(conn, run_id, row["run_state"], RunState.CANCELLED,
                               Actor.DISPATCHER, now_ms, reason)
                conn.execute(query("exec_insert_run_skip"), {"reason": reason, "now": now_ms, "run_id": run_id})
                conn.execute(query("exec_delete_run_events"), (run_id,))
                conn.execute(query("exec_delete_run_attempts"), (run_id,))
                conn.execute(query("exec_delete_run"), (run_id,))
                return True

        return await self._store.call(work)

    async def recent_run_skips(self, limit: int = 20) -> Sequence[RunSkipView]:
        """The newest Runs skipped before they started, newest first (at most ``limit``)."""
        bound = listing_bound(limit)
        rows = await self._store.call(named_rows, query("exec_recent_run_skips"), {"limit": bound}, bound)
        return [RunSkipView(row["run_id"], row["project_id"], row["task_id"], row["trigger_id"],
                            row["scheduled_for_ms"], row["reason"], row["recorded_at_ms"]) for row in rows]

    # ---------------------------------------------------------------- manual Runs

    async def admit_manual_run(self, project_id: str, task_id: str, key: str,
                               now_ms: int) -> tuple[str, bool]:
        """Admit a manual Run of the task's head revision now. ``key`` is the caller's key
        (``ql3:manual:v1:`` is prefixed unless it is already there). Returns ``(run_id,
        created)``: the same key again returns the first Run's id and ``created=False``, also
        after that Run was pruned. An unknown project or task is
        :class:`~qinglong.contracts.errors.NotFound`, a bad key a
        :class:`~qinglong.contracts.errors.UserError`, a key that admitted a Run of another task
        :class:`~qinglong.contracts.errors.AlreadyExists` (naming neither that Run nor its
        project: keys are one space for every project); none writes anything."""
        check_manual_key("idempotency key", key)
        full_key = key if key.startswith(manual_idempotency_key("")) else manual_idempotency_key(key)

        def work(conn: sqlite3.Connection) -> tuple[str, bool]:
            with transaction(conn):
                for block in ("exec_manual_key", "exec_run_by_key"):
                    seen = conn.execute(query(block), (full_key,)).fetchone()
                    if seen is not None:
                        if (seen[1], seen[2]) != (project_id, task_id):
                            raise AlreadyExists(f"idempotency key {quoted(key)} admitted a Run of another task; "
                                                "a key admits one Run of one task: use a new key")
                        return seen[0], False
                if named_one(conn, query("project_by_id"), (project_id,)) is None:
                    raise project_not_found(project_id)
                task = named_one(conn, query("exec_task_for_manual_run"), (project_id, task_id))
                if task is None:
                    raise task_not_found(project_id, task_id)
                run_id = uuid.uuid4().hex
                revision, digest = task["task_revision"], task["content_digest"]
                conn.execute(query("exec_insert_manual_run"), {
                    "run_id": run_id, "project_id": project_id, "task_id": task_id,
                    "revision": revision, "digest": digest, "now": now_ms, "key": full_key})
                conn.execute(query("insert_attempt"), {
                    "attempt_id": uuid.uuid4().hex, "run_id": run_id, "executor": task["executor"],
                    "digest": pinned_execution_digest(project_id, task_id, revision, digest,
                                                      task["executor"]),
                    "now": now_ms})
                conn.execute(query("insert_run_events"), (run_id, now_ms))
                conn.execute(query("exec_insert_manual_key"),
                             (full_key, run_id, project_id, task_id, now_ms))
                return run_id, True

        return await self._store.call(work)

    # ---------------------------------------------------------------- event sources

    async def admit_occurrence(self, kind: str, trigger_id: str, event_id: str,
                               payload: Mapping[str, Any] | None, now_ms: int) -> AdmitResult:
        """One Run of the trigger for this event (:mod:`qinglong.contracts.event_sources`), in
        one transaction; the key is also kept in ``manual_run_keys``, which pruning never
        deletes, so the same event refuses a second Run for ever."""
        key = occurrence_key(kind, trigger_id, event_id)
        payload_text = payload_json(payload)

        def work(conn: sqlite3.Connection) -> AdmitResult:
            with transaction(conn):
                for block in ("exec_manual_key", "exec_run_by_key"):
                    seen = conn.execute(query(block), (key,)).fetchone()
                    if seen is not None:
                        return AdmitResult(seen[0], False)
                trig = named_one(conn, query("occurrence_trigger"), (trigger_id,))
                if trig is None:
                    return AdmitResult(None, False, f"trigger {quoted(trigger_id)} does not exist")
                if trig["kind"] != kind:
                    return AdmitResult(None, False, f"trigger {quoted(trigger_id)} is of kind "
                                                    f"{trig['kind']!r}, not {kind!r}")
                if not trig["admits"]:
                    return AdmitResult(None, False, f"trigger {quoted(trigger_id)} is disabled, or its "
                                                    "project or task is not active")
                run_id = uuid.uuid4().hex
                project_id, task_id = trig["project_id"], trig["task_id"]
                revision, digest = trig["task_revision"], trig["content_digest"]
                conn.execute(query("chain_insert_run"), {
                    "run_id": run_id, "project_id": project_id, "trigger_id": trigger_id,
                    "trigger_revision": trig["trigger_revision"], "task_id": task_id,
                    "revision": revision, "digest": digest, "now": now_ms, "key": key})
                conn.execute(query("insert_attempt"), {
                    "attempt_id": uuid.uuid4().hex, "run_id": run_id, "executor": trig["executor"],
                    "digest": pinned_execution_digest(project_id, task_id, revision, digest,
                                                      trig["executor"]),
                    "now": now_ms})
                conn.execute(query("insert_run_events"), (run_id, now_ms))
                conn.execute(query("exec_insert_manual_key"),
                             (key, run_id, project_id, task_id, now_ms))
                if payload_text is not None:
                    conn.execute(query("insert_event_payload"), (run_id, payload_text))
                return AdmitResult(run_id, True)

        return await self._store.call(work)

    async def event_payload(self, run_id: str) -> str | None:
        """The payload (canonical JSON) an event admitted the Run with, or None."""

        return await self._store.call(_event_payload_of, run_id)

    # ---------------------------------------------------------------- listings

    async def list_runs(self, *, state: RunState | str | None = None,
                        project_id: str | None = None, task_id: str | None = None,
                        limit: int = 50) -> Sequence[RunSummary]:
        """Runs newest first (by scheduled time, then admission), optionally of one state,
        project and task; bounded by :func:`~qinglong.contracts.store.listing_bound`."""
        bound = listing_bound(limit)
        state = run_state_filter(state)
        params = {"state": state.value if state is not None else None, "project": project_id,
                  "task": task_id, "limit": bound}
        if project_id is not None and task_id is not None:
            block = "exec_list_runs_of_task"
        elif state is not None and not state.terminal:
            block = "exec_list_runs_in_flight"
        else:
            block = "exec_list_runs"
        rows = await self._store.call(named_rows, query(block), params, bound)
        return [_summary(row) for row in rows]

    async def run_detail(self, run_id: str) -> RunDetail:
        """The Run and every Attempt; :class:`~qinglong.contracts.errors.NotFound` if unknown."""
        def work(conn: sqlite3.Connection) -> RunDetail:
            conn.execute("BEGIN")  # one read snapshot for the Run and its Attempts
            try:
                run = named_one(conn, query("exec_run"), (run_id,))
                if run is None:
                    raise NotFound(f"run {quoted(run_id)} does not exist (it may have been pruned)")
                attempts = named_rows(conn, query("exec_attempts_of_run"), (run_id,))
            finally:
                conn.execute("COMMIT")
            views = tuple(AttemptView(
                a["attempt_id"], a["attempt_no"], AttemptState(a["state"]), a["executor"],
                a["created_at_ms"], a["not_before_ms"], a["started_at_ms"], a["finished_at_ms"],
                a["exit_code"], a["signal"], a["duration_ms"], a["log_bytes"],
                a["log_dropped_bytes"], a["log_deleted_at_ms"] is not None, a["attempt_dir"],
                a["reason"], a["cancel_reason"]) for a in attempts)
            return RunDetail(_summary(run), run["idempotency_key"], run["task_revision"], views,
                             run["jitter_ms"])

        return await self._store.call(work)

    # ---------------------------------------------------------------- retention

    async def finished_logs(self, older_than_ms: int, limit: int) -> Sequence[tuple[str, str]]:
        """``(attempt_id, attempt_dir)`` of ended Attempts whose log still exists, ended before
        ``older_than_ms``, oldest first (at most ``limit``)."""
        bound = listing_bound(limit)
        rows = await self._store.call(named_rows, query("exec_finished_logs"),
                                      {"before": older_than_ms, "limit": bound}, bound)
        return [(row["attempt_id"], row["attempt_dir"]) for row in rows]

    async def logs_for_space(self, keep_per_task: int, under_dir: str, limit: int) -> Sequence[tuple[str, str]]:
        """``(attempt_id, attempt_dir)`` of ended Attempts whose log still exists under
        ``under_dir``, oldest first, never one of the newest ``keep_per_task`` of its task."""
        bound = listing_bound(limit)
        under = under_dir.rstrip("/") + "/"
        rows = await self._store.call(named_rows, query("exec_logs_for_space"),
                                      {"keep": max(int(keep_per_task), 0), "under": under, "limit": bound},
                                      bound)
        return [(row["attempt_id"], row["attempt_dir"]) for row in rows]

    async def note_attempt(self, attempt_id: str, note: str) -> bool:
        """Record ``note`` as the reason of a dispatching or running Attempt (its end's reason
        replaces it); False when the Attempt has ended."""
        def work(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                return conn.execute(query("exec_note_attempt"),
                                    {"note": note, "attempt_id": attempt_id}).rowcount == 1

        return await self._store.call(work)

    async def mark_log_deleted(self, attempt_id: str, now_ms: int) -> None:
        """Record that the Attempt's log was deleted (the tombstone; the first time stays)."""
        def work(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.execute(query("exec_mark_log_deleted"), {"now": now_ms, "attempt_id": attempt_id})

        await self._store.call(work)

    async def prune(self, older_than_ms: int, batch: int) -> PruneReport:
        """Delete up to ``batch`` (at most :data:`MAX_PRUNE_BATCH`) terminal Runs finished before
        ``older_than_ms``, oldest first, with their Attempts and events, and as many audit entries
        older than that, in one short transaction.
        A Run with an Attempt whose log is still on disk waits for log retention. Manual Runs'
        idempotency keys stay (``manual_run_keys``); a trigger occurrence's cursor has passed."""
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise UserError(f"prune batch: expected a whole number >= 1, got {batch!r}")
        bound = min(batch, MAX_PRUNE_BATCH)

        def work(conn: sqlite3.Connection) -> PruneReport:
            runs = attempts = events = 0
            with transaction(conn):
                for (run_id,) in conn.execute(query("exec_prunable_runs"),
                                              {"before": older_than_ms, "limit": bound}).fetchall():
                    events += conn.execute(query("exec_delete_run_events"), (run_id,)).rowcount
                    attempts += conn.execute(query("exec_delete_run_attempts"), (run_id,)).rowcount
                    runs += conn.execute(query("exec_delete_run"), (run_id,)).rowcount
                # the audit log is kept as long as the Runs it speaks of
                conn.execute(query("prune_audit"), {"before": older_than_ms, "limit": bound})
            return PruneReport(runs, attempts, events)

        return await self._store.call(work)

    async def prune_skips(self, older_than_ms: int, limit: int) -> SkipPruneReport:
        """Delete up to ``limit`` skipped occurrences and as many skipped Runs recorded before
        ``older_than_ms``, oldest first, in one short transaction (``PrunesSkips``)."""
        bound = skip_prune_limit(limit)

        def work(conn: sqlite3.Connection) -> SkipPruneReport:
            params = {"before": int(older_than_ms), "limit": bound}
            with transaction(conn):
                occurrences = conn.execute(query("exec_prune_schedule_skips"), params).rowcount
                runs = conn.execute(query("exec_prune_run_skips"), params).rowcount
            return SkipPruneReport(occurrences, runs)

        return await self._store.call(work)


def _event_payload_of(conn: sqlite3.Connection, run_id: str) -> str | None:
    """The payload (canonical JSON) an event admitted ``run_id`` with, or None."""
    row = conn.execute(query("event_payload"), (run_id,)).fetchone()
    return row[0] if row else None


def admit_chained(conn: sqlite3.Connection, run_id: str, state: str, now_ms: int) -> list[str]:
    """Admit, inside the caller's transaction, one queued Run per enabled ``after`` trigger that
    follows the ended Run's task and whose ``on`` matches ``state``, keyed
    ``ql3:chain:v1:<run>:<trigger>`` (a second admission of a key inserts nothing). A trigger
    whose task was deleted admits nothing. The ids of the Runs admitted."""
    run = conn.execute(query("chain_run"), (run_id,)).fetchone()
    if run is None:
        return []
    admitted = []
    for trig in named_rows(conn, query("chain_triggers_of"), {"project": run[0], "task": run[1]}):
        try:
            on = json.loads(trig["spec_json"]).get("on", "success")
        except ValueError:
            continue
        if not chain_fires(on, state):
            continue
        task = named_one(conn, query("exec_task_for_manual_run"), (run[0], trig["task_id"]))
        if task is None:
            continue
        new_id = uuid.uuid4().hex
        revision, digest = task["task_revision"], task["content_digest"]
        if conn.execute(query("chain_insert_run"), {
                "run_id": new_id, "project_id": run[0], "trigger_id": trig["trigger_id"],
                "trigger_revision": trig["trigger_revision"], "task_id": trig["task_id"],
                "revision": revision, "digest": digest, "now": now_ms,
                "key": chain_idempotency_key(run_id, trig["trigger_id"])}).rowcount != 1:
            continue
        conn.execute(query("insert_attempt"), {
            "attempt_id": uuid.uuid4().hex, "run_id": new_id, "executor": task["executor"],
            "digest": pinned_execution_digest(run[0], trig["task_id"], revision, digest,
                                              task["executor"]),
            "now": now_ms})
        conn.execute(query("insert_run_events"), (new_id, now_ms))
        admitted.append(new_id)
    return admitted


def _summary(row: sqlite3.Row) -> RunSummary:
    return RunSummary(row["run_id"], row["project_id"], row["task_id"], row["trigger_id"],
                      row["scheduled_for_ms"], row["admitted_at_ms"], RunState(row["state"]),
                      row["attempts"], row["exit_code"], row["duration_ms"], row["finished_at_ms"],
                      row["reason"])


__all__ = ["SqliteExecutionStore", "MAX_PRUNE_BATCH"]
