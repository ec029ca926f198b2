"""The bounded scheduler round: scan one page, decide outside any transaction, commit the page at once.

The whole round runs as one function on the connection's thread (one thread hop per round, not one
per statement: see ``store.py``):

1. read ONE page of uninitialised, then due schedules (:func:`read_page`), oldest cursor first
   (stepping past rows that cannot be decided, by keyset, at most :data:`SCAN_PAGES_PER_ROUND`
   pages of rows in all);
2. decide every row with the contract's :func:`~qinglong.contracts.decision.decide`, no
   transaction open, so cron maths never holds the write lock;
3. commit the page's decisions in ONE transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), each
   occurrence whole or not at all: a compare-and-set on the schedule row (revision, state
   version and cursor as decided) plus, for an admission, the Run, its Attempt and the
   ``run.created``/``run.queued`` events, plus the skipped range of a misfire. A miss (the trigger
   was republished meanwhile, or an admission's task was: its Run would pin a task revision that
   is no longer current) is found before that occurrence writes anything, is reported, and the
   rest of the page commits; the next round decides the missed row again. A write that fails
   part-way through an occurrence (a constraint, the store) rolls the transaction back, and the
   page is written again with a SAVEPOINT per occurrence, so that only the failing occurrence is
   undone (:func:`_write_page_at_once`). One commit (one WAL sync) per
   page instead of one per occurrence is what lets a burst drain at the store's page rate; the
   page reads each task head once and draws its Run and Attempt ids under one random prefix
   (:class:`PageTransaction`), so its COMMIT writes a few index pages, not a few per occurrence.

A ``fire`` may leave the cursor still due (a backlog inside the grace window), and so may an
``initialize`` (it counts from the revision's publish time, so an occurrence between the publish
and this round is owed); that row is decided again within the round, at most
:data:`BACKLOG_FIRES_PER_ROW` times, so a backlog drains without one trigger taking the whole
round. A crash at any point leaves the page (so every occurrence) wholly committed or not at all, and the
compare-and-set means a restarted round can never admit it twice.

A row that cannot be decided (its kind's plugin is not loaded, its provider raises) or whose
commit is refused by a constraint is *held*: this process remembers its (trigger, revision) for a
while (:class:`HeldSchedules`), reports it once, and the scan steps past it, within the round by
a keyset and in later rounds through a TEMP table the page query excludes. A failure of the store
itself (disk full, read-only, I/O) ends the page's writes instead (every other write would fail
the same way): what was written before it is committed if the transaction is still open, and
nothing is counted unless the COMMIT succeeded. ``more_due`` (start the next round at once) is set only by a round that made
progress, so a store that cannot be written, or a page of undecidable rows, never spins.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping

from qinglong.contracts.decision import decide
from qinglong.contracts.diagnostics import DiagnosticEvent, RoundEvent
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.records import (
    PAGE_ID_SERIALS,
    Decision,
    DecisionKind,
    MisfirePolicy,
    RoundReport,
    RoundTally,
    ScheduleCursor,
    TriggerHead,
    content_digest,
    page_id_base,
)

from .queries import q
from .store import named_cursor, translate_sqlite_error

#: How many on-time backlog occurrences one trigger may admit in one round.
BACKLOG_FIRES_PER_ROW = 64

#: Bound of the per-round occurrence memo (see :class:`_MemoProvider`).
_MEMO_BOUND = 4096

#: How many rows one round may read past undecidable ones, in pages of ``page_size``: a round
#: steps past a wall of held-worthy rows this many rows at a time, never unboundedly.
SCAN_PAGES_PER_ROUND = 64

#: How long an undecidable (trigger, revision) is first held; each further failure doubles it up
#: to :data:`HOLD_MAX_MS`. Publishing a new revision ends a hold at once (the pair changes).
HOLD_FIRST_MS = 60_000
HOLD_MAX_MS = 15 * 60_000

#: How many pairs the memory keeps (held or recently released); past it, new ones are not held.
HOLD_BOUND = 65_536

#: How many held rows one round reports one by one; the rest are summarised in one event.
DIAGNOSTICS_PER_ROUND = 10

#: How often a persisting store failure (disk full, read-only) is reported, at most.
STORE_FAILURE_REPORT_MS = 60_000

#: The keyset before every row: below every cursor and every identifier.
_KEYSET_START = (-(2 ** 63), "", "")

#: The executor an Attempt is claimed for when its task's payload names none.
DEFAULT_EXECUTOR = "local_process"

#: A test seam: called on the connection's thread after every decision of the page was made and
#: before the page transaction begins, to change the database between decision and commit.
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
    executor: str = DEFAULT_EXECUTOR


@dataclass(slots=True)
class RoundOutcome(RoundTally):
    """The contract's round counters plus the diagnostics of one round, built on the connection's
    thread and emitted on the event loop (``claimed`` stays 0: SQLite has no claims)."""

    diagnostics: list[DiagnosticEvent] = field(default_factory=list)


def _due_row(row: sqlite3.Row, specs: dict) -> _DueRow:
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
        content_digest=row["trigger_digest"])
    cursor = ScheduleCursor(
        trigger_revision=row["trigger_revision"], next_fire_at_ms=row["next_fire_at_ms"],
        last_scheduled_at_ms=row["last_scheduled_at_ms"], state_version=row["state_version"],
        published_at_ms=row["published_at_ms"])
    return _DueRow(head, cursor, row["task_revision"], row["task_digest"],
                   executor=row["executor"])


@dataclass(slots=True)
class _Hold:
    """One remembered pair: held (excluded from the scan) until ``until_ms`` while ``active``;
    once released, remembered for another ``hold_ms`` so a repeat is not reported again."""

    until_ms: int
    hold_ms: int
    active: bool = True


class HeldSchedules:
    """This process's memory of schedules that cannot be decided or committed, for a bounded time.

    Keyed by (trigger_id, trigger_revision): a new revision is a new pair, so republishing a
    trigger ends its hold at once. An active hold is mirrored in the connection's TEMP table
    ``scheduler_held``, which the page queries exclude, so a wall of undecidable rows at the front
    of the due index costs a round an index walk, not a page. When a hold expires the row is
    decided again; failing again holds it for twice as long (up to :data:`HOLD_MAX_MS`) without a
    new per-trigger diagnostic: each pair is reported once while it is remembered. A released pair
    is forgotten one hold period after it expired.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], _Hold] = {}
        self._store_failure_reported_at: int | None = None
        self._store_failures_unreported = 0

    def __len__(self) -> int:
        return sum(1 for hold in self._entries.values() if hold.active)

    def is_held(self, trigger_id: str, revision: int) -> bool:
        """True while (trigger_id, revision) is held (for tests and status)."""
        hold = self._entries.get((trigger_id, revision))
        return hold is not None and hold.active

    def sync(self, conn: sqlite3.Connection, now_ms: int) -> None:
        """Make the TEMP table match this memory: create it on a new connection (forgetting every
        hold, which lived in the old one), release expired holds, forget old released pairs."""
        if conn.execute(q("held_table_exists")).fetchone() is None:
            # Before the first TEMP object: keep it in memory, never in a temp file on the flash.
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute(q("create_held_table"))
            self._entries.clear()
        released = []
        for key, hold in list(self._entries.items()):
            # A clock that stepped back must not stretch a hold: one longer than its period ends.
            if hold.active and (hold.until_ms <= now_ms or hold.until_ms - now_ms > hold.hold_ms):
                hold.active = False
                hold.until_ms = min(hold.until_ms, now_ms)
                released.append(key)
            elif not hold.active and not now_ms - hold.hold_ms < hold.until_ms <= now_ms:
                del self._entries[key]
        if released:
            conn.executemany(q("delete_held"), released)

    def hold(self, conn: sqlite3.Connection, trigger_id: str, revision: int, now_ms: int) -> bool | None:
        """Hold a pair. True if it is newly reported, False if it was reported before (a repeat
        after its hold expired), None if the memory is full (not held; reported every time)."""
        key = (trigger_id, revision)
        hold = self._entries.get(key)
        if hold is None:
            if len(self._entries) >= HOLD_BOUND:
                self._forget_released()
                if len(self._entries) >= HOLD_BOUND:
                    return None
            self._entries[key] = _Hold(now_ms + HOLD_FIRST_MS, HOLD_FIRST_MS)
            conn.execute(q("insert_held"), key)
            return True
        if not hold.active:
            hold.hold_ms = min(hold.hold_ms * 2, HOLD_MAX_MS)
        hold.until_ms = now_ms + hold.hold_ms
        hold.active = True
        conn.execute(q("insert_held"), key)
        return False

    def _forget_released(self) -> None:
        for key in [k for k, hold in self._entries.items() if not hold.active]:
            del self._entries[key]

    def store_failure_due_for_report(self, now_ms: int) -> int | None:
        """Rate-limit reports of a failing store: the number of failures since the last report
        when one is due now, else None (and this failure is counted for the next)."""
        last = self._store_failure_reported_at
        if last is None or now_ms - last >= STORE_FAILURE_REPORT_MS or now_ms < last:
            count = self._store_failures_unreported + 1
            self._store_failure_reported_at = now_ms
            self._store_failures_unreported = 0
            return count
        self._store_failures_unreported += 1
        return None

    def store_recovered(self) -> None:
        """A commit succeeded: the next store failure is reported at once."""
        self._store_failure_reported_at = None
        self._store_failures_unreported = 0


