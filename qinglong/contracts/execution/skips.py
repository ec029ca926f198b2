"""Skip retention: the records of skipped occurrences and of Runs skipped before they started
are deleted once older than ``[execution] skip_retention_days``, in bounded batches, on every
store. One rule, here; the cluster's ``qinglong.prune_skips`` repeats it in SQL (a test holds
the two equal)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..errors import UserError
from ..frozen import record
from ..observe import RECENT_WINDOW_MS

#: The most records of each kind one prune call deletes.
MAX_SKIP_PRUNE_BATCH = 10_000
#: The youngest a pruned record may be: the window ``qinglong status`` counts recent skips over.
MIN_SKIP_RETENTION_MS = RECENT_WINDOW_MS


def skip_cutoff_ms(now_ms: int, retention_ms: int) -> int:
    """Records recorded before this instant may be pruned: ``retention_ms`` ago, never less
    than :data:`MIN_SKIP_RETENTION_MS` (the recent-skips figures stay whole)."""
    return int(now_ms) - max(int(retention_ms), MIN_SKIP_RETENTION_MS)


def skip_prune_limit(limit: int) -> int:
    """``limit`` when it is a whole number of 1 to :data:`MAX_SKIP_PRUNE_BATCH`, else a UserError."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_SKIP_PRUNE_BATCH:
        raise UserError(f"skip prune: expected a limit of 1 to {MAX_SKIP_PRUNE_BATCH}, got {limit!r}")
    return limit


@record
class SkipPruneReport:
    """What one prune call deleted: skipped occurrences (``schedule_skips``) and Runs skipped
    before they started (``run_skips``), each at most the call's limit."""

    occurrences: int = 0
    runs: int = 0


@runtime_checkable
class PrunesSkips(Protocol):
    """A store whose skip records age out (the edge execution store, the cluster's run control)."""

    async def prune_skips(self, older_than_ms: int, limit: int) -> SkipPruneReport:
        """Delete up to ``limit`` (:func:`skip_prune_limit`) records of each kind recorded before
        ``older_than_ms`` (the caller's :func:`skip_cutoff_ms`), oldest first. A record holding
        a manual Run's idempotency key stays: that key admits one Run, ever."""
        ...


__all__ = ["MAX_SKIP_PRUNE_BATCH", "MIN_SKIP_RETENTION_MS", "skip_cutoff_ms", "skip_prune_limit",
           "SkipPruneReport", "PrunesSkips"]
