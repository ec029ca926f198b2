"""The bounded scheduler round: scan one page, decide outside any transaction, commit each occurrence.

The whole round runs as one function on the connection's thread (one hop per round, see FACTS):

1. read ONE page of uninitialised, then due schedules (:func:`read_page`), oldest cursor first;
2. decide every row with the contract's :func:`~qinglong.contracts.decision.decide`, no
   transaction open, so cron maths never holds the write lock;
3. commit each decision in its own transaction: a compare-and-set on the schedule row (revision,
   state version and cursor as decided) plus, for an admission, the Run, its Attempt and the
   ``run.created``/``run.queued`` events, plus the skipped range of a misfire. A miss (the trigger
   was republished meanwhile) rolls back and admits nothing.

A ``fire`` may leave the cursor still due (a backlog inside the grace window); that row is decided
again within the round, at most :data:`BACKLOG_FIRES_PER_ROW` times, so a backlog drains without
one trigger taking the whole round. A crash at any point leaves an occurrence wholly committed or
not at all, and the compare-and-set means a restarted round can never admit it twice.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from qinglong.contracts.decision import decide
from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.records import (
    Decision,
    DecisionKind,
    MisfirePolicy,
    RoundReport,
    ScheduleCursor,
    TriggerHead,
    content_digest,
)

from .queries import q

#: How many on-time backlog occurrences one trigger may admit in one round.
BACKLOG_FIRES_PER_ROW = 64

#: Bound of the per-round occurrence memo (see :class:`_MemoProvider`).
_MEMO_BOUND = 4096

EXECUTOR = "remote_worker"

#: A test seam: called on the connection's thread after every decision of the page was made and
#: before the first commit, to change the database between decision and commit.
BeforeCommit = Callable[[sqlite3.Connection], None]


class _MemoProvider:
    """A provider whose answers are remembered for one round.

    Providers are pure (a spec and an instant determine the answer), and many triggers share a
    spec and a cursor (every minute, on the minute), so a page of them costs one cron computation
    instead of one each. The memo lives for one round and is bounded.
    """

    __slots__ = ("_provider", "_memo", "_spec_key", "kind")

    def __init__(self, provider: TriggerProvider, memo: dict, spec_key: str) -> None:
        self._provider = provider
        self._memo = memo
        self._spec_key = spec_key
        self.kind = provider.kind

    def _cached(self, op: str, spec: Mapping[str, Any], at_ms: int) -> int | None:
        key = (self.kind, self._spec_key, op, at_ms)
        try:
            return self._memo[key]
        except KeyError:
            pass
        if op == "next":
            value = self._provider.next_after(spec, at_ms)
        else:
            value = self._provider.latest_at_or_before(spec, at_ms)
        if len(self._memo) >= _MEMO_BOUND:
            self._memo.clear()
        self._memo[key] = value
        return value

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        """Delegates to the wrapped provider."""
        return self._provider.validate(spec)

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        """Remembered :meth:`TriggerProvider.next_after`."""
        return self._cached("next", spec, after_ms)

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        """Remembered :meth:`TriggerProvider.latest_at_or_before`."""
        return self._cached("latest", spec, at_ms)

    def describe(self, spec: Mapping[str, Any]) -> str:
        """Delegates to the wrapped provider."""
        return self._provider.describe(spec)


@dataclass(slots=True)
class _DueRow:
    """One row of ``claim_due_page``: a due schedule with the heads it is decided from."""

    head: TriggerHead
    cursor: ScheduleCursor
    task_revision: int
    task_digest: str
    provider: Any = None
    execution_digest: str = ""


@dataclass(slots=True)
class RoundOutcome:
    """Counters and diagnostics of one round, built on the connection's thread."""

    scanned: int = 0
    initialized: int = 0
    admitted: int = 0
    skipped: int = 0
    cas_misses: int = 0
    errors: int = 0
    more_due: bool = False
    diagnostics: list[DiagnosticEvent] = field(default_factory=list)

    def report(self, duration_ms: int) -> RoundReport:
        """The contract's :class:`RoundReport` (``claimed`` stays 0: SQLite has no claims)."""
        return RoundReport(scanned=self.scanned, initialized=self.initialized,
                           admitted=self.admitted, skipped=self.skipped,
                           cas_misses=self.cas_misses, errors=self.errors,
                           duration_ms=duration_ms, more_due=self.more_due)


def _due_row(row: tuple, specs: dict) -> _DueRow:
    (trigger_id, project_id, revision, next_fire, last_scheduled, state_version, task_id, kind,
     spec_json, policy, grace, trigger_digest, task_revision, task_digest) = row
    spec = specs.get(spec_json)
    if spec is None:
        spec = specs[spec_json] = json.loads(spec_json)
    head = TriggerHead(project_id, trigger_id, task_id, revision, kind, spec, MisfirePolicy(policy),
                       grace, True, trigger_digest)
    return _DueRow(head, ScheduleCursor(revision, next_fire, last_scheduled, state_version),
                   task_revision, task_digest)


def _error(outcome: RoundOutcome, code: str, row: _DueRow | None, exc: BaseException) -> None:
    outcome.errors += 1
    fields: dict[str, Any] = {"error": type(exc).__name__}
    if row is not None:
        fields.update(project_id=row.head.project_id, trigger_id=row.head.trigger_id,
                      trigger_revision=row.head.trigger_revision)
    outcome.diagnostics.append(DiagnosticEvent("error", code, str(exc)[:300], fields))


