"""The bounded scheduler round: scan one page, decide outside any transaction, commit the page at once.

The whole round runs as one function on the connection's thread (one thread hop per round, not one
per statement: see ``store.py``):

1. read ONE page of uninitialized, then due schedules (:func:`~.scheduler_read.read_page`),
   oldest cursor first (stepping past rows that cannot be decided, by keyset, at most
   :data:`~.scheduler_read.SCAN_PAGES_PER_ROUND` pages of rows in all);
2. decide every row with the contract's :func:`~qinglong.contracts.decision.decide`, no
   transaction open, so cron maths never holds the write lock (:mod:`.scheduler_read`: reading
   and deciding);
3. commit (:mod:`.scheduler_write`: writing) the page's decisions in ONE transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), each
   occurrence whole or not at all: a compare-and-set on the schedule row (revision, state
   version and cursor as decided) plus, for an admission, the Run, its Attempt and the
   ``run.created``/``run.queued`` events, plus the skipped range of a misfire. A miss (the trigger
   was republished meanwhile, or an admission's task was: its Run would pin a task revision that
   is no longer current) is found before that occurrence writes anything, is reported, and the
   rest of the page commits; the next round decides the missed row again. A write that fails
   part-way through an occurrence (a constraint, the store) rolls the transaction back, and the
   page is written again with a SAVEPOINT per occurrence, so that only the failing occurrence is
   undone (:func:`~.scheduler_write.write_page_at_once`). One commit (one WAL sync) per
   page instead of one per occurrence is what lets a burst drain at the store's page rate; the
   page reads each task head once and draws its Run and Attempt ids under one random prefix
   (:class:`~.scheduler_write.PageTransaction`), so its COMMIT writes a few index pages, not a few per occurrence.

A ``fire`` may leave the cursor still due (a backlog inside the grace window), and so may an
``initialize`` (it counts from the revision's publish time, so an occurrence between the publish
and this round is owed); that row is decided again within the round, at most
:data:`~.scheduler_write.BACKLOG_FIRES_PER_ROW` times, so a backlog drains without one trigger taking the whole
round. A crash at any point leaves the page (so every occurrence) wholly committed or not at all, and the
compare-and-set means a restarted round can never admit it twice.

A row that cannot be decided (its kind's plugin is not loaded, its provider raises) or whose
commit is refused by a constraint is *held*: this process remembers its (trigger, revision) for a
while (:class:`~.scheduler_holds.HeldSchedules`), reports it once, and the scan steps past it, within the round by
a keyset and in later rounds through a TEMP table the page query excludes. A failure of the store
itself (disk full, read-only, I/O) ends the page's writes instead (every other write would fail
the same way): what was written before it is committed if the transaction is still open, and
nothing is counted unless the COMMIT succeeded. ``more_due`` (start the next round at once) is set only by a round that made
progress, so a store that cannot be written, or a page of undecidable rows, never spins.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, Callable, Mapping

from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.records import Decision, RoundReport

from .queries import query
from .scheduler_holds import HeldSchedules, RoundHolds, report_store_failure
from .scheduler_read import DueRow, RoundOutcome, decide_page
from .scheduler_write import count_written, is_store_failure, write_page_at_once

#: A test seam: called on the connection's thread after every decision of the page was made and
#: before the page transaction begins, to change the database between decision and commit.
BeforeCommit = Callable[[sqlite3.Connection], None]


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
    holds = RoundHolds(held, conn, now_ms, outcome)
    decided, unread = decide_page(conn, now_ms, page_size, providers, outcome, holds)

    if before_commit is not None:
        before_commit(conn)

    written: list[tuple[DueRow, Decision]] = []  # counted once the page commits
    refused: list[tuple[str, DueRow, BaseException]] = []  # held once the page transaction ended
    backlog_left = False
    store_failed = False
    if decided:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            store_failed = True
            report_store_failure(outcome, held, decided[0][0], exc, now_ms, path)
    if decided and not store_failed:
        try:
            backlog_left, failure = write_page_at_once(conn, decided, now_ms, outcome, written,
                                                        refused)
            if failure is not None:
                store_failed = True
                report_store_failure(outcome, held, failure[0], failure[1], now_ms, path)
                if not conn.in_transaction:  # SQLite rolled the whole page back itself
                    written.clear()
            if conn.in_transaction:
                conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not is_store_failure(exc):
                raise
            if not store_failed:
                store_failed = True
                report_store_failure(outcome, held, written[-1][0] if written else decided[-1][0],
                                      exc, now_ms, path)
            written.clear()
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    for code, row, exc in refused:
        holds.undecidable(code, row, exc)
    for row, decision in written:
        count_written(outcome, decision, row, now_ms)
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


def _record_first_round(conn: sqlite3.Connection, now_ms: int) -> None:
    """On the store's thread (autocommit): this scheduler's first round, for the lag figures."""
    conn.execute(query("record_first_round"), {"now": now_ms})


async def run_round(store: Any, clock_ms: Callable[[], int], page_size: int,
                    providers: Mapping[str, TriggerProvider], diagnostics: Any,
                    held: HeldSchedules, before_commit: BeforeCommit | None = None) -> RoundReport:
    """Observe the clock once, run the page on the store's thread, emit its diagnostics here.
    ``held`` is the backend's memory of held schedules, which outlives the round."""
    started = time.monotonic()
    now_ms = clock_ms()
    lock = getattr(store, "owner_lock", None)
    if lock is not None and lock.held and lock.first_round_ms is None:
        # occurrences due before a scheduler's first round are its catch-up: one write per start
        await store.call(_record_first_round, now_ms)
        lock.first_round_ms = now_ms
    outcome = await store.call(run_page, now_ms, page_size, providers, before_commit,
                               held, str(getattr(store, "path", "")))
    for event in outcome.diagnostics:
        try:
            diagnostics.emit(event)
        except Exception:  # a sink must not raise; if it does, the round still reports
            pass
    return outcome.report(int((time.monotonic() - started) * 1000))
