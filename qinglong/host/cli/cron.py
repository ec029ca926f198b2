"""``qinglong cron next``: the one command about a trigger kind itself (see docs/plugins.md)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from qinglong.contracts.errors import ExitCode, PluginLoadError, UserError

from .output import iso, now_ms, print_json, print_table
from .parsing import add_command, add_json_flag, positive_count


def cmd_cron_next(args: argparse.Namespace) -> int:
    """Preview the next fire times of a cron expression, through the cron trigger provider."""
    from zoneinfo import ZoneInfo

    from ..plugins import PluginHost

    if args.timezone is not None and not args.timezone.strip():
        raise UserError("--timezone is empty: give an IANA time zone such as 'Europe/Berlin', "
                        "or leave the option out for UTC")
    host = PluginHost()
    host.load(["cron"], required_by="'qinglong cron next'")
    provider = host.trigger_providers().get("cron")
    if provider is None:
        raise PluginLoadError("no loaded plugin provides the 'cron' trigger kind")
    spec = provider.validate({"expression": args.expression, "timezone": args.timezone or "UTC"})
    zone = ZoneInfo(spec["timezone"])
    after_ms = now_ms() if args.after is None else _parse_time("--after", args.after, zone)
    fire_times: list[int] = []
    cursor = after_ms
    while len(fire_times) < args.count:
        nxt = provider.next_after(spec, cursor)
        if nxt is None:
            break
        fire_times.append(nxt)
        cursor = nxt

    def local(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="seconds")

    if args.json:
        print_json({"expression": spec["expression"], "timezone": spec["timezone"],
                     "describe": provider.describe(spec), "after_ms": after_ms,
                     "fire_times": [{"at_ms": ms, "local": local(ms), "utc": iso(ms)} for ms in fire_times]})
        return ExitCode.OK
    print(f"{provider.describe(spec)}, after {iso(after_ms)}:")
    print_table(["#", "local", "utc"], [[i, local(ms), iso(ms)] for i, ms in enumerate(fire_times, start=1)])
    if len(fire_times) < args.count:
        print("(no further fire times)")
    return ExitCode.OK


def _parse_time(option: str, text: str, zone: Any) -> int:
    """An ISO 8601 time as epoch ms; without an offset it is a wall time in ``zone``."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"{option} {text!r} is not an ISO 8601 time such as 2026-03-29T01:30:00+01:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    return int(moment.timestamp() * 1000)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``cron next``."""
    cron = add_command(sub, common, "cron", "cron expressions: preview fire times", None)
    cron_sub = cron.add_subparsers(dest="cron_command", metavar="SUBCOMMAND", required=True)
    p = cron_sub.add_parser("next", parents=[common], help="the next fire times of a cron expression",
                            description="The next fire times of a cron expression, computed by the cron "
                                        "trigger provider exactly as the scheduler computes them "
                                        "(daylight-saving rule included).")
    p.add_argument("expression", metavar="EXPR",
                   help="5 fields, 6 with seconds first, or @hourly/@daily/@midnight/@weekly/@monthly/@yearly")
    p.add_argument("--timezone", default=None, metavar="ZONE", help="IANA time zone (default UTC)")
    p.add_argument("--count", type=positive_count, default=5, help="how many fire times (default 5)")
    p.add_argument("--after", default=None, metavar="TIME",
                   help="start after this ISO 8601 time (default now; without an offset, in --timezone)")
    add_json_flag(p)
    p.set_defaults(func=cmd_cron_next)
