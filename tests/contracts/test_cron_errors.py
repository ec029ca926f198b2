"""The cron provider's refusals name the field and say why, in place of croniter's wording
(``[61 * * * *] is not acceptable, out of range``, ``failed to find next date``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong.contracts.errors import TriggerSpecError
from qinglong.plugins.cron.fields import FIELDS, SECOND
from qinglong.plugins.cron.provider import CronProvider


def _refusal(expression: str) -> str:
    with pytest.raises(TriggerSpecError) as refused:
        CronProvider().validate({"expression": expression, "timezone": "UTC"})
    return str(refused.value)


@pytest.mark.parametrize("expression, words", [
    ("0 0 31 2 *", "never fires: day 31 of February never occurs (February has at most 29 days)"),
    ("0 0 30 2 *", "day 30 of February never occurs"),
    ("0 0 31 4,6 *", "day 31 of April, June never occurs"),
    ("61 * * * *", "the minute field '61' holds 61; a minute is 0 to 59"),
    ("* 24 * * *", "the hour field '24' holds 24; an hour is 0 to 23"),
    ("* * 0 * *", "the day of month field '0' holds 0; a day of month is 1 to 31"),
    ("* * * 13 *", "the month field '13' holds 13; a month is 1 to 12"),
    ("* * * * 8", "the day of week field '8' holds 8; a day of week is 0 to 7"),
    ("1-70 * * * *", "the minute field '1-70' holds 70"),
    ("*/0 * * * *", "the minute field '*/0' steps by '0'"),
    ("70 * * * * *", "the second field '70' holds 70; a second is 0 to 59"),
    ("x * * * *", "the minute field 'x' is not understood at 'x'"),
    ("* * * jan-foo *", "the month field 'jan-foo' is not understood"),
])
def test_cron_refusals_name_the_field_and_why(expression, words):
    """croniter's wording names no field ('[61 * * * *] is not acceptable') and calls a date that
    never occurs a failure to find one: an operator cannot tell a typo in the minute from a
    February 31 they must rewrite."""
    message = _refusal(expression)
    assert words in message, message
    assert "failed to find next date" not in message and "is not acceptable" not in message


@pytest.mark.parametrize("expression", ["0 0 29 2 *", "0 0 L 2 *", "0 0 * * 5#2", "0 0 * * mon-fri",
                                        "0 0 31 2 1", "@daily", "*/15 * * * * *", "0 0 * * 7"])
def test_expressions_croniter_accepts_are_still_accepted(expression):
    """A check stricter than croniter would refuse schedules users already run (Feb 29 in leap
    years, the last day L, the second Friday 5#2, weekday names, Sunday as 7)."""
    CronProvider().validate({"expression": expression, "timezone": "UTC"})


@given(st.data())
def test_any_number_outside_its_field_is_refused_naming_that_field(data):
    """Whichever field holds the bad number, the message names that field (not the first, not
    the expression as a whole) and its range."""
    six = data.draw(st.booleans())
    specs = ((SECOND,) + FIELDS) if six else FIELDS
    index = data.draw(st.integers(0, len(specs) - 1))
    name, low, high = specs[index]
    bad = data.draw(st.one_of(st.integers(high + 1, 999), st.integers(0, low - 1) if low > 0 else st.nothing()))
    fields = ["*"] * len(specs)
    fields[index] = str(bad)
    message = _refusal(" ".join(fields))
    article = "an" if name == "hour" else "a"
    assert f"the {name} field '{bad}' holds {bad}; {article} {name} is {low} to {high}" in message


@given(after_s=st.integers(min_value=-62_135_596_800, max_value=253_402_300_799),
       expression=st.sampled_from(["* * * * *", "0 0 * * *", "*/7 * * * * *", "0 0 29 2 *"]),
       zone=st.sampled_from(["UTC", "America/New_York", "Pacific/Kiritimati", "Europe/Berlin"]))
def test_next_and_latest_never_raise_at_the_edges_of_the_calendar(after_s, expression, zone):
    """Near year 9999 (or year 1) croniter's dates overflow: the scheduler and ``cron next`` would
    end in a traceback instead of finding no further occurrence."""
    provider = CronProvider()
    spec = provider.validate({"expression": expression, "timezone": zone})
    nxt = provider.next_after(spec, after_s * 1000)
    assert nxt is None or after_s * 1000 < nxt <= 253_402_300_799_000
    latest = provider.latest_at_or_before(spec, after_s * 1000)
    assert latest is None or -62_135_596_800_000 <= latest <= after_s * 1000
