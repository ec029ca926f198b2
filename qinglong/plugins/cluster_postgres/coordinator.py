"""One bounded coordinator round: claim, then decide and admit each claim.

Every replica runs the same round; there is no leader. A round claims at most
``min(claim_budget, 256)`` schedules of the kinds it has providers for, in one statement
(committed at once), then for each claim computes the decision with
:func:`qinglong.contracts.decision.decide` (outside any lock, from the claim's database-clock
observation) and commits it in its own SERIALIZABLE transaction.

A ``fire`` whose next cursor is already due (a backlog inside the grace window), or an
``initialize`` whose first occurrence (counted from the revision's publish time) is already due,
keeps its claim and is decided again at once, at most :data:`BACKLOG_FIRES_PER_ROW` times per row
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

from .admission import RETRYABLE, CasMiss, TaskChanged, after, commit_decision
from .claim import ClaimedSchedule, claim_due_schedules, effective_budget, release_claim
from .db import AdmissionRefused, Secrets, describe_error

#: How many decisions one claimed row may commit in one round (an initialisation and a backlog of
#: on-time occurrences), as edge's ``BACKLOG_FIRES_PER_ROW``: a backlog drains without one trigger
#: taking the whole round.
BACKLOG_FIRES_PER_ROW = 64


@dataclass(slots=True)
class RoundStats(RoundTally):
    """The contract's round counters while a coordinator round runs, plus what only a leased
    round has: the claims it gave back and the admissions it made. :meth:`report` freezes them."""

    started: float = field(default_factory=time.monotonic)
    #: claims given back under the full fence (exhausted retries, a failed decision, a task
    #: republished between claim and commit), to be decided again next round
    released: int = 0
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
                    stats: RoundStats | None = None) -> RoundStats:
    """Run one round on ``conn`` (autocommit) and return its counters.

    Errors of one occurrence are counted and reported to ``diagnostics``; an error of the
    connection itself propagates (the caller reports it and the next round starts afresh).
    """
    stats = stats or RoundStats()
    budget = effective_budget(claim_budget)
    claims = await claim_due_schedules(conn, owner=owner, limit=budget, lease_ms=lease_ms,
                                       kinds=list(providers))
    stats.claimed = len(claims)
    work_remains = budget > 0 and len(claims) == budget
    progress = False
    for claimed in claims:
        committed, backlog_left = await _work_claim(conn, claimed, providers, diagnostics, retries,
                                                    secrets, stats)
        progress = progress or committed
        work_remains = work_remains or backlog_left
    stats.more_due = progress and work_remains
    return stats


async def _work_claim(conn, claimed: ClaimedSchedule, providers: Mapping[str, TriggerProvider],
                      diagnostics: DiagnosticSink, retries: int, secrets: Secrets | None,
                      stats: RoundStats) -> tuple[bool, bool]:
    """Decide and commit one claim, again while it stays due (see the module docstring).
    Returns (committed at least once, a backlog left due at the per-row bound)."""
    head = claimed.head
    provider = providers.get(head.kind)
    if provider is None:  # the claim asks for our kinds only; kept as a guard
        stats.errors += 1
        released = await _give_back(conn, claimed, diagnostics, secrets, stats)
        _emit(diagnostics, "warning", RoundEvent.UNKNOWN_TRIGGER_KIND,
              f"no loaded provider for trigger kind {head.kind!r}; the claim was given back",
              trigger_id=head.trigger_id, kind=head.kind, released=released)
        return False, False
    committed = False
    for step in range(1, BACKLOG_FIRES_PER_ROW + 1):
        try:
            decision = decide(head, claimed.cursor, claimed.observed_at_ms, provider)
        except Exception as exc:  # a provider bug must not stop the other occurrences
            stats.errors += 1
            released = await _give_back(conn, claimed, diagnostics, secrets, stats)
            _emit(diagnostics, "error", RoundEvent.DECIDE_FAILED,
                  describe_error(exc, secrets) + ("; claim given back" if released else ""),
                  trigger_id=head.trigger_id, released=released)
            return committed, False
        keep = (step < BACKLOG_FIRES_PER_ROW
                and decision.kind in (DecisionKind.FIRE, DecisionKind.INITIALIZE))
        try:
            result = await commit_decision(conn, claimed, decision, retries=retries, keep_claim=keep)
        except CasMiss:
            stats.cas_misses += 1
            return committed, False
        except FenceLost:
            stats.fence_lost += 1
            return committed, False
        except TaskChanged as exc:
            # a legitimate edit raced the claim: nothing written, the fence is still ours
            stats.cas_misses += 1
            released = await _give_back(conn, claimed, diagnostics, secrets, stats)
            _emit(diagnostics, "info", RoundEvent.TASK_CHANGED,
                  str(exc) + ("; claim given back, decided again next round" if released
                              else "; claim left to expire"),
                  trigger_id=head.trigger_id, released=released)
            return committed, False
        except AdmissionRefused as exc:
            stats.errors += 1
            _emit(diagnostics, "error", "cluster_postgres.admission_refused", str(exc),
                  trigger_id=head.trigger_id)
            return committed, False
        except RETRYABLE as exc:
            stats.errors += 1
            stats.serialization_retries += retries
            # nothing was written and the fence is still ours: give the claim back now (its own
            # autocommit statement, under the full fence) rather than strand it for a lease
            released = await _give_back(conn, claimed, diagnostics, secrets, stats)
            _emit(diagnostics, "warning", "cluster_postgres.serialization_exhausted",
                  describe_error(exc, secrets) + ("; claim released for the next round" if released
                                                  else "; claim left to expire"),
                  trigger_id=head.trigger_id, released=released)
            return committed, False
        except psycopg.Error as exc:
            if conn.broken or isinstance(exc, psycopg.OperationalError):
                raise  # the connection is gone: the caller ends the round
            # a write of this occurrence failed (constraint, fault, guard): all of it rolled back
            stats.errors += 1
            _emit(diagnostics, "error", RoundEvent.COMMIT_FAILED,
                  describe_error(exc, secrets), trigger_id=head.trigger_id)
            return committed, False
        committed = True
        stats.serialization_retries += result.serialization_retries
        if result.admission is not None:
            stats.admitted += 1
            stats.admissions.append(result.admission)
        if decision.kind is DecisionKind.INITIALIZE:
            stats.initialized += 1
        if decision.skipped is not None:  # one per skip record written (see RoundReport)
            stats.skipped += 1
        if not result.claim_kept:
            # at the bound with the cursor still due: the next round goes on at once
            backlog_left = (not keep and decision.kind in (DecisionKind.FIRE, DecisionKind.INITIALIZE)
                            and decision.next_fire_at_ms <= result.admitted_at_ms)
            return committed, backlog_left
        claimed = after(claimed, decision, result)
    return committed, False  # not reached: the last step never keeps the claim


async def _give_back(conn, claimed, diagnostics: DiagnosticSink, secrets: Secrets | None,
                     stats: RoundStats) -> bool:
    """Release ``claimed`` under its full fence and count it in ``stats``; True if released."""
    released = await _release(conn, claimed, diagnostics, secrets)
    stats.released += int(released)
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
