"""The profile-neutral decision contract: what to do with a due schedule.

``decide`` is pure. The observation time is an argument (the database clock in the cluster, the
process clock on edge); no clock is read here, so the same inputs always give the same decision and
both profiles fire the same occurrences.

The rules:

* cursor NULL -> ``initialize``: the cursor becomes the first occurrence strictly after the
  revision's publish time (or the observation, if that is earlier or the publish time is unknown);
  no Run. An occurrence between the publish and the first observation is therefore owed: it is
  due at once and decided by the next decision like any other (fire, or misfire policy).
* cursor in the future -> ``not_due``: nothing changes.
* the cursor occurrence is due and at most ``misfire_grace_ms`` old -> ``fire``: admit that
  occurrence; the cursor moves to the next occurrence. If that one is due too (a backlog still
  inside the grace window, e.g. a one-second cron observed two seconds late) it is admitted by its
  own next decision; on-time occurrences are never dropped.
* the cursor occurrence is older than the grace -> misfire:
  - ``skip``: the cursor moves past the observation; no Run; what was skipped is reported.
  - ``fire_once``: admit ONE occurrence, the latest one at or before the observation; the cursor
    moves past the observation; the older ones are reported as skipped, never replayed.

After ``skip`` and ``fire_once`` the cursor is strictly after the observation; after ``initialize``
strictly after ``min(published_at_ms, observed_at_ms)``. After
``fire`` it is strictly after the admitted occurrence, and any part of it still at or before the
observation is within the grace window.

A trigger with a jitter (``contracts.jitter``) is decided on its jittered times: the cursor holds
the jittered time of its next occurrence, the grace counts from it, and an admitted occurrence
carries the delay it drew (``Decision.jitter_ms``). Initialization takes the first occurrence
whose nominal time is after the base, so republishing with another jitter never owes again an
occurrence the previous revision had.
"""

from __future__ import annotations

from .errors import TriggerSpecError
from .jitter import LAST_CALENDAR_MS, JitteredSchedule, schedule_of
from .providers import TriggerProvider
from .records import (
    NO_MORE_OCCURRENCES_MS,
    Decision,
    DecisionKind,
    MisfirePolicy,
    ScheduleCursor,
    SkippedOccurrences,
    TriggerHead,
)

#: How many skipped occurrences a decision counts one by one before reporting a lower bound.
#: Counting walks the provider (about 50 us a step for cron) inside the scheduler round, so a
#: per-second cron back from a long outage must not cost a round half a second per trigger.
SKIP_COUNT_BOUND = 1_000


def _next_or_never(provider: TriggerProvider, head: TriggerHead, after_ms: int) -> int:
    nxt = provider.next_after(head.spec, after_ms)
    if nxt is None or nxt > LAST_CALENDAR_MS:
        # past year 9999 no time can be shown as a date, and past 64 bits none can be stored
        return NO_MORE_OCCURRENCES_MS
    if nxt <= after_ms:
        raise TriggerSpecError(
            head.kind,
            "next_after",
            f"provider returned {nxt}, which is not strictly after {after_ms}",
        )
    return nxt


def _count_range(
    provider: TriggerProvider, head: TriggerHead, first_ms: int, last_ms: int
) -> SkippedOccurrences:
    """Count occurrences in [first_ms, last_ms], one by one up to SKIP_COUNT_BOUND."""
    count = 1
    current = first_ms
    while current < last_ms:
        if count >= SKIP_COUNT_BOUND:
            return SkippedOccurrences(first_ms, last_ms, count, count_exact=False)
        nxt = provider.next_after(head.spec, current)
        if nxt is None or nxt > last_ms:
            break
        current = nxt
        count += 1
    return SkippedOccurrences(first_ms, last_ms, count, count_exact=True)


def _delay(schedule: object, head: TriggerHead, scheduled_ms: int) -> int:
    """The delay an admitted jittered time drew (0 without a jitter)."""
    if not isinstance(schedule, JitteredSchedule):
        return 0
    return scheduled_ms - schedule.nominal_of(head.spec, scheduled_ms)


def initialization_base_ms(cursor: ScheduleCursor, observed_at_ms: int) -> int:
    """The instant a new revision's first occurrence is counted from: its publish time, unless
    that is unknown or later than the observation (a clock that went back), then the observation."""
    published = cursor.published_at_ms
    if published is None or published > observed_at_ms:
        return observed_at_ms
    return published


def decide(
    head: TriggerHead,
    cursor: ScheduleCursor,
    observed_at_ms: int,
    provider: TriggerProvider,
) -> Decision:
    """Decide what to do with ``head``'s schedule observed at ``observed_at_ms``.

    Arguments: the trigger's current revision, its cursor (of the same revision), the observation
    time (epoch ms) and the provider of ``head.kind``. Returns a :class:`Decision` that a store
    commits under a compare-and-set on ``(trigger_revision, state_version, next_fire_at_ms)``.
    """
    if cursor.trigger_revision != head.trigger_revision:
        raise ValueError(
            f"cursor of revision {cursor.trigger_revision} does not belong to "
            f"trigger revision {head.trigger_revision}"
        )
    if provider.kind != head.kind:
        raise ValueError(f"provider {provider.kind!r} cannot decide a {head.kind!r} trigger")
    current = cursor.next_fire_at_ms
    provider = schedule_of(provider, head.project_id, head.trigger_id, head.jitter_ms)
    base = dict(
        observed_at_ms=observed_at_ms,
        trigger_revision=head.trigger_revision,
        expected_next_fire_at_ms=current,
    )

    if current is None:
        start = initialization_base_ms(cursor, observed_at_ms)
        if isinstance(provider, JitteredSchedule):
            first = provider.first_after_nominal(head.spec, start)
            return Decision(kind=DecisionKind.INITIALIZE,
                            next_fire_at_ms=(NO_MORE_OCCURRENCES_MS if first is None or first > LAST_CALENDAR_MS
                                             else first),
                            **base)
        return Decision(
            kind=DecisionKind.INITIALIZE,
            next_fire_at_ms=_next_or_never(provider, head, start),
            **base,
        )

    if current > observed_at_ms:
        return Decision(kind=DecisionKind.NOT_DUE, next_fire_at_ms=current, **base)

    if observed_at_ms - current <= head.misfire_grace_ms:
        return Decision(
            kind=DecisionKind.FIRE,
            next_fire_at_ms=_next_or_never(provider, head, current),
            scheduled_for_ms=current,
            jitter_ms=_delay(provider, head, current),
            **base,
        )

    after_now = _next_or_never(provider, head, observed_at_ms)
    latest = provider.latest_at_or_before(head.spec, observed_at_ms)
    if latest is None or latest < current:
        # A provider that cannot see back to the cursor: the cursor occurrence is the latest due.
        latest = current

    if head.misfire_policy is MisfirePolicy.SKIP:
        return Decision(
            kind=DecisionKind.MISFIRE_SKIP,
            next_fire_at_ms=after_now,
            skipped=_count_range(provider, head, current, latest),
            **base,
        )

    skipped = None
    if latest > current:
        before_latest = provider.latest_at_or_before(head.spec, latest - 1)
        if before_latest is not None and before_latest >= current:
            skipped = _count_range(provider, head, current, before_latest)
    return Decision(
        kind=DecisionKind.MISFIRE_FIRE_ONCE,
        next_fire_at_ms=after_now,
        scheduled_for_ms=latest,
        skipped=skipped,
        jitter_ms=_delay(provider, head, latest),
        **base,
    )
