"""``qinglong trigger add --kind interval --every 30s [--anchor-ms MS]``.

Declared through the ``qinglong_trigger_cli_options`` hook: the host adds these options to
``trigger add`` and ``trigger update`` and hands their text here, so it never needs to know what an
interval is. ``--kind interval --spec '{"every_ms": 30000}'`` keeps working as for any kind.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from qinglong.contracts.errors import UserError
from qinglong.contracts.providers import TriggerCliOption, TriggerCliOptions

from .provider import KIND

#: Milliseconds per unit of ``--every``.
UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration_ms(option: str, text: str) -> int:
    """``30s`` -> 30000: a whole number and one unit of ms, s, m, h or d."""
    match = _DURATION.match(text)
    if match is None:
        raise UserError(f"{option} {text!r} is not a duration: give a whole number and a unit "
                        "(ms, s, m, h or d), such as 30s or 5m")
    return int(match.group(1)) * UNITS[match.group(2)]


def spec_from_cli(given: Mapping[str, str], current: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"every_ms", "anchor_ms"}``; on ``trigger update`` an option left out keeps its value."""
    spec: dict[str, Any] = dict(current or {})
    if "every" in given:
        spec["every_ms"] = parse_duration_ms("--every", given["every"])
    elif current is None:
        raise UserError("an interval trigger needs --every DURATION, such as --every 30s")
    if "anchor_ms" in given:
        try:
            spec["anchor_ms"] = int(given["anchor_ms"], 10)
        except ValueError:
            raise UserError(f"--anchor-ms {given['anchor_ms']!r} is not a whole number of milliseconds") from None
    return spec


INTERVAL_CLI_OPTIONS = TriggerCliOptions(
    kind=KIND,
    options=(
        TriggerCliOption("--every", "interval between Runs: a number and ms, s, m, h or d (30s, 5m)",
                         metavar="DURATION"),
        TriggerCliOption("--anchor-ms", "epoch ms that fixes the phase of the interval (default 0)", metavar="MS"),
    ),
    to_spec=spec_from_cli,
    usage="--every DURATION [--anchor-ms MS]",
)