def _fields(row: _DueRow | None, exc: BaseException | None) -> dict[str, Any]:
    fields: dict[str, Any] = {} if exc is None else {"error": type(exc).__name__}
    if row is not None:
        fields.update(project_id=row.head.project_id, trigger_id=row.head.trigger_id,
                      trigger_revision=row.head.trigger_revision, kind=row.head.kind)
    return fields


class _RoundHolds:
    """Holds made during one round, and their bounded reporting."""

    __slots__ = ("held", "conn", "now_ms", "outcome", "new", "repeated", "unheld", "reported")

    def __init__(self, held: HeldSchedules, conn: sqlite3.Connection, now_ms: int,
                 outcome: "RoundOutcome") -> None:
        self.held, self.conn, self.now_ms, self.outcome = held, conn, now_ms, outcome
        self.new = self.repeated = self.unheld = self.reported = 0

    def undecidable(self, code: str, row: _DueRow | None, exc: BaseException) -> None:
        """Count an error, hold the row's pair, report it unless reported before or over budget."""
        self.outcome.errors += 1
        state: bool | None = None
        if row is not None:
            state = self.held.hold(self.conn, row.head.trigger_id, row.head.trigger_revision,
                                   self.now_ms)
        if state is False:
            self.repeated += 1
            return
        if state is True:
            self.new += 1
        else:
            self.unheld += 1
        if self.reported < DIAGNOSTICS_PER_ROUND:
            self.reported += 1
            fields = _fields(row, exc)
            if state:
                fields["held_ms"] = HOLD_FIRST_MS
            self.outcome.diagnostics.append(DiagnosticEvent("error", code, str(exc)[:300], fields))

    def summarise(self) -> None:
        """One event for what was held but not reported one by one this round."""
        unreported = self.new + self.unheld - self.reported
        if unreported <= 0 and not self.repeated:
            return
        self.outcome.diagnostics.append(DiagnosticEvent(
            "error", "scheduler.undecidable_held",
            f"{unreported} more schedule(s) could not be decided or committed this round and "
            f"{self.repeated} reported before still cannot; they are held (skipped by the scan) "
            f"for {HOLD_FIRST_MS // 1000} s or more, then tried again",
            {"unreported": unreported, "repeated": self.repeated, "not_held": self.unheld,
             "held_total": len(self.held)},
        ))


