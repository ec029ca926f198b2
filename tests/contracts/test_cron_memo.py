"""The cron provider remembers its answers (a burst asks one question once per trigger): the
remembered answers must be the answers, whatever was asked before, and the memory must stay bounded.

Both schedulers move a cursor to whatever ``next_after`` answers, so a remembered answer that
belonged to another expression, zone or second would fire an occurrence at the wrong time or skip
one for good.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.plugins.cron import provider as cron_provider
from qinglong.plugins.cron.provider import MEMO_SIZE, CronProvider

CRON = CronProvider()

#: Few expressions, zones and instants, so that generated questions share keys and neighbour them
#: (same expression in another zone, same zone another expression, another millisecond of a second).
EXPRESSIONS = ("* * * * *", "*/5 * * * *", "30 2 * * *", "*/10 * * * * *", "0 0 29 2 *", "15 1 * * 0")
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe")
#: Around the Berlin fall-back of 2024 (repeated hour) and the spring-forward gap.
BASES_MS = (1_729_990_800_000, 1_711_846_800_000, 1_704_067_200_000)

questions = st.tuples(
    st.sampled_from(("next", "latest")),
    st.sampled_from(EXPRESSIONS),
    st.sampled_from(ZONES),
    st.builds(lambda base, d: base + d, st.sampled_from(BASES_MS),
              st.one_of(st.integers(-3_000, 3_000), st.integers(-7_200_000, 7_200_000))),
)


def _ask(op: str, expression: str, zone: str, at_ms: int) -> int | None:
    spec = {"expression": expression, "timezone": zone}
    return CRON.next_after(spec, at_ms) if op == "next" else CRON.latest_at_or_before(spec, at_ms)


def _cold(op: str, expression: str, zone: str, at_ms: int) -> int | None:
    """The answer computed afresh: the memory is emptied first."""
    cron_provider._next_after_memo.cache_clear()
    cron_provider._latest_at_or_before_memo.cache_clear()
    return _ask(op, expression, zone, at_ms)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(questions, min_size=1, max_size=40))
def test_a_remembered_occurrence_is_the_one_computed_afresh_whatever_was_asked_before(asked):
    """A key missing the zone, the expression or the direction, or one finer or coarser than the
    answer depends on, would hand one trigger another's occurrence: a Run at the wrong time, or
    none."""
    expected = [_cold(*question) for question in asked]
    cron_provider._next_after_memo.cache_clear()
    cron_provider._latest_at_or_before_memo.cache_clear()
    warm = [_ask(*question) for question in asked]  # asked in order, each after all before it
    again = [_ask(*question) for question in reversed(asked)][::-1]
    assert warm == expected
    assert again == expected


def test_the_memory_keeps_at_most_its_bound_of_answers():
    """An unbounded memory would grow with every distinct (expression, zone, second) a long-running
    scheduler asks about until a router's process is killed for its memory, and every Run with it."""
    spec = CRON.validate({"expression": "* * * * * *", "timezone": "Europe/Berlin"})
    start = 1_704_067_200_000  # 2024-01-01, far from a transition
    for k in range(3 * MEMO_SIZE):
        assert CRON.next_after(spec, start + k * 1_000) == start + (k + 1) * 1_000
        assert CRON.latest_at_or_before(spec, start + k * 1_000 + 999) == start + k * 1_000
    assert cron_provider._next_after_memo.cache_info().currsize <= MEMO_SIZE
    assert cron_provider._latest_at_or_before_memo.cache_info().currsize <= MEMO_SIZE


def test_a_spec_that_fails_fails_again_and_leaves_the_memory_answering_the_others():
    """A failure kept as an answer (or one that spoilt the memory) would hide a broken trigger
    behind a stale result, or make a healthy one fail with it."""
    good = {"expression": "*/5 * * * *", "timezone": "UTC"}
    bad = {"expression": "*/5 * * * *", "timezone": "Not/AZone"}
    at = 1_704_067_200_000
    for _ in range(2):
        try:
            CRON.next_after(bad, at)
        except Exception as exc:  # the zone lookup's own error, every time
            assert "Not/AZone" in str(exc) or type(exc).__name__.endswith("NotFoundError")
        else:
            raise AssertionError("an unknown zone answered")
        assert CRON.next_after(good, at) == at + 300_000
