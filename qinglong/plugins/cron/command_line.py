"""How operators write a cron trigger on the command line: ``--cron EXPR [--timezone ZONE]``.

Declared through the ``qinglong_trigger_cli_options`` hook, so the host's ``trigger add`` and
``trigger update`` know these options only as the cron plugin's. Light on purpose: croniter is not
imported here; the spec this builds is validated by :class:`~.provider.CronProvider` at publish.
"""

from __future__ import annotations

from typing import Any, Mapping

from qinglong.contracts.errors import UserError
from qinglong.contracts.providers import TriggerCliOption, TriggerCliOptions

KIND = "cron"
DEFAULT_TIMEZONE = "UTC"


def spec_from_cli(given: Mapping[str, str], current: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"expression", "timezone"}`` from ``--cron`` and ``--timezone``.

    On ``trigger update`` of a cron trigger, an option left out keeps its stored value (``--timezone``
    alone moves the same expression to another zone); a new cron schedule needs ``--cron`` and
    takes ``UTC`` unless ``--timezone`` says otherwise.
    """
    zone = given.get("timezone")
    if zone is not None and not zone.strip():
        raise UserError("--timezone is empty: give an IANA time zone such as 'Europe/Berlin', "
                        "or leave the option out for UTC")
    expression = given.get("cron")
    if expression is None:
        if current is None:
            raise UserError("--timezone applies to cron triggers: give --cron EXPR too")
        expression = current.get("expression")
    if zone is None:
        zone = current.get("timezone", DEFAULT_TIMEZONE) if current is not None else DEFAULT_TIMEZONE
    return {"expression": expression, "timezone": zone}


CRON_CLI_OPTIONS = TriggerCliOptions(
    kind=KIND,
    options=(
        TriggerCliOption("--cron", "cron expression: 5 fields, or 6 with seconds first", metavar="EXPR"),
        TriggerCliOption("--timezone", "IANA time zone of the expression (default UTC)", metavar="ZONE"),
    ),
    to_spec=spec_from_cli,
    usage="--cron EXPRESSION [--timezone ZONE]",
)