def commit_decision(conn: sqlite3.Connection, row: _DueRow, decision: Decision, now_ms: int) -> bool:
    """Commit one decision in its own transaction; False on a compare-and-set miss (nothing written)."""
    head = row.head
    conn.execute("BEGIN IMMEDIATE")
    try:
        changed = conn.execute(q("advance_schedule"), {
            "next": decision.next_fire_at_ms, "scheduled": decision.scheduled_for_ms, "now": now_ms,
            "trigger_id": head.trigger_id, "revision": decision.trigger_revision,
            "state_version": row.cursor.state_version, "expected": decision.expected_next_fire_at_ms,
        }).rowcount
        if changed != 1:
            conn.execute("ROLLBACK")
            return False
        if decision.scheduled_for_ms is not None:
            # Identity is allocated only now, when the occurrence is certainly admitted.
            run_id = uuid.uuid4().hex
            conn.execute(q("insert_run"), (
                run_id, head.project_id, head.trigger_id, head.trigger_revision, head.task_id,
                row.task_revision, row.task_digest, decision.scheduled_for_ms, now_ms, now_ms,
                idempotency_key(head.trigger_id, head.trigger_revision, decision.scheduled_for_ms,
                                head.kind),
            ))
            conn.execute(q("insert_attempt"), (uuid.uuid4().hex, run_id, row.execution_digest, now_ms))
            conn.execute(q("insert_run_events"), (run_id, now_ms))
        skipped = decision.skipped
        if skipped is not None:
            conn.execute(q("insert_schedule_skip"), (
                head.project_id, head.trigger_id, head.trigger_revision, head.misfire_policy.value,
                skipped.first_ms, skipped.last_ms, skipped.count, int(skipped.count_exact), now_ms,
            ))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return True


def _count(outcome: RoundOutcome, decision: Decision) -> None:
    if decision.kind is DecisionKind.INITIALIZE:
        outcome.initialized += 1
    if decision.scheduled_for_ms is not None:
        outcome.admitted += 1
    if decision.kind is DecisionKind.MISFIRE_SKIP:
        outcome.skipped += 1


def read_page(conn: sqlite3.Connection, now_ms: int, page_size: int) -> list[tuple]:
    """ONE page in due-scan order: ``next_fire_at_ms NULLS FIRST, project_id, trigger_id``.

    Two index range scans (uninitialised, then due) instead of one ``IS NULL OR <=`` predicate,
    which SQLite cannot serve in index order and would answer by scanning and sorting every
    trigger. Each stops after the page; the table is never in memory.
    """
    rows = conn.execute(q("claim_uninitialised_page"), {"page": page_size}).fetchall()
    if len(rows) < page_size:
        rows += conn.execute(q("claim_due_page"),
                             {"now": now_ms, "page": page_size - len(rows)}).fetchall()
    return rows


def run_page(conn: sqlite3.Connection, now_ms: int, page_size: int,
             providers: Mapping[str, TriggerProvider],
             before_commit: BeforeCommit | None = None) -> RoundOutcome:
    """One round on the connection's thread. Never raises for one occurrence's failure."""
    outcome = RoundOutcome()
    specs: dict[str, Any] = {}
    memo: dict = {}
    raw_rows = read_page(conn, now_ms, page_size)
    outcome.scanned = len(raw_rows)
    outcome.more_due = len(raw_rows) >= page_size

    decided: list[tuple[_DueRow, Decision]] = []
    for raw in raw_rows:
        row = None
        try:
            row = _due_row(raw, specs)
            provider = providers.get(row.head.kind)
            if provider is None:
                raise LookupError(f"no loaded plugin provides trigger kind {row.head.kind!r}")
            row.provider = _MemoProvider(provider, memo, raw[8])
            decision = decide(row.head, row.cursor, now_ms, row.provider)
            if decision.kind is DecisionKind.NOT_DUE:
                continue
            if decision.scheduled_for_ms is not None:
                row.execution_digest = content_digest({
                    "executor": EXECUTOR, "project_id": row.head.project_id,
                    "task_id": row.head.task_id, "task_revision": row.task_revision,
                    "task_digest": row.task_digest,
                })
            decided.append((row, decision))
        except Exception as exc:  # one trigger's failure never stops the round
            _error(outcome, "scheduler.decide_failed", row, exc)
    del raw_rows

    if before_commit is not None:
        before_commit(conn)

    for row, decision in decided:
        for _ in range(BACKLOG_FIRES_PER_ROW):
            try:
                committed = commit_decision(conn, row, decision, now_ms)
            except Exception as exc:
                _error(outcome, "scheduler.commit_failed", row, exc)
                break
            if not committed:
                outcome.cas_misses += 1
                break
            _count(outcome, decision)
            if decision.kind is not DecisionKind.FIRE or decision.next_fire_at_ms > now_ms:
                break
            # The cursor is still due (backlog inside the grace window): decide it again.
            row.cursor = ScheduleCursor(decision.trigger_revision, decision.next_fire_at_ms,
                                        decision.scheduled_for_ms, row.cursor.state_version + 1)
            try:
                decision = decide(row.head, row.cursor, now_ms, row.provider)
            except Exception as exc:
                _error(outcome, "scheduler.decide_failed", row, exc)
                break
            if decision.kind is DecisionKind.NOT_DUE:
                break
        else:
            outcome.more_due = True
    return outcome


async def run_round(store: Any, clock_ms: Callable[[], int], page_size: int,
                    providers: Mapping[str, TriggerProvider], diagnostics: Any,
                    before_commit: BeforeCommit | None = None) -> RoundReport:
    """Observe the clock once, run the page on the store's thread, emit its diagnostics here."""
    started = time.monotonic()
    now_ms = clock_ms()
    outcome = await store.call(run_page, now_ms, page_size, providers, before_commit)
    for event in outcome.diagnostics:
        try:
            diagnostics.emit(event)
        except Exception:  # a sink must not raise; if it does, the round still reports
            pass
    return outcome.report(int((time.monotonic() - started) * 1000))
