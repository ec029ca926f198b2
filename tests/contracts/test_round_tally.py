"""The round counters have one definition: RoundReport (frozen) and RoundTally (while counting)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, strategies as st

from qinglong.contracts.records import ROUND_COUNTERS, ROUND_SAMPLES, RoundReport, RoundTally


def test_report_and_tally_hold_exactly_the_same_counters():
    """A counter or sample added to one and not the other would be dropped between a round and
    its report (or between reports and a loop's totals) without any error."""
    report_fields = {f.name for f in dataclasses.fields(RoundReport)} - {"duration_ms", "more_due"}
    tally_fields = {f.name for f in dataclasses.fields(RoundTally)} - {"more_due"}
    assert report_fields == tally_fields == set(ROUND_COUNTERS) | set(ROUND_SAMPLES)
    assert not set(ROUND_COUNTERS) & set(ROUND_SAMPLES)


def test_a_tally_freezes_its_samples_and_a_loop_never_accumulates_them():
    """A round's lags reach its report (the lag histogram); a loop summing them into its totals
    would grow without bound over a long-running process."""
    tally = RoundTally(admitted=2)
    tally.admission_lags_ms += [3, 5]
    tally.skipped_policies.append("skip")
    report = tally.report(1)
    assert report.admission_lags_ms == (3, 5) and report.skipped_policies == ("skip",)
    total = RoundTally()
    total.add(report)
    total.add(report)
    assert total.admitted == 4 and total.admission_lags_ms == [] and total.skipped_policies == []


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
