"""One bounded coordinator round: claim, then decide and admit each claim.

Every replica runs the same round; there is no leader. A round claims at most
``min(claim_budget, 256)`` schedules in one statement (committed at once), then for each claim
computes the decision with :func:`qinglong.contracts.decision.decide` (outside any lock, from the
claim's database-clock observation) and commits it in its own SERIALIZABLE transaction. A claim
that cannot be committed is left to expire: another round (here or on another replica) takes it
over after its lease, in database time. The one exception is an admission that exhausted its
serialization retries (nothing written, the fence still ours): its claim is released under the
full fence at once, so the occurrence is claimed again next round instead of a lease later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import psycopg

from qinglong.contracts.decision import decide
from qinglong.contracts.diagnostics import DiagnosticEvent, DiagnosticSink
from qinglong.contracts.errors import FenceLost
from qinglong.contracts.providers import TriggerProvider
from qinglong.contracts.records import DecisionKind, RoundReport

from .admission import RETRYABLE, CasMiss, commit_decision
from .claim import claim_due_schedules, effective_budget, release_claim
from .db import AdmissionRefused, Secrets, describe_error


@dataclass
class RoundStats:
    """Mutable counters of a round in progress; :meth:`report` freezes them."""

    started: float = field(default_factory=time.monotonic)
    claimed: int = 0
    initialized: int = 0
    admitted: int = 0
    skipped: int = 0
    cas_misses: int = 0
    fence_lost: int = 0
    serialization_retries: int = 0
    errors: int = 0
    #: claims given back after their admission exhausted its retries (also counted in errors)
    released: int = 0
    more_due: bool = False
    admissions: list = field(default_factory=list)

    def report(self) -> RoundReport:
        return RoundReport(
            scanned=self.claimed, claimed=self.claimed, initialized=self.initialized,
            admitted=self.admitted, skipped=self.skipped, cas_misses=self.cas_misses,
            fence_lost=self.fence_lost, serialization_retries=self.serialization_retries,
            errors=self.errors, duration_ms=int((time.monotonic() - self.started) * 1000),
            more_due=self.more_due,
        )


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
    claims = await claim_due_schedules(conn, owner=owner, limit=budget, lease_ms=lease_ms)
    stats.claimed = len(claims)
    stats.more_due = budget > 0 and len(claims) == budget
    for claimed in claims:
        head = claimed.head
        provider = providers.get(head.kind)
        if provider is None:
            stats.errors += 1
            _emit(diagnostics, "warning", "cluster_postgres.unknown_trigger_kind",
                  f"no loaded provider for trigger kind {head.kind!r}; the claim is left to expire",
                  trigger_id=head.trigger_id, kind=head.kind)
            continue
        try:
            decision = decide(head, claimed.cursor, claimed.observed_at_ms, provider)
        except Exception as exc:  # a provider bug must not stop the other occurrences
            stats.errors += 1
            _emit(diagnostics, "error", "cluster_postgres.decision_failed",
                  describe_error(exc, secrets), trigger_id=head.trigger_id)
            continue
        try:
            result = await commit_decision(conn, claimed, decision, retries=retries)
        except CasMiss:
            stats.cas_misses += 1
            continue
        except FenceLost:
            stats.fence_lost += 1
            continue
        except AdmissionRefused as exc:
            stats.errors += 1
            _emit(diagnostics, "error", "cluster_postgres.admission_refused", str(exc),
                  trigger_id=head.trigger_id)
            continue
        except RETRYABLE as exc:
            stats.errors += 1
            stats.serialization_retries += retries
            # nothing was written and the fence is still ours: give the claim back now (its own
            # autocommit statement, under the full fence) rather than strand it for a lease
            released = await _release(conn, claimed, diagnostics, secrets)
            stats.released += int(released)
            _emit(diagnostics, "warning", "cluster_postgres.serialization_exhausted",
                  describe_error(exc, secrets) + ("; claim released for the next round" if released
                                                  else "; claim left to expire"),
                  trigger_id=head.trigger_id, released=released)
            continue
        except psycopg.Error as exc:
            if conn.broken or isinstance(exc, psycopg.OperationalError):
                raise  # the connection is gone: the caller ends the round
            # a write of this occurrence failed (constraint, fault, guard): all of it rolled back
            stats.errors += 1
            _emit(diagnostics, "error", "cluster_postgres.admission_failed",
                  describe_error(exc, secrets), trigger_id=head.trigger_id)
            continue
        stats.serialization_retries += result.serialization_retries
        if result.admission is not None:
            stats.admitted += 1
            stats.admissions.append(result.admission)
        if decision.kind is DecisionKind.INITIALIZE:
            stats.initialized += 1
        elif decision.skipped is not None or decision.kind is DecisionKind.MISFIRE_SKIP:
            stats.skipped += 1
    return stats


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
