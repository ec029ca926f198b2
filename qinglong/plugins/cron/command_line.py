"""The cron plugin on the command line: ``--cron EXPR [--timezone ZONE]`` and ``qinglong cron next``.

The options are declared through the ``qinglong_trigger_cli_options`` hook, so the host's ``trigger
add`` and ``trigger update`` know them only as the cron plugin's; ``cron next`` through
``qinglong_cli_commands``, so the host knows no command about a trigger kind. Light on purpose:
croniter is not imported here; the spec this builds is validated by
:class:`~.provider.CronProvider` at publish, and ``cron next`` imports it only when it runs.
"""

from __future__ import annotations

from typing import Any, Mapping

from qinglong.contracts.cli import CliArgument, CliCommand, CliContext
from qinglong.contracts.errors import UserError
from qinglong.contracts.providers import TriggerCliOption, TriggerCliOptions
from qinglong.contracts.store import MAX_LISTING_ROWS

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


def positive_count(text: str) -> int:
    """``--count``: a whole number from 1 to the listings' bound (a usage error otherwise)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_LISTING_ROWS:
        raise ValueError(f"expected a number from 1 to {MAX_LISTING_ROWS}, got {value}")
    return value


def _parse_time(option: str, text: str, zone: Any) -> int:
    """An ISO 8601 time as epoch ms; without an offset it is a wall time in ``zone``."""
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"{option} {text!r} is not an ISO 8601 time such as 2026-03-29T01:30:00+01:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    try:
        moment.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        raise UserError(f"{option} {text!r} lies outside the years 1 to 9999 once in UTC") from None
    return int(moment.timestamp() * 1000)


def cron_next(context: CliContext) -> int:
    """Preview the next fire times of a cron expression, exactly as the scheduler computes them."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from .provider import CronProvider

    given = context.arguments
    if given["timezone"] is not None and not given["timezone"].strip():
        raise UserError("--timezone is empty: give an IANA time zone such as 'Europe/Berlin', "
                        "or leave the option out for UTC")
    provider = CronProvider()
    spec = provider.validate({"expression": given["expression"], "timezone": given["timezone"] or DEFAULT_TIMEZONE})
    zone = ZoneInfo(spec["timezone"])
    after_ms = context.now_ms() if given["after"] is None else _parse_time("--after", given["after"], zone)
    count = given["count"]
    fire_times: list[int] = []
    cursor = after_ms
    while len(fire_times) < count:
        nxt = provider.next_after(spec, cursor)
        if nxt is None:
            break
        fire_times.append(nxt)
        cursor = nxt

    def local(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="seconds")

    if given["json"]:
        context.print_json({"expression": spec["expression"], "timezone": spec["timezone"],
                            "describe": provider.describe(spec), "after_ms": after_ms,
                            "fire_times": [{"at_ms": ms, "local": local(ms), "utc": context.utc(ms)}
                                           for ms in fire_times]})
        return 0
    print(f"{provider.describe(spec)}, after {context.utc(after_ms)}:")
    context.print_table(["#", "local", "utc"],
                        [[i, local(ms), context.utc(ms)] for i, ms in enumerate(fire_times, start=1)])
    if len(fire_times) < count:
        print("(no further fire times)")
    return 0


CRON_COMMAND = CliCommand(
    name="cron",
    help="cron expressions: preview fire times",
    subcommands=(
        CliCommand(
            name="next",
            help="the next fire times of a cron expression",
            description="The next fire times of a cron expression, computed by the cron trigger provider "
                        "exactly as the scheduler computes them (daylight-saving rule included).",
            handler=cron_next,
            arguments=(
                CliArgument("expression", "5 fields, 6 with seconds first, or "
                            "@hourly/@daily/@midnight/@weekly/@monthly/@yearly", metavar="EXPR"),
                CliArgument("--timezone", "IANA time zone (default UTC)", metavar="ZONE"),
                CliArgument("--count", "how many fire times (default 5)", type=positive_count, default=5),
                CliArgument("--after", "start after this ISO 8601 time (default now; without an offset, "
                            "in --timezone)", metavar="TIME"),
                CliArgument("--json", "print JSON", switch=True),
            ),
        ),
    ),
)
