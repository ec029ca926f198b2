"""Moved to :mod:`devtools.scale_seed` (shared with the benchmarks); this name stays importable."""

from devtools.scale_seed import *  # noqa: F401,F403
