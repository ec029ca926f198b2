"""Interval occurrences: ``anchor_ms + k * every_ms`` for every integer ``k``.

Spec (normalised)::

    {"every_ms": 30000, "anchor_ms": 0}

``every_ms`` is an integer of at least 1000 (one second); ``anchor_ms`` (default 0, the Unix
epoch) fixes the phase: with ``every_ms = 60000`` and ``anchor_ms = 15000`` the occurrences fall at
15 seconds past every minute. The anchor is a phase, not a start: occurrences exist before it
too, so publishing a trigger never fires a backlog (the first cursor is the first occurrence after
the publication). Times are integer epoch milliseconds; no time zone is involved, so there are no
DST effects: an interval is an interval of elapsed time.
"""

from __future__ import annotations

from typing import Any, Mapping

from qinglong.contracts.errors import TriggerSpecError

KIND = "interval"
MIN_EVERY_MS = 1_000
_FIELDS = ("every_ms", "anchor_ms")


def _integer(field: str, value: Any) -> int:
    # bool is an int subclass; `true` in a JSON spec is a mistake, not 1 ms.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TriggerSpecError(KIND, field, f"expected an integer number of milliseconds, got {value!r}")
    return value


class IntervalProvider:
    """The ``interval`` trigger provider (pure: no clock, no I/O)."""

    kind = KIND

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        """Normalise ``{"every_ms", "anchor_ms"}`` or raise :class:`TriggerSpecError` naming the field."""
        if not isinstance(spec, Mapping):
            raise TriggerSpecError(KIND, "spec", "expected a table with 'every_ms' and optionally 'anchor_ms'")
        unknown = sorted(set(spec) - set(_FIELDS))
        if unknown:
            raise TriggerSpecError(
                KIND, str(unknown[0]), "unknown field; an interval spec has 'every_ms' and 'anchor_ms'"
            )
        if "every_ms" not in spec:
            raise TriggerSpecError(KIND, "every_ms", "required, e.g. 60000 for once a minute")
        every = _integer("every_ms", spec["every_ms"])
        if every < MIN_EVERY_MS:
            raise TriggerSpecError(KIND, "every_ms", f"must be >= {MIN_EVERY_MS} (one second), got {every}")
        anchor = _integer("anchor_ms", spec.get("anchor_ms", 0))
        return {"every_ms": every, "anchor_ms": anchor}

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        """The first ``anchor + k * every`` strictly after ``after_ms``."""
        every, anchor = spec["every_ms"], spec["anchor_ms"]
        return anchor + ((after_ms - anchor) // every + 1) * every

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        """The last ``anchor + k * every`` at or before ``at_ms``."""
        every, anchor = spec["every_ms"], spec["anchor_ms"]
        return anchor + ((at_ms - anchor) // every) * every

    def example_spec(self, every_ms: int) -> Mapping[str, Any] | None:
        """What ``qinglong demo`` publishes when this is the first kind it asks: every ``every_ms``
        from the epoch (None below the one-second minimum)."""
        if every_ms < MIN_EVERY_MS:
            return None
        return {"every_ms": every_ms, "anchor_ms": 0}

    def describe(self, spec: Mapping[str, Any]) -> str:
        """``every 30s`` or ``every 1500 ms``, plus the anchor when it is not 0."""
        every, anchor = spec["every_ms"], spec["anchor_ms"]
        text = f"every {every // 1000}s" if every % 1000 == 0 else f"every {every} ms"
        return text if anchor == 0 else f"{text} from {anchor}"
