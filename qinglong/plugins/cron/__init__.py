"""The built-in ``cron`` trigger provider (croniter), registered as entry point ``cron``."""

from __future__ import annotations

from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_trigger_providers():
    """Offer the ``cron`` trigger kind."""
    from .provider import CronProvider

    return [CronProvider()]


@hookimpl
def qinglong_trigger_cli_options():
    """``trigger add --cron EXPR [--timezone ZONE]`` (croniter is not imported for this)."""
    from .command_line import CRON_CLI_OPTIONS

    return [CRON_CLI_OPTIONS]


@hookimpl
def qinglong_cli_commands():
    """``qinglong cron next EXPR``: preview fire times (croniter is imported only when it runs)."""
    from .command_line import CRON_COMMAND

    return [CRON_COMMAND]
