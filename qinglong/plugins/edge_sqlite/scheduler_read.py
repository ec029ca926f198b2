"""The scheduler round's reading and deciding (steps 1 and 2 of :mod:`.scheduler`): ONE page of
due schedules read in due-scan order, each row decided with the contract's
:func:`~qinglong.contracts.decision.decide`, no transaction open, so cron maths never holds the
write lock. Rows that cannot be decided are held (:mod:`.scheduler_holds`) and stepped past.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from qinglong.contracts.decision import decide
from qinglong.contracts.diagnostics import DiagnosticEvent, RoundEvent
from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.records import (
    Decision,
    DecisionKind,
    MisfirePolicy,
    RoundTally,
    ScheduleCursor,
    TriggerHead,
    content_digest,
)

from .queries import query
from .store import named_cursor

if TYPE_CHECKING:
    from .scheduler_holds import RoundHolds

#: Bound of the per-round occurrence memo (see :class:`_MemoProvider`).
_MEMO_BOUND = 4096

#: How many rows one round may read past undecidable ones, in pages of ``page_size``: a round
#: steps past a wall of held-worthy rows this many rows at a time, never unboundedly.
SCAN_PAGES_PER_ROUND = 64

#: The keyset before every row: below every cursor and every identifier.
_KEYSET_START = (-(2 ** 63), "", "")

#: The executor an Attempt is claimed for when its task's payload names none.
DEFAULT_EXECUTOR = "local_process"


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
class DueRow:
    """One row of ``claim_due_page``: a due schedule with the heads it is decided from."""

    head: TriggerHead
    cursor: ScheduleCursor
    task_revision: int
    task_digest: str
    provider: Any = None
    execution_digest: str = ""
    executor: str = DEFAULT_EXECUTOR


@dataclass(slots=True)
class RoundOutcome(RoundTally):
    """The contract's round counters plus the diagnostics of one round, built on the connection's
    thread and emitted on the event loop (``claimed`` stays 0: SQLite has no claims)."""

    diagnostics: list[DiagnosticEvent] = field(default_factory=list)


def due_row(row: sqlite3.Row, specs: dict) -> DueRow:
    """A page row (from :func:`read_page`, read by column name) as the decision's inputs; ``specs``
    memoises parsed spec JSON across the round."""
    spec_json = row["spec_json"]
    spec = specs.get(spec_json)
    if spec is None:
        spec = specs[spec_json] = json.loads(spec_json)
    head = TriggerHead(
        project_id=row["project_id"], trigger_id=row["trigger_id"], task_id=row["task_id"],
        trigger_revision=row["trigger_revision"], kind=row["kind"], spec=spec,
        misfire_policy=MisfirePolicy(row["misfire_policy"]),
        misfire_grace_ms=row["misfire_grace_ms"], enabled=True,
        content_digest=row["trigger_digest"], jitter_ms=row["jitter_ms"])
    cursor = ScheduleCursor(
        trigger_revision=row["trigger_revision"], next_fire_at_ms=row["next_fire_at_ms"],
        last_scheduled_at_ms=row["last_scheduled_at_ms"], state_version=row["state_version"],
        published_at_ms=row["published_at_ms"])
    return DueRow(head, cursor, row["task_revision"], row["task_digest"],
                   executor=row["executor"])


def row_fields(row: DueRow | None, exc: BaseException | None) -> dict[str, Any]:
    fields: dict[str, Any] = {} if exc is None else {"error": type(exc).__name__}
    if row is not None:
        fields.update(project_id=row.head.project_id, trigger_id=row.head.trigger_id,
                      trigger_revision=row.head.trigger_revision, kind=row.head.kind)
    return fields


def read_page(conn: sqlite3.Connection, now_ms: int, page_size: int,
              after: tuple | None = None) -> list[sqlite3.Row]:
    """ONE page in due-scan order: ``next_fire_at_ms NULLS FIRST, project_id, trigger_id``,
    starting after the keyset ``after`` (a previous page's last row, from :func:`keyset_of`).

    Two index range scans (uninitialized, then due) instead of one ``IS NULL OR <=`` predicate,
    which SQLite cannot serve in index order and would answer by scanning and sorting every
    trigger. Each stops after the page; the table is never in memory. Held rows are excluded.
    Rows are :class:`sqlite3.Row`, read by column name (the connection's own row factory is left
    alone).
    """
    rows: list[sqlite3.Row] = []
    cur = named_cursor(conn)
    try:
        if after is None or after[0] is None:
            project, trigger = ("", "") if after is None else after[1:]
            rows = cur.execute(query("claim_uninitialized_page"), {
                "page": page_size, "after_project": project, "after_trigger": trigger}).fetchall()
            after = _KEYSET_START
        if len(rows) < page_size:
            rows += cur.execute(query("claim_due_page"), {
                "now": now_ms, "page": page_size - len(rows), "after_next": after[0],
                "after_project": after[1], "after_trigger": after[2]}).fetchall()
    finally:
        cur.close()
    return rows


def keyset_of(raw: sqlite3.Row) -> tuple:
    """The scan position of a page row: (next_fire_at_ms or None, project_id, trigger_id)."""
    return (raw["next_fire_at_ms"], raw["project_id"], raw["trigger_id"])


def decide_page(conn: sqlite3.Connection, now_ms: int, page_size: int,
                 providers: Mapping[str, TriggerProvider], outcome: RoundOutcome,
                 holds: RoundHolds) -> tuple[list[tuple[DueRow, Decision]], bool]:
    """Read and decide up to one page of decidable rows, stepping past undecidable ones (held) by
    keyset, reading at most :data:`SCAN_PAGES_PER_ROUND` pages. Returns the decisions and whether
    rows may remain unread (the page filled, or the scan bound was reached)."""
    specs: dict[str, Any] = {}
    memo: dict = {}
    digests: dict[tuple, str] = {}  # many triggers of a page run one task
    decided: list[tuple[DueRow, Decision]] = []
    scan_bound = page_size * SCAN_PAGES_PER_ROUND
    after: tuple | None = None
    while True:
        need = page_size - len(decided)
        raw_rows = read_page(conn, now_ms, need, after)
        outcome.scanned += len(raw_rows)
        for raw in raw_rows:
            row = None
            try:
                row = due_row(raw, specs)
                provider = providers.get(row.head.kind)
                if provider is None:
                    holds.undecidable(RoundEvent.UNKNOWN_TRIGGER_KIND, row, LookupError(
                        f"no loaded plugin provides trigger kind {row.head.kind!r}"))
                    continue
                row.provider = _MemoProvider(provider, memo, raw["spec_json"])
                decision = decide(row.head, row.cursor, now_ms, row.provider)
                if decision.kind is DecisionKind.NOT_DUE:
                    continue
                if decision.scheduled_for_ms is not None:
                    key = (row.head.project_id, row.head.task_id, row.task_revision,
                           row.task_digest, row.executor)
                    digest = digests.get(key)
                    if digest is None:
                        digest = digests[key] = execution_digest(row)
                    row.execution_digest = digest
                decided.append((row, decision))
            except Exception as exc:  # one trigger's failure never stops the round
                holds.undecidable(RoundEvent.DECIDE_FAILED, row, exc)
        if len(raw_rows) < need:
            return decided, False
        if len(decided) >= page_size or outcome.scanned >= scan_bound:
            return decided, True
        after = keyset_of(raw_rows[-1])


def pinned_execution_digest(project_id: str, task_id: str, task_revision: int,
                            task_digest: str, executor: str = DEFAULT_EXECUTOR) -> str:
    """The digest of a task revision's execution by ``executor``: what an admitted Run's
    Attempt records, and what recovery checks it against."""
    return content_digest({
        "executor": executor, "project_id": project_id, "task_id": task_id,
        "task_revision": task_revision, "task_digest": task_digest,
    })


def execution_digest(row: DueRow) -> str:
    """The digest of the execution an admitted occurrence pins (by the executor its task names)."""
    return pinned_execution_digest(row.head.project_id, row.head.task_id, row.task_revision,
                                   row.task_digest, row.executor)