#: :func:`write_occurrence`'s outcomes besides success.
CAS_MISS = "cas_miss"
TASK_CHANGED = "task_changed"


class PageTransaction:
    """What one page transaction reads or draws once for all its occurrences.

    * Task head revisions: the page transaction holds SQLite's write lock from ``BEGIN IMMEDIATE``
      to ``COMMIT``, and the scheduler writes no task, so a task's head read once inside it is its
      head for every occurrence of the page (a republish is seen by the next page).
    * Run and Attempt ids: fresh random (version 4) UUIDs, as 32 hex digits, that differ only in
      their last 16 bits within a page, in order. A page's Runs then sit side by side in the
      ``runs`` primary key and in the ``run_id`` indexes of ``attempts`` and ``run_events`` (a few
      leaf pages, not one leaf page each), so its COMMIT writes a few pages of each index to the
      WAL instead of one per occurrence. Unique: the 106 random bits are drawn afresh for every
      page (and after every 65,536 ids), the serial fills the last 16.
    """

    __slots__ = ("_task_revisions", "_run_base", "_attempt_base", "_serial")

    def __init__(self) -> None:
        self._task_revisions: dict[tuple[str, str], int | None] = {}
        self._serial = PAGE_ID_SERIALS

    def task_revision(self, conn: sqlite3.Connection, project_id: str, task_id: str) -> int | None:
        """The head revision of the task inside this transaction (None: no such task)."""
        key = (project_id, task_id)
        try:
            return self._task_revisions[key]
        except KeyError:
            pass
        found = conn.execute(_sql("task_head_revision"), key).fetchone()
        revision = self._task_revisions[key] = None if found is None else found[0]
        return revision

    def ids(self) -> tuple[str, str]:
        """A new (run id, attempt id) pair."""
        if self._serial >= PAGE_ID_SERIALS:
            self._run_base = page_id_base()
            self._attempt_base = page_id_base()
            self._serial = 0
        serial = self._serial
        self._serial = serial + 1
        return f"{self._run_base | serial:032x}", f"{self._attempt_base | serial:032x}"


