"""The built-in ``cron`` trigger provider (croniter), registered as entry point ``cron``."""

from __future__ import annotations

from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_trigger_providers():
    """Offer the ``cron`` trigger kind."""
    from .provider import CronProvider

    return [CronProvider()]
