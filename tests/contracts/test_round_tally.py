"""The round counters have one definition: RoundReport (frozen) and RoundTally (while counting)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, strategies as st

from qinglong.contracts.records import ROUND_COUNTERS, RoundReport, RoundTally


def test_report_and_tally_hold_exactly_the_same_counters():
    """A counter added to one and not the other would be dropped between a round and its report
    (or between reports and a loop's totals) without any error."""
    report_fields = {f.name for f in dataclasses.fields(RoundReport)} - {"duration_ms", "more_due"}
    tally_fields = {f.name for f in dataclasses.fields(RoundTally)} - {"more_due"}
    assert report_fields == tally_fields == set(ROUND_COUNTERS)


counts = st.fixed_dictionaries({name: st.integers(0, 10_000) for name in ROUND_COUNTERS})


@given(st.lists(counts, max_size=8), st.booleans())
def test_a_tally_of_reports_is_their_sum_and_freezes_to_itself(rounds, more_due):
    """Loop totals are the sum of the rounds' counters, field by field; none is lost or doubled."""
    total = RoundTally()
    for values in rounds:
        total.add(RoundReport(**values, duration_ms=1, more_due=True))
    for name in ROUND_COUNTERS:
        assert getattr(total, name) == sum(values[name] for values in rounds)
    assert total.more_due is False  # a round's flag, never summed
    total.more_due = more_due
    frozen = total.report(7)
    assert frozen == RoundReport(**{n: getattr(total, n) for n in ROUND_COUNTERS},
                                 duration_ms=7, more_due=more_due)
