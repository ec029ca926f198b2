"""The decision contract's laws over any provider: what ``decide`` must do with a kind's occurrences.

``qinglong.contracts.decision.decide`` turns a provider's occurrences into ``initialize``, ``fire``
and misfire decisions, and both backends commit what it returns. These helpers let a plugin check,
for its own kind, that every on-time occurrence is admitted exactly once, never twice, and at most
once per misfire, as Qinglong checks cron (``tests/contracts/test_decision_properties.py``):

* :func:`assert_decision_laws`: every law one decision keeps, whatever its kind;
* :func:`apply`: the cursor a store writes when it commits a decision;
* :func:`settle`: decide and commit at one observation until not due, recording admissions;
* :func:`expected_admissions`: the reference model of which occurrences a run of observations
  admits, written out independently of ``decision.py``;
* :func:`make_head` and :func:`cursor_at`: records as a store hands them to ``decide``.

The functions are pure and use no test library; drive them with hypothesis as
``examples/interval-trigger/tests/test_interval_decision.py`` does.
"""

from __future__ import annotations

from typing import Any, Mapping

from qinglong.contracts.decision import decide
from qinglong.contracts.jitter import JitteredSchedule, schedule_of
from qinglong.contracts.records import (
    NO_MORE_OCCURRENCES_MS,
    Decision,
    DecisionKind,
    MisfirePolicy,
    ScheduleCursor,
    TriggerHead,
)


def make_head(kind: str, spec: Mapping[str, Any], policy: MisfirePolicy, grace_ms: int,
              revision: int = 1, jitter_ms: int = 0) -> TriggerHead:
    """A trigger head (project ``p1``, trigger ``t1``, task ``k1``) as a store hands it to ``decide``."""
    return TriggerHead(
        project_id="p1",
        trigger_id="t1",
        task_id="k1",
        trigger_revision=revision,
        kind=kind,
        spec=spec,
        misfire_policy=policy,
        misfire_grace_ms=grace_ms,
        enabled=True,
        content_digest="sha256:" + "0" * 64,
        jitter_ms=jitter_ms,
    )


def cursor_at(head: TriggerHead, next_fire_at_ms: int | None, state_version: int = 1,
              published_at_ms: int | None = None) -> ScheduleCursor:
    """A cursor of ``head``'s revision (published at ``published_at_ms``, if known)."""
    return ScheduleCursor(head.trigger_revision, next_fire_at_ms, None, state_version, published_at_ms)


def initialization_base(cursor: ScheduleCursor, observed_at_ms: int) -> int:
    """Where the first cursor of a revision is counted from, as the rule states it:
    ``min(published, observed)``, the observation when the publish time is unknown."""
    if cursor.published_at_ms is None:
        return observed_at_ms
    return min(cursor.published_at_ms, observed_at_ms)


def assert_decision_laws(decision: Decision, head: TriggerHead, cursor: ScheduleCursor,
                         observed_at_ms: int, provider: Any) -> None:
    """Every law a single decision must keep, whatever its kind (see ``qinglong/contracts/decision.py``).

    A trigger with a jitter keeps the same laws on its jittered times (``contracts.jitter``)."""
    plain = provider
    provider = schedule_of(plain, head.project_id, head.trigger_id, head.jitter_ms)
    current = cursor.next_fire_at_ms
    assert decision.observed_at_ms == observed_at_ms
    assert decision.trigger_revision == head.trigger_revision
    assert decision.expected_next_fire_at_ms == current
    kind = decision.kind
    if kind is DecisionKind.NOT_DUE:
        assert current is not None and current > observed_at_ms
        assert decision.next_fire_at_ms == current and not decision.admits_run
        return
    if kind is DecisionKind.INITIALIZE:
        assert current is None and not decision.admits_run and decision.skipped is None
        # The first occurrence strictly after min(published, observed): it may already be due
        # (owed since the publish), and none lies between that base and the cursor.
        base = initialization_base(cursor, observed_at_ms)
        assert decision.next_fire_at_ms > base
        if isinstance(provider, JitteredSchedule):
            # the first occurrence whose nominal time is after the base, at its jittered time
            expected = provider.first_after_nominal(head.spec, base)
        else:
            expected = provider.next_after(head.spec, base)
        assert decision.next_fire_at_ms == (NO_MORE_OCCURRENCES_MS if expected is None else expected)
    else:
        assert current is not None and current <= observed_at_ms
    if decision.admits_run:
        # the delay drawn: the admitted time less its occurrence's nominal time, inside the window
        nominal = plain.latest_at_or_before(head.spec, decision.scheduled_for_ms)
        if head.jitter_ms:
            assert decision.jitter_ms == decision.scheduled_for_ms - nominal
            assert 0 <= decision.jitter_ms < head.jitter_ms
        else:
            assert decision.jitter_ms == 0
    if kind in (DecisionKind.MISFIRE_SKIP, DecisionKind.MISFIRE_FIRE_ONCE):
        assert decision.next_fire_at_ms > observed_at_ms
    if kind is DecisionKind.MISFIRE_SKIP:
        assert head.misfire_policy is MisfirePolicy.SKIP
        assert observed_at_ms - current > head.misfire_grace_ms
        assert not decision.admits_run
    if kind is DecisionKind.MISFIRE_FIRE_ONCE:
        assert head.misfire_policy is MisfirePolicy.FIRE_ONCE
        assert observed_at_ms - current > head.misfire_grace_ms
        assert current <= decision.scheduled_for_ms <= observed_at_ms
        assert decision.scheduled_for_ms == provider.latest_at_or_before(head.spec, observed_at_ms)
        if decision.skipped is not None:
            assert decision.skipped.last_ms < decision.scheduled_for_ms
    if kind is DecisionKind.FIRE:
        assert observed_at_ms - current <= head.misfire_grace_ms
        assert decision.scheduled_for_ms == current
        assert decision.next_fire_at_ms > decision.scheduled_for_ms
        if decision.next_fire_at_ms <= observed_at_ms:
            assert observed_at_ms - decision.next_fire_at_ms <= head.misfire_grace_ms