@lru_cache(maxsize=None)
def _sql(name: str) -> str:
    """The SQL of block ``name``, looked up once per process (a page runs each block per row)."""
    return q(name)


def write_occurrence(conn: sqlite3.Connection, row: _DueRow, decision: Decision,
                     now_ms: int, page: PageTransaction | None = None) -> bool | str:
    """Write one decision inside the page's open transaction (the caller either wraps it in its
    own SAVEPOINT, or rolls the whole transaction back if it raises: a write that fails leaves part
    of the occurrence written). True when written; :data:`CAS_MISS`
    when the schedule changed since the decision, :data:`TASK_CHANGED` when an admission's task was
    republished since the page was read (the Run would pin a task revision that is no longer
    current). A miss is always found before the first write (the task head is read, the CAS is the
    first write and changes no row when it misses), so a miss leaves nothing to undo.
    ``page`` is what the page transaction shares between its occurrences (a new one for this
    occurrence alone when None)."""
    if page is None:
        page = PageTransaction()
    head = row.head
    scheduled = decision.scheduled_for_ms
    if scheduled is not None:
        if page.task_revision(conn, head.project_id, head.task_id) != row.task_revision:
            return TASK_CHANGED
    changed = conn.execute(_sql("advance_schedule"), {
        "next": decision.next_fire_at_ms, "scheduled": scheduled, "now": now_ms,
        "trigger_id": head.trigger_id, "revision": decision.trigger_revision,
        "state_version": row.cursor.state_version, "expected": decision.expected_next_fire_at_ms,
    }).rowcount
    if changed != 1:
        return CAS_MISS
    if scheduled is not None:
        # Identity is allocated only now, when the occurrence is certainly admitted.
        run_id, attempt_id = page.ids()
        conn.execute(_sql("insert_run"), (
            run_id, head.project_id, head.trigger_id, head.trigger_revision, head.task_id,
            row.task_revision, row.task_digest, scheduled, now_ms, now_ms,
            idempotency_key(head.trigger_id, head.trigger_revision, scheduled, head.kind),
        ))
        conn.execute(_sql("insert_attempt"), {
            "attempt_id": attempt_id, "run_id": run_id, "executor": row.executor,
            "digest": row.execution_digest, "now": now_ms})
        conn.execute(_sql("insert_run_events"), (run_id, now_ms))
    skipped = decision.skipped
    if skipped is not None:
        conn.execute(_sql("insert_schedule_skip"), (
            head.project_id, head.trigger_id, head.trigger_revision, head.misfire_policy.value,
            skipped.first_ms, skipped.last_ms, skipped.count, int(skipped.count_exact), now_ms,
        ))
    return True


