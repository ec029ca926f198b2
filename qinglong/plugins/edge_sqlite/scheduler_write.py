"""The scheduler round's writing (step 3 of :mod:`.scheduler`): a page of decisions committed in
ONE transaction, each occurrence whole or not at all: a compare-and-set on the schedule row plus,
for an admission, the Run, its Attempt and its two events, plus the skipped range of a misfire.
"""

from __future__ import annotations

import sqlite3
from functools import lru_cache

from qinglong.contracts.decision import decide
from qinglong.contracts.diagnostics import DiagnosticEvent, RoundEvent
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.records import (
    PAGE_ID_SERIALS,
    Decision,
    DecisionKind,
    ScheduleCursor,
    page_id_base,
)

from .queries import query
from .scheduler_read import DueRow, RoundOutcome, execution_digest, row_fields

#: How many on-time backlog occurrences one trigger may admit in one round.
BACKLOG_FIRES_PER_ROW = 64

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
    return query(name)


def write_occurrence(conn: sqlite3.Connection, row: DueRow, decision: Decision,
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
            decision.jitter_ms,
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


def _in_savepoint(conn: sqlite3.Connection, row: DueRow, decision: Decision,
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


def count_written(outcome: RoundOutcome, decision: Decision, row: DueRow, now_ms: int) -> None:
    if decision.kind is DecisionKind.INITIALIZE:
        outcome.initialized += 1
    if decision.scheduled_for_ms is not None:
        outcome.admitted += 1
        outcome.admission_lags_ms.append(max(0, now_ms - decision.scheduled_for_ms))
    if decision.skipped is not None:  # one per skip record written (see RoundReport)
        outcome.skipped += 1
        outcome.skipped_policies.append(row.head.misfire_policy.value)


def is_store_failure(exc: BaseException) -> bool:
    """True for a failure of the store itself (full, read-only, I/O, busy, damaged): every other
    commit of the round would fail alike. A constraint refusing one row is that row's failure."""
    return isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError)


def write_page_at_once(conn: sqlite3.Connection, decided: list[tuple[DueRow, Decision]],
                        now_ms: int, outcome: RoundOutcome, written: list,
                        refused: list) -> tuple[bool, tuple[DueRow, BaseException] | None]:
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
        if not is_store_failure(exc):
            raise
        return False, (decided[0][0], exc)
    return _write_page(conn, decided, now_ms, outcome, written, refused, guarded=True)


def _write_page(conn: sqlite3.Connection, decided: list[tuple[DueRow, Decision]], now_ms: int,
                outcome: RoundOutcome, written: list, refused: list,
                guarded: bool = True) -> tuple[bool, tuple[DueRow, BaseException] | None]:
    """Write a page of decisions inside the open page transaction, each occurrence under its own
    SAVEPOINT (``guarded``) and compare-and-set. Appends what was written to ``written`` and the
    rows a constraint or a decision refused to ``refused``; a CAS miss is counted and reported and
    the rest of the page goes on. Returns whether a backlog was left and, when the store itself
    failed (every later write would fail alike, so the page stops there), the row and the error.
    Unguarded, a failing write raises (see :func:`write_page_at_once`)."""
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
                    if is_store_failure(exc):
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
                        row_fields(row, None)))
                break
            written.append((row, decision))
            if (decision.kind not in (DecisionKind.FIRE, DecisionKind.INITIALIZE)
                    or decision.next_fire_at_ms > now_ms):
                break
            # The cursor is still due (a backlog inside the grace window, or an occurrence between
            # the publish and this round after an initialization): decide it again.
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
