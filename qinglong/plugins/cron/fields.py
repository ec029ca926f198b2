"""What is wrong with a cron expression, in words that name the field and why.

croniter says ``[61 * * * *] is not acceptable, out of range`` or ``failed to find next date``;
these checks run around it so an operator reads which field holds what, the range it allows, or
that the day of month never occurs in the months named (February 31).
"""

from __future__ import annotations

import calendar
import re

from qinglong.contracts.cli import whole_number
from qinglong.contracts.errors import quoted

#: The fields of a 5-field expression, with their ranges (6 fields: ``second`` 0-59 first).
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
          ("day of week", 0, 7))
SECOND = ("second", 0, 59)
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_ITEM = re.compile(r"^(\*|[0-9a-z]+)(?:-([0-9a-z]+))?(?:/([0-9]+))?$")


def field_specs(count: int) -> tuple[tuple[str, int, int], ...]:
    """The (name, low, high) of each field of an expression of ``count`` fields."""
    return (SECOND,) + FIELDS if count == 6 else FIELDS


def _number(token: str) -> int | None:
    """A token of ASCII digits as its number, else None (``str.isdigit`` is true for ``²`` too,
    which ``int`` refuses). Past 18 digits it is past every field's range, whatever its value."""
    if not (token.isascii() and token.isdigit()):
        return None
    return whole_number(token) if len(token) <= 18 else 10**18


def _value(name: str, token: str) -> int | None:
    number = _number(token)
    if number is not None:
        return number
    names = _MONTHS if name == "month" else _DAYS if name == "day of week" else {}
    return names.get(token.lower())


def out_of_range(expression: str, fields: list[str]) -> str | None:
    """The first number outside its field's range, or a step of 0, said in words; else None."""
    for (name, low, high), field in zip(field_specs(len(fields)), fields):
        for item in field.split(","):
            base, _, step = item.partition("/")
            if step and not (_number(step) or 0) >= 1:
                return (f"{quoted(expression)}: the {name} field {quoted(field)} steps by {quoted(step)}; "
                        f"expected a whole number from 1 to {high}")
            for bound in base.split("-"):
                number = _number(bound)
                if number is not None and not low <= number <= high:
                    article = "an" if name == "hour" else "a"
                    shown = number if len(bound) <= 18 else bound[:18] + "..."
                    return (f"{quoted(expression)}: the {name} field {quoted(field)} holds {shown}; "
                            f"{article} {name} is {low} to {high}")
    return None


def not_understood(expression: str, fields: list[str]) -> str | None:
    """The first item no plain cron syntax reads (``*``, ``5``, ``1-5``, ``*/15``, ``mon``), named
    by its field; None when every item is plain (croniter refused something subtler)."""
    for (name, low, high), field in zip(field_specs(len(fields)), fields):
        for item in field.split(","):
            match = _ITEM.match(item.lower())
            ok = match is not None and all(
                part is None or part == "*" or _value(name, part) is not None for part in match.group(1, 2))
            if not ok and not (name in ("day of month", "day of week") and ("l" in item.lower() or "#" in item)):
                return (f"{quoted(expression)}: the {name} field {quoted(field)} is not understood at "
                        f"{quoted(item)}; expected "
                        f"*, a number from {low} to {high}, a range (1-5), a list (1,15) or a step (*/15)")
    return None


def _expand(name: str, field: str, low: int, high: int) -> set[int] | None:
    """The values a plain field names, or None when it is not plain (L, #, ...)."""
    values: set[int] = set()
    for item in field.lower().split(","):
        match = _ITEM.match(item)
        if match is None:
            return None
        first, last, step = match.groups()
        if first == "*":
            start, end = low, high
        else:
            start = _value(name, first)
            end = _value(name, last) if last is not None else (high if step else start)
            if start is None or end is None:
                return None
        values.update(range(start, end + 1, int(step) if step else 1))
    return values


def never_fires(expression: str, fields: list[str]) -> str:
    """Why croniter found no date: which days never occur in which months, when the fields say
    it plainly (February 31, April 31); otherwise that no date matches within 50 years."""
    specs = field_specs(len(fields))
    named = dict(zip((name for name, _, _ in specs), fields))
    days = _expand("day of month", named["day of month"], 1, 31)
    months = _expand("month", named["month"], 1, 12)
    if days and months and named["day of week"] == "*":
        longest = {month: 29 if month == 2 else calendar.monthrange(2001, month)[1] for month in months}
        if min(days) > max(longest.values()):
            month_names = ", ".join(calendar.month_name[m] for m in sorted(months))
            day_list = ", ".join(str(d) for d in sorted(days))
            return (f"{quoted(expression)} never fires: day {day_list} of {month_names} never occurs "
                    f"({', '.join(f'{calendar.month_name[m]} has at most {n} days' for m, n in sorted(longest.items()))})")
    return (f"{quoted(expression)} never fires: no date within 50 years matches its day of month, month and "
            "day of week together")