def _in_savepoint(conn: sqlite3.Connection, row: _DueRow, decision: Decision,
                  now_ms: int, page: PageTransaction) -> bool | str:
    """:func:`write_occurrence` under its own SAVEPOINT: the occurrence's Run, Attempt, events,
    skip record and cursor advance stay in the page transaction together or not at all. Raises
    what the write raised, after undoing the occurrence (if the transaction is still open)."""
    conn.execute("SAVEPOINT occurrence")
    try:
        ok = write_occurrence(conn, row, decision, now_ms, page)
    except BaseException:
        if conn.in_transaction:  # a store failure may have rolled the whole transaction back
            conn.execute("ROLLBACK TO occurrence")
            conn.execute("RELEASE occurrence")
        raise
    if ok is not True:
        conn.execute("ROLLBACK TO occurrence")
    conn.execute("RELEASE occurrence")
    return ok


def _count(outcome: RoundOutcome, decision: Decision, row: _DueRow, now_ms: int) -> None:
    if decision.kind is DecisionKind.INITIALIZE:
        outcome.initialized += 1
    if decision.scheduled_for_ms is not None:
        outcome.admitted += 1
        outcome.admission_lags_ms.append(max(0, now_ms - decision.scheduled_for_ms))
    if decision.skipped is not None:  # one per skip record written (see RoundReport)
        outcome.skipped += 1
        outcome.skipped_policies.append(row.head.misfire_policy.value)


def read_page(conn: sqlite3.Connection, now_ms: int, page_size: int,
              after: tuple | None = None) -> list[sqlite3.Row]:
    """ONE page in due-scan order: ``next_fire_at_ms NULLS FIRST, project_id, trigger_id``,
    starting after the keyset ``after`` (a previous page's last row, from :func:`keyset_of`).

    Two index range scans (uninitialised, then due) instead of one ``IS NULL OR <=`` predicate,
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
            rows = cur.execute(q("claim_uninitialised_page"), {
                "page": page_size, "after_project": project, "after_trigger": trigger}).fetchall()
            after = _KEYSET_START
        if len(rows) < page_size:
            rows += cur.execute(q("claim_due_page"), {
                "now": now_ms, "page": page_size - len(rows), "after_next": after[0],
                "after_project": after[1], "after_trigger": after[2]}).fetchall()
    finally:
        cur.close()
    return rows


def keyset_of(raw: sqlite3.Row) -> tuple:
    """The scan position of a page row: (next_fire_at_ms or None, project_id, trigger_id)."""
    return (raw["next_fire_at_ms"], raw["project_id"], raw["trigger_id"])


def _store_failure(exc: BaseException) -> bool:
    """True for a failure of the store itself (full, read-only, I/O, busy, damaged): every other
    commit of the round would fail alike. A constraint refusing one row is that row's failure."""
    return isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError)


def _decide_page(conn: sqlite3.Connection, now_ms: int, page_size: int,
                 providers: Mapping[str, TriggerProvider], outcome: RoundOutcome,
                 holds: _RoundHolds) -> tuple[list[tuple[_DueRow, Decision]], bool]:
    """Read and decide up to one page of decidable rows, stepping past undecidable ones (held) by
    keyset, reading at most :data:`SCAN_PAGES_PER_ROUND` pages. Returns the decisions and whether
    rows may remain unread (the page filled, or the scan bound was reached)."""
    specs: dict[str, Any] = {}
    memo: dict = {}
    digests: dict[tuple, str] = {}  # many triggers of a page run one task
    decided: list[tuple[_DueRow, Decision]] = []
    scan_bound = page_size * SCAN_PAGES_PER_ROUND
    after: tuple | None = None
    while True:
        need = page_size - len(decided)
        raw_rows = read_page(conn, now_ms, need, after)
        outcome.scanned += len(raw_rows)
        for raw in raw_rows:
            row = None
            try:
                row = _due_row(raw, specs)
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


def execution_digest(row: _DueRow) -> str:
    """The digest of the execution an admitted occurrence pins (by the executor its task names)."""
    return pinned_execution_digest(row.head.project_id, row.head.task_id, row.task_revision,
                                   row.task_digest, row.executor)


