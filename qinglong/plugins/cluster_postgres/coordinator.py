"""One bounded coordinator round: claim, then decide and admit the claimed page.

Every replica runs the same round; there is no leader. A round claims at most
``min(claim_budget, 256)`` schedules of the kinds it has providers for, in one statement
(committed at once), then for each claim computes the decision with
:func:`qinglong.contracts.decision.decide` (outside any lock, from the claim's database-clock
observation) and commits the decisions of the whole page in one SERIALIZABLE transaction
(:func:`admission.commit_page`: each row under its own fence, the failing rows reported one by
one and handled as below).

A ``fire`` whose next cursor is already due (a backlog inside the grace window), or an
``initialize`` whose first occurrence (counted from the revision's publish time) is already due,
keeps its claim and is decided again at once (the rows that kept their claims form the next
page), at most :data:`BACKLOG_FIRES_PER_ROW` times per row
and always within the claim's lease (the fence's expiry is checked by every commit); a row that
reaches the bound with its cursor still due sets ``more_due``. So a backlog drains on the cluster
as it does on edge.

A claim that cannot be decided or committed now but could be next round is given back under the
full fence at once (``claim.release_claim``), so the occurrence is decided again next round
instead of a lease later: a decision that failed (a provider error, a revision mismatch), the task
republished between claim and commit (a legitimate race), serialization retries exhausted. A
claim lost to someone else (fence lost, CAS miss) is theirs; a refusal for corrupted inputs (a
digest that does not verify, a missing revision) is reported as an error and the claim is left
to expire, so the error repeats once a lease, not once a round.

``more_due`` is set only when the round made progress (at least one commit) and work remains
(the budget was full, or a backlog hit its bound): a page of claims that all failed is not
repeated at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import psycopg

from qinglong.contracts.decision import decide
from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink, RoundEvent
from qinglong.contracts.errors import FenceLost
from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.records import DecisionKind, RoundReport, RoundTally

from .admission import (RETRYABLE, CasMiss, PageItem, TaskChanged, after, commit_page,
                        prepare_admission)
from .claim import ClaimedSchedule, claim_due_schedules, effective_budget, release_claim
from .db import AdmissionRefused, Secrets, describe_error

#: How many decisions one claimed row may commit in one round (an initialization and a backlog of
#: on-time occurrences), as edge's ``BACKLOG_FIRES_PER_ROW``: a backlog drains without one trigger
#: taking the whole round.
BACKLOG_FIRES_PER_ROW = 64


@dataclass(slots=True)
class RoundStats(RoundTally):
    """The contract's round counters while a coordinator round runs, plus what only a leased
    round has: the claims it gave back and the admissions it made. :meth:`report` freezes them."""

    started: float = field(default_factory=time.monotonic)
    admissions: list = field(default_factory=list)

    def report(self, duration_ms: int | None = None) -> RoundReport:
        """The frozen report; a leased round's rows read are its claims."""
        self.scanned = self.claimed
        if duration_ms is None:
            duration_ms = int((time.monotonic() - self.started) * 1000)
        return RoundTally.report(self, duration_ms)


