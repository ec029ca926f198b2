"""The window of "recent" in what an operator is shown (skips and lost Attempts of the last hour).

Its own module because skip retention (:mod:`.execution.skips`) keeps at least this window, and
the execution contracts a remote worker imports must not pull in :mod:`.observe`."""

from __future__ import annotations

#: The skip/lost counts of ``qinglong status`` and the metrics cover this window.
RECENT_WINDOW_MS = 60 * 60_000
