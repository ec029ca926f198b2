"""Moved to :mod:`devtools.fault_proxy` (shared with the benchmarks); this name stays importable."""

from devtools.fault_proxy import *  # noqa: F401,F403
from devtools.fault_proxy import BOTH, TO_CLIENT, TO_SERVER, FaultProxy  # noqa: F401