async def run_round(conn, *, owner: str, claim_budget: int, lease_ms: int,
                    providers: Mapping[str, TriggerProvider], diagnostics: DiagnosticSink,
                    retries: int, secrets: Secrets | None = None,
                    stats: RoundStats | None = None, max_queued: int | None = None) -> RoundStats:
    """Run one round on ``conn`` (autocommit) and return its counters.

    Errors of one occurrence are counted and reported to ``diagnostics``; an error of the
    connection itself propagates (the caller reports it and the next round starts afresh).
    """
    stats = stats or RoundStats()
    budget = effective_budget(claim_budget)
    await prepare_admission(conn)
    claims = await claim_due_schedules(conn, owner=owner, limit=budget, lease_ms=lease_ms,
                                       kinds=list(providers))
    stats.claimed = len(claims)
    work_remains = budget > 0 and len(claims) == budget
    progress = False
    pending: list[ClaimedSchedule] = []
    for claimed in claims:
        if claimed.head.kind in providers:
            pending.append(claimed)
            continue
        # the claim asks for our kinds only; kept as a guard
        stats.errors += 1
        released = await _give_back(conn, claimed, diagnostics, secrets, stats)
        _emit(diagnostics, "warning", RoundEvent.UNKNOWN_TRIGGER_KIND,
              f"no loaded provider for trigger kind {claimed.head.kind!r}; the claim was given back",
              trigger_id=claimed.head.trigger_id, kind=claimed.head.kind, released=released)
    for step in range(1, BACKLOG_FIRES_PER_ROW + 1):
        if not pending:
            break
        items: list[PageItem] = []
        for claimed in pending:
            head = claimed.head
            try:
                decision = decide(head, claimed.cursor, claimed.observed_at_ms, providers[head.kind])
            except Exception as exc:  # a provider bug must not stop the other occurrences
                stats.errors += 1
                released = await _give_back(conn, claimed, diagnostics, secrets, stats)
                _emit(diagnostics, "error", RoundEvent.DECIDE_FAILED,
                      describe_error(exc, secrets) + ("; claim given back" if released else ""),
                      trigger_id=head.trigger_id, released=released)
                continue
            keep = (step < BACKLOG_FIRES_PER_ROW
                    and decision.kind in (DecisionKind.FIRE, DecisionKind.INITIALIZE))
            items.append(PageItem(claimed, decision, keep))
        if not items:
            break
        page = await commit_page(conn, items, retries=retries, max_queued=max_queued)
        stats.serialization_retries += page.serialization_retries
        pending = []
        for item, outcome in zip(items, page.outcomes):
            if isinstance(outcome, BaseException):
                await _refused(conn, item.claimed, outcome, diagnostics, secrets, stats)
                continue
            progress = True
            decision = item.decision
            if outcome.admission is not None:
                stats.admitted += 1
                stats.admissions.append(outcome.admission)
                if decision.scheduled_for_ms is not None:
                    stats.admission_lags_ms.append(max(0, outcome.admitted_at_ms - decision.scheduled_for_ms))
            if decision.kind is DecisionKind.INITIALIZE:
                stats.initialized += 1
            if decision.skipped is not None:  # one per skip record written (see RoundReport)
                stats.skipped += 1
                stats.skipped_policies.append(item.claimed.head.misfire_policy.value)
            if outcome.claim_kept:
                pending.append(after(item.claimed, decision, outcome))
            elif (not item.keep_claim and decision.kind in (DecisionKind.FIRE, DecisionKind.INITIALIZE)
                  and decision.next_fire_at_ms <= outcome.admitted_at_ms):
                # at the bound with the cursor still due: the next round goes on at once
                work_remains = True
    stats.more_due = progress and work_remains
    return stats


async def _refused(conn, claimed: ClaimedSchedule, exc: BaseException, diagnostics: DiagnosticSink,
                   secrets: Secrets | None, stats: RoundStats) -> None:
    """Count and report one row of a page that did not commit, and give its claim back when it
    is still ours and could be decided again next round (see the module docstring)."""
    head = claimed.head
    if isinstance(exc, CasMiss):
        stats.cas_misses += 1
    elif isinstance(exc, FenceLost):
        stats.fence_lost += 1
    elif isinstance(exc, TaskChanged):
        # a legitimate edit raced the claim: nothing written, the fence is still ours
        stats.cas_misses += 1
        released = await _give_back(conn, claimed, diagnostics, secrets, stats)
        _emit(diagnostics, "info", RoundEvent.TASK_CHANGED,
              str(exc) + ("; claim given back, decided again next round" if released
                          else "; claim left to expire"),
              trigger_id=head.trigger_id, released=released)
    elif isinstance(exc, AdmissionRefused):
        stats.errors += 1
        _emit(diagnostics, "error", "cluster_postgres.admission_refused", str(exc),
              trigger_id=head.trigger_id)
    elif isinstance(exc, RETRYABLE):
        stats.errors += 1
        # nothing was written and the fence is still ours: give the claim back now (its own
        # autocommit statement, under the full fence) rather than strand it for a lease
        released = await _give_back(conn, claimed, diagnostics, secrets, stats)
        _emit(diagnostics, "warning", "cluster_postgres.serialization_exhausted",
              describe_error(exc, secrets) + ("; claim released for the next round" if released
                                              else "; claim left to expire"),
              trigger_id=head.trigger_id, released=released)
    else:
        # a write of this occurrence failed (constraint, fault, guard): all of it rolled back
        stats.errors += 1
        _emit(diagnostics, "error", RoundEvent.COMMIT_FAILED,
              describe_error(exc, secrets), trigger_id=head.trigger_id)


async def _give_back(conn, claimed, diagnostics: DiagnosticSink, secrets: Secrets | None,
                     stats: RoundStats) -> bool:
    """Release ``claimed`` under its full fence and count it in ``stats``; True if released."""
    released = await _release(conn, claimed, diagnostics, secrets)
    stats.claims_released += int(released)
    return released


async def _release(conn, claimed, diagnostics: DiagnosticSink, secrets: Secrets | None) -> bool:
    try:
        return await release_claim(conn, claimed)
    except psycopg.Error as exc:
        if conn.broken or isinstance(exc, psycopg.OperationalError):
            raise  # the connection is gone: the caller ends the round
        _emit(diagnostics, "error", "cluster_postgres.release_failed", describe_error(exc, secrets),
              trigger_id=claimed.head.trigger_id)
        return False


def _emit(sink: DiagnosticSink, level: str, code: str, message: str, **fields) -> None:
    try:
        sink.emit(DiagnosticEvent(level, code, message, fields).redacted())
    except Exception:  # a broken sink must not break the round
        pass
