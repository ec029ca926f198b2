"""A trigger's random delay (``jitter``): each occurrence starts a little after its nominal time.

A trigger with ``jitter_ms = W`` starts each occurrence ``N`` (its provider's time) at
``N + offset(N)``, where the offset is in ``[0, W)``, drawn from a hash of the project, the trigger
and ``N``: the same on every reading, in every process and after every restart, and spread
uniformly over the window. Nothing here reads a clock or a random generator.

The window of one occurrence never reaches the next occurrence: it is ``min(W, next(N) - N)``
(for the last occurrence, the end of year 9999 stands for ``next(N)``), so
the jittered times keep the order of the nominal ones (a 5-minute jitter on a per-minute cron
spreads each start over its own minute). Hence each jittered time belongs to exactly one
occurrence, the latest nominal one at or before it, and the decision contract can work on the
jittered times as a schedule of their own: the misfire grace counts from the jittered time, a
``fire_once`` misfire admits the latest occurrence whose jittered time has passed, and the Run's
``scheduled_for_ms`` is its jittered time (its ``jitter_ms`` the delay it drew).
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from .providers import TriggerProvider

#: Largest jitter a trigger may declare (one day). A longer random delay is a different schedule.
MAX_JITTER_MS = 24 * 3600 * 1000
#: 9999-12-31T23:59:59.999Z: the last instant a time can be shown or stored as a date. The last
#: occurrences have no next one to cut their window; this cuts it instead.
LAST_CALENDAR_MS = 253_402_300_799_999


def jitter_offset_ms(project_id: str, trigger_id: str, occurrence_ms: int, window_ms: int) -> int:
    """The delay of one occurrence, in ``[0, window_ms)`` (0 when the window is empty).

    SHA-256 of the trigger's identity and the nominal occurrence, its first 64 bits read as a
    fraction of the window: deterministic across processes (no ``hash()`` seed), uniform to within
    one part in 2**64.
    """
    if window_ms <= 0:
        return 0
    text = f"qinglong.jitter\0{project_id}\0{trigger_id}\0{occurrence_ms}".encode("utf-8")
    draw = int.from_bytes(hashlib.sha256(text).digest()[:8], "big")
    return (draw * window_ms) >> 64


class JitteredSchedule:
    """A provider's occurrences moved by their jitter: the same protocol over jittered times.

    ``next_after`` and ``latest_at_or_before`` answer in jittered times, which are strictly
    increasing in the nominal ones, so :func:`qinglong.contracts.decision.decide` decides on them
    as on any schedule. ``nominal_of`` maps a jittered time back to its occurrence.
    """

    __slots__ = ("provider", "kind", "project_id", "trigger_id", "window_ms")

    def __init__(self, provider: TriggerProvider, project_id: str, trigger_id: str,
                 window_ms: int) -> None:
        self.provider = provider
        self.kind = provider.kind
        self.project_id = project_id
        self.trigger_id = trigger_id
        self.window_ms = window_ms

    def jittered(self, spec: Mapping[str, Any], occurrence_ms: int) -> int:
        """The jittered time of the nominal occurrence ``occurrence_ms``."""
        following = self.provider.next_after(spec, occurrence_ms)
        end = LAST_CALENDAR_MS + 1 if following is None else following
        window = min(self.window_ms, end - occurrence_ms)
        return occurrence_ms + jitter_offset_ms(self.project_id, self.trigger_id, occurrence_ms,
                                                window)

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        """The first jittered time strictly after ``after_ms``: the occurrence at or before it if
        its delay carries it past, else the next occurrence's."""
        latest = self.provider.latest_at_or_before(spec, after_ms)
        if latest is not None:
            moved = self.jittered(spec, latest)
            if moved > after_ms:
                return moved
        following = self.provider.next_after(spec, after_ms)
        return None if following is None else self.jittered(spec, following)

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        """The last jittered time at or before ``at_ms``."""
        latest = self.provider.latest_at_or_before(spec, at_ms)
        if latest is None:
            return None
        moved = self.jittered(spec, latest)
        if moved <= at_ms:
            return moved
        # its delay has not passed yet; the one before ends before ``latest`` itself
        before = self.provider.latest_at_or_before(spec, latest - 1)
        return None if before is None else self.jittered(spec, before)

    def first_after_nominal(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        """The jittered time of the first occurrence whose NOMINAL time is strictly after
        ``after_ms``: where a new revision starts, so an occurrence a previous revision already
        had is never owed again because a different jitter moved it past the publish."""
        following = self.provider.next_after(spec, after_ms)
        return None if following is None else self.jittered(spec, following)

    def nominal_of(self, spec: Mapping[str, Any], jittered_ms: int) -> int:
        """The occurrence a jittered time belongs to (the latest nominal one at or before it);
        the time itself for a provider that cannot look back."""
        nominal = self.provider.latest_at_or_before(spec, jittered_ms)
        return jittered_ms if nominal is None else nominal

    def describe(self, spec: Mapping[str, Any]) -> str:
        """The provider's summary of the spec."""
        return self.provider.describe(spec)


def schedule_of(provider: TriggerProvider, project_id: str, trigger_id: str,
                jitter_ms: int) -> Any:
    """The schedule a trigger fires on: its provider, or the provider jittered."""
    if jitter_ms <= 0:
        return provider
    return JitteredSchedule(provider, project_id, trigger_id, jitter_ms)
