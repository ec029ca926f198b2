"""The ``interval`` trigger kind for Qinglong: a Run every ``every_ms`` milliseconds.

Registered under the entry point ``interval`` of group ``qinglong.plugins``; operators enable it
with ``[plugins] enable = ["interval"]``. This module is what the host imports to register the
hook, so it stays light: the provider needs nothing but :mod:`qinglong.contracts`.
"""

from __future__ import annotations

from qinglong.contracts.hookspecs import hookimpl

from .command_line import INTERVAL_CLI_OPTIONS
from .provider import IntervalProvider

__all__ = ["IntervalProvider", "qinglong_trigger_cli_options", "qinglong_trigger_providers"]
__version__ = "0.1.0"


@hookimpl
def qinglong_trigger_providers():
    """Offer the ``interval`` trigger kind."""
    return [IntervalProvider()]


@hookimpl
def qinglong_trigger_cli_options():
    """``qinglong trigger add --kind interval --every 30s`` instead of ``--spec JSON``."""
    return [INTERVAL_CLI_OPTIONS]
