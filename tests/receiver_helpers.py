"""Moved to :mod:`devtools.receiver` (shared with the benchmarks); this name stays importable."""

from devtools.receiver import Receiver  # noqa: F401
