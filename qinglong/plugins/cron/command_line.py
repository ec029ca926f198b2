"""The cron plugin on the command line: ``--cron EXPR [--timezone ZONE]`` and ``qinglong cron next``.

The options are declared through the ``qinglong_trigger_cli_options`` hook, so the host's ``trigger
add`` and ``trigger update`` know them only as the cron plugin's; ``cron next`` through
``qinglong_cli_commands``, so the host knows no command about a trigger kind. Light on purpose:
croniter is not imported here; the spec this builds is validated by
:class:`~.provider.CronProvider` at publish, and ``cron next`` imports it only when it runs.
"""

from __future__ import annotations

from typing import Any, Mapping

from qinglong.contracts.cli import CliArgument, CliCommand, CliContext, parse_duration_ms
from qinglong.contracts.errors import UserError, quoted
from qinglong.contracts.providers import TriggerCliOption, TriggerCliOptions
from qinglong.contracts.providers import fire_times as next_fire_times
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
        raise ValueError(f"expected a whole number, got {quoted(text)}") from None
    if not 1 <= value <= MAX_LISTING_ROWS:
        raise ValueError(f"expected a number from 1 to {MAX_LISTING_ROWS}, got {value}")
    return value


def _parse_time(option: str, text: str, zone: Any) -> int:
    """An ISO 8601 time as epoch ms (its microseconds cut, never rounded up into the next
    millisecond); without an offset it is a wall time in ``zone``."""
    from datetime import datetime, timedelta, timezone

    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"{option} {quoted(text)} is not an ISO 8601 time such as 2026-03-29T01:30:00+01:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    try:
        moment.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        raise UserError(f"{option} {quoted(text)} lies outside the years 1 to 9999 once in UTC") from None
    # integer arithmetic: a float timestamp rounds 23:59:59.999999 of year 9999 into year 10000
    return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


def _jitter_of(given: Mapping[str, Any]) -> tuple[int, tuple[str, str] | None]:
    """``--jitter`` in ms (0 without) and ``--trigger`` as (project, trigger), checked as a
    trigger's would be at publish."""
    from qinglong.contracts.jitter import MAX_JITTER_MS
    from qinglong.contracts.store import check_identifier

    trigger = None
    if given["trigger"] is not None:
        project, _, trigger_id = given["trigger"].partition("/")
        if not trigger_id:
            raise UserError(f"--trigger: expected PROJECT/TRIGGER, got {quoted(given['trigger'])}")
        check_identifier("project_id", project)
        check_identifier("trigger_id", trigger_id)
        trigger = (project, trigger_id)
    if given["jitter"] is None:
        if trigger is not None:
            raise UserError("--trigger draws a trigger's delays: give --jitter DURATION too")
        return 0, None
    jitter_ms = parse_duration_ms("--jitter", given["jitter"])
    if jitter_ms > MAX_JITTER_MS:
        raise UserError(f"--jitter: at most 1d, got {quoted(given['jitter'])}")
    return jitter_ms, trigger


def cron_next(context: CliContext) -> int:
    """Preview the next fire times of a cron expression, exactly as the scheduler computes them."""
    from datetime import datetime, timedelta, timezone
    from zoneinfo import ZoneInfo

    from qinglong.contracts.jitter import LAST_CALENDAR_MS, JitteredSchedule

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
    jitter_ms, trigger = _jitter_of(given)
    schedule: Any = provider
    if jitter_ms and trigger is not None:
        # the delays a trigger of this id draws: the contract's, as the scheduler draws them
        schedule = JitteredSchedule(provider, trigger[0], trigger[1], jitter_ms)
    fire_times = next_fire_times(schedule, spec, after_ms, count)

    def local(ms: int) -> str:
        moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
        try:
            return moment.astimezone(zone).isoformat(timespec="seconds")
        except OverflowError:
            # a start drawn late on the calendar's last day, east of UTC: the wall clock reads
            # 10000-01-01 there, which datetime cannot hold; a day earlier has the same offset
            return "10000-01-01" + (moment - timedelta(days=1)).astimezone(zone).isoformat(timespec="seconds")[10:]

    def nominal(ms: int) -> int:
        return schedule.nominal_of(spec, ms) if schedule is not provider else ms

    def window_end(ms: int) -> int:
        # the last instant the delay may reach: the window, cut at the next occurrence
        following = provider.next_after(spec, ms)
        end = ms + jitter_ms - 1
        return min(end, LAST_CALENDAR_MS) if following is None else min(end, following - 1)

    if given["json"]:
        rows = []
        for ms in fire_times:
            row = {"at_ms": ms, "local": local(ms), "utc": context.utc(ms)}
            if jitter_ms and schedule is not provider:
                row.update(occurrence_ms=nominal(ms), jitter_ms=ms - nominal(ms))
            elif jitter_ms:
                row.update(latest_start_ms=window_end(ms))
            rows.append(row)
        context.print_json({"expression": spec["expression"], "timezone": spec["timezone"],
                            "describe": provider.describe(spec), "after_ms": after_ms,
                            "jitter_ms": jitter_ms,
                            "trigger": "/".join(trigger) if trigger is not None else None,
                            "fire_times": rows})
        return 0
    # out before the table is computed: a reader that leaves (``| head -1``) ends us at once
    print(f"{provider.describe(spec)}, after {context.utc(after_ms)}:", flush=True)
    if not jitter_ms:
        context.print_table(["#", "local", "utc"],
                            [[i, local(ms), context.utc(ms)] for i, ms in enumerate(fire_times, start=1)])
    elif schedule is not provider:
        print(f"with the jitter of trigger {'/'.join(trigger)}, up to {given['jitter']}:")
        context.print_table(["#", "local", "utc", "occurrence", "delay_ms"],
                            [[i, local(ms), context.utc(ms), context.utc(nominal(ms)), ms - nominal(ms)]
                             for i, ms in enumerate(fire_times, start=1)])
    else:
        print(f"each starting at a delay of up to {given['jitter']} (give --trigger PROJECT/TRIGGER "
              "for a trigger's exact starts):")
        context.print_table(["#", "local", "utc", "latest_start"],
                            [[i, local(ms), context.utc(ms), context.utc(window_end(ms))]
                             for i, ms in enumerate(fire_times, start=1)])
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
                CliArgument("--jitter", "a trigger's random delay (5m, 30s): show each start's window, "
                            "or with --trigger that trigger's exact starts", metavar="DURATION"),
                CliArgument("--trigger", "PROJECT/TRIGGER whose delays to draw (with --jitter)",
                            metavar="PROJECT/TRIGGER"),
                CliArgument("--json", "print JSON", switch=True),
            ),
        ),
    ),
)