def run_page(conn: sqlite3.Connection, now_ms: int, page_size: int,
             providers: Mapping[str, TriggerProvider],
             before_commit: BeforeCommit | None = None,
             held: HeldSchedules | None = None, path: str = "") -> RoundOutcome:
    """One round on the connection's thread. Never raises for one occurrence's failure.

    ``held`` is the process's memory of undecidable schedules (a fresh one when None); ``path``
    names the database in a store failure's diagnostic.
    """
    outcome = RoundOutcome()
    if held is None:
        held = HeldSchedules()
    held.sync(conn, now_ms)
    holds = _RoundHolds(held, conn, now_ms, outcome)
    decided, unread = _decide_page(conn, now_ms, page_size, providers, outcome, holds)

    if before_commit is not None:
        before_commit(conn)

    written: list[tuple[_DueRow, Decision]] = []  # counted once the page commits
    refused: list[tuple[str, _DueRow, BaseException]] = []  # held once the page transaction ended
    backlog_left = False
    store_failed = False
    if decided:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            if not _store_failure(exc):
                raise
            store_failed = True
            _report_store_failure(outcome, held, decided[0][0], exc, now_ms, path)
    if decided and not store_failed:
        try:
            backlog_left, failure = _write_page_at_once(conn, decided, now_ms, outcome, written,
                                                        refused)
            if failure is not None:
                store_failed = True
                _report_store_failure(outcome, held, failure[0], failure[1], now_ms, path)
                if not conn.in_transaction:  # SQLite rolled the whole page back itself
                    written.clear()
            if conn.in_transaction:
                conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not _store_failure(exc):
                raise
            if not store_failed:
                store_failed = True
                _report_store_failure(outcome, held, written[-1][0] if written else decided[-1][0],
                                      exc, now_ms, path)
            written.clear()
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    for code, row, exc in refused:
        holds.undecidable(code, row, exc)
    for row, decision in written:
        _count(outcome, decision, row, now_ms)
    committed = len(written)
    if committed:
        held.store_recovered()
    holds.summarise()
    # Start the next round at once only after progress: rows committed, or undecidable rows
    # (newly or again) held, so the next scan starts past them. A pair is held at most once per
    # hold period, so this cannot spin; a round that changed nothing must wait its cadence.
    progress = committed > 0 or holds.new > 0 or holds.repeated > 0
    outcome.more_due = progress and not store_failed and (unread or backlog_left)
    return outcome


def _write_page_at_once(conn: sqlite3.Connection, decided: list[tuple[_DueRow, Decision]],
                        now_ms: int, outcome: RoundOutcome, written: list,
                        refused: list) -> tuple[bool, tuple[_DueRow, BaseException] | None]:
    """Write a page of decisions inside the open page transaction: first without a SAVEPOINT per
    occurrence, and, only if a write fails, again from the start with one each.

    A miss (compare-and-set or task head) is found before its occurrence's first write, so a page
    whose writes all succeed needs no savepoint: it commits exactly what the savepoints would have
    kept. A savepoint costs an occurrence about a fifth of its CPU (SQLite copies every page it
    touches to the statement journal first). A write that fails (a constraint, the store) leaves
    part of an occurrence written, so the whole transaction is rolled back, the rows' cursors and
    the round's counters are put back as the decisions left them, and the page is written again
    under :func:`_write_page` in a new transaction, where each occurrence keeps or undoes itself
    alone. Returns what :func:`_write_page` returns.
    """
    saved = [(row, row.cursor) for row, _ in decided]
    misses, diagnostics = outcome.cas_misses, len(outcome.diagnostics)
    try:
        return _write_page(conn, decided, now_ms, outcome, written, refused, guarded=False)
    except Exception:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    for row, cursor in saved:
        row.cursor = cursor
    outcome.cas_misses = misses
    del outcome.diagnostics[diagnostics:]
    written.clear()
    refused.clear()
    try:
        conn.execute("BEGIN IMMEDIATE")
    except Exception as exc:
        if not _store_failure(exc):
            raise
        return False, (decided[0][0], exc)
    return _write_page(conn, decided, now_ms, outcome, written, refused, guarded=True)