def apply(decision: Decision, cursor: ScheduleCursor) -> ScheduleCursor:
    """The cursor a store writes when it commits ``decision`` (what both backends do)."""
    if not decision.changes_cursor:
        return cursor
    last = decision.scheduled_for_ms if decision.admits_run else cursor.last_scheduled_at_ms
    return ScheduleCursor(cursor.trigger_revision, decision.next_fire_at_ms, last, cursor.state_version + 1)


def settle(head: TriggerHead, cursor: ScheduleCursor, observed_at_ms: int, provider: Any,
           admitted: list[int], bound: int = 5_000) -> ScheduleCursor:
    """Decide and commit at one observation until the schedule is not due, checking every
    decision's laws; append each admitted occurrence to ``admitted``; return the final cursor."""
    for _ in range(bound):
        decision = decide(head, cursor, observed_at_ms, provider)
        assert_decision_laws(decision, head, cursor, observed_at_ms, provider)
        if decision.kind is DecisionKind.NOT_DUE:
            return cursor
        if decision.admits_run:
            admitted.append(decision.scheduled_for_ms)
        cursor = apply(decision, cursor)
    raise AssertionError(f"schedule still due after {bound} decisions at {observed_at_ms}")


def occurrences_between(provider: Any, spec: Mapping[str, Any], after_ms: int, until_ms: int) -> list[int]:
    """Occurrences in ``(after_ms, until_ms]``, by walking ``next_after``."""
    found, current = [], after_ms
    while True:
        nxt = provider.next_after(spec, current)
        if nxt is None or nxt > until_ms:
            return found
        found.append(nxt)
        current = nxt


def expected_admissions(provider: Any, head: TriggerHead, initialized_at_ms: int, observations: list[int],
                        published_at_ms: int | None = None) -> list[int]:
    """The reference model: which occurrences a run of observations must admit, and in what order.

    Initialization at ``initialized_at_ms`` counts from ``min(published, initialized)``: it is
    modelled as an observation at that base followed by one at ``initialized_at_ms`` (the
    occurrences owed since the publish are decided at once, at the initializing observation).
    After each observation the cursor is the first occurrence after the highest observation so
    far. At the next (higher) observation, if that cursor occurrence is within the grace, every
    occurrence up to the observation is admitted; otherwise ``fire_once`` admits only the latest
    one and ``skip`` none. An observation at or below the highest one admits nothing.
    """
    expected: list[int] = []
    high = initialized_at_ms
    if published_at_ms is not None and published_at_ms < initialized_at_ms:
        high = published_at_ms
        observations = [initialized_at_ms, *observations]
    for observed in observations:
        if observed <= high:
            continue
        due = occurrences_between(provider, head.spec, high, observed)
        if due:
            if observed - due[0] <= head.misfire_grace_ms:
                expected.extend(due)
            elif head.misfire_policy is MisfirePolicy.FIRE_ONCE:
                expected.append(due[-1])
        high = observed
    return expected


__all__ = [
    "apply",
    "assert_decision_laws",
    "cursor_at",
    "expected_admissions",
    "initialization_base",
    "make_head",
    "occurrences_between",
    "settle",
]