def _write_page(conn: sqlite3.Connection, decided: list[tuple[_DueRow, Decision]], now_ms: int,
                outcome: RoundOutcome, written: list, refused: list,
                guarded: bool = True) -> tuple[bool, tuple[_DueRow, BaseException] | None]:
    """Write a page of decisions inside the open page transaction, each occurrence under its own
    SAVEPOINT (``guarded``) and compare-and-set. Appends what was written to ``written`` and the
    rows a constraint or a decision refused to ``refused``; a CAS miss is counted and reported and
    the rest of the page goes on. Returns whether a backlog was left and, when the store itself
    failed (every later write would fail alike, so the page stops there), the row and the error.
    Unguarded, a failing write raises (see :func:`_write_page_at_once`)."""
    backlog_left = False
    page = PageTransaction()
    for row, decision in decided:
        for _ in range(BACKLOG_FIRES_PER_ROW):
            if not guarded:
                ok = write_occurrence(conn, row, decision, now_ms, page)
            else:
                try:
                    ok = _in_savepoint(conn, row, decision, now_ms, page)
                except Exception as exc:
                    if _store_failure(exc):
                        return backlog_left, (row, exc)
                    refused.append((RoundEvent.COMMIT_FAILED, row, exc))
                    break
            if ok is not True:
                outcome.cas_misses += 1
                if ok == TASK_CHANGED:
                    outcome.diagnostics.append(DiagnosticEvent(
                        "info", RoundEvent.TASK_CHANGED,
                        f"task {row.head.task_id!r} of trigger {row.head.trigger_id!r} was "
                        "republished since the round read it; decided again next round",
                        _fields(row, None)))
                break
            written.append((row, decision))
            if (decision.kind not in (DecisionKind.FIRE, DecisionKind.INITIALIZE)
                    or decision.next_fire_at_ms > now_ms):
                break
            # The cursor is still due (a backlog inside the grace window, or an occurrence between
            # the publish and this round after an initialisation): decide it again.
            row.cursor = ScheduleCursor(decision.trigger_revision, decision.next_fire_at_ms,
                                        decision.scheduled_for_ms
                                        if decision.scheduled_for_ms is not None
                                        else row.cursor.last_scheduled_at_ms,
                                        row.cursor.state_version + 1, row.cursor.published_at_ms)
            try:
                decision = decide(row.head, row.cursor, now_ms, row.provider)
                if decision.scheduled_for_ms is not None and not row.execution_digest:
                    row.execution_digest = execution_digest(row)
            except Exception as exc:
                refused.append((RoundEvent.DECIDE_FAILED, row, exc))
                break
            if decision.kind is DecisionKind.NOT_DUE:
                break
        else:
            backlog_left = True
    return backlog_left, None


def _report_store_failure(outcome: RoundOutcome, held: HeldSchedules, row: _DueRow,
                          exc: BaseException, now_ms: int, path: str) -> None:
    outcome.errors += 1
    count = held.store_failure_due_for_report(now_ms)
    if count is None:
        return
    message = str(exc)
    if path:
        try:
            message = str(translate_sqlite_error(exc, path))
        except Exception:  # the message is best effort; the failure is reported either way
            pass
    fields = _fields(row, exc)
    fields["failures_since_last_report"] = count
    outcome.diagnostics.append(DiagnosticEvent(
        "error", "scheduler.store_failed",
        f"the round stopped committing: {message[:300]}", fields))


async def run_round(store: Any, clock_ms: Callable[[], int], page_size: int,
                    providers: Mapping[str, TriggerProvider], diagnostics: Any,
                    held: HeldSchedules, before_commit: BeforeCommit | None = None) -> RoundReport:
    """Observe the clock once, run the page on the store's thread, emit its diagnostics here.
    ``held`` is the backend's memory of held schedules, which outlives the round."""
    started = time.monotonic()
    now_ms = clock_ms()
    outcome = await store.call(run_page, now_ms, page_size, providers, before_commit,
                               held, str(getattr(store, "path", "")))
    for event in outcome.diagnostics:
        try:
            diagnostics.emit(event)
        except Exception:  # a sink must not raise; if it does, the round still reports
            pass
    return outcome.report(int((time.monotonic() - started) * 1000))
