"""Unit tests of the ``interval`` provider: occurrences, the two queries, validation, the hook.

Run from the repository root with ``PYTHONPATH=examples/interval-trigger python -m pytest
examples/interval-trigger/tests`` (Qinglong itself importable), or from this folder after
``pip install -e .[test]``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qinglong_interval
from qinglong.contracts.errors import TriggerSpecError
from qinglong.contracts.providers import TriggerProvider
from qinglong.testing.provider_laws import check_validate_idempotent, provider_law_test
from qinglong_interval import IntervalProvider

INTERVAL = IntervalProvider()
SPECS = st.builds(
    lambda every, anchor: INTERVAL.validate({"every_ms": every, "anchor_ms": anchor}),
    st.one_of(st.sampled_from([1_000, 1_500, 60_000, 86_400_000]), st.integers(1_000, 10**10)),
    st.integers(-(10**13), 10**13),
)
TIMES = st.integers(-(10**13), 4 * 10**12)
LAWS = settings(max_examples=300, deadline=None)


def test_the_hook_offers_one_interval_provider():
    """The host calls this hook; without it the ``interval`` kind would be unknown to every profile."""
    providers = qinglong_interval.qinglong_trigger_providers()
    assert [p.kind for p in providers] == ["interval"]
    assert isinstance(providers[0], TriggerProvider)


def test_the_hook_is_marked_for_the_qinglong_plugin_manager():
    """An unmarked function is ignored by pluggy, so the plugin would load and offer nothing."""
    assert hasattr(qinglong_interval.qinglong_trigger_providers, "qinglong_impl")


def test_occurrences_are_anchor_plus_multiples_of_every():
    """Every 1.5 s from 200 ms: 200, 1700, 3200, ... and -1300 before the anchor."""
    spec = INTERVAL.validate({"every_ms": 1_500, "anchor_ms": 200})
    assert INTERVAL.next_after(spec, 0) == 200
    assert INTERVAL.next_after(spec, 200) == 1_700
    assert INTERVAL.next_after(spec, 1_699) == 1_700
    assert INTERVAL.latest_at_or_before(spec, 199) == -1_300
    assert INTERVAL.latest_at_or_before(spec, 3_200) == 3_200


def test_next_after_is_strict_at_an_occurrence():
    """At exactly an occurrence the next one is a full period later, so that occurrence is not repeated."""
    spec = INTERVAL.validate({"every_ms": 1_000})
    assert INTERVAL.next_after(spec, 1_000) == 2_000
    assert INTERVAL.latest_at_or_before(spec, 1_000) == 1_000


@LAWS
@given(SPECS, TIMES)
def test_repeated_next_after_steps_exactly_one_period(spec, t):
    """Occurrences strictly increase by exactly ``every_ms``: none skipped, none repeated."""
    first = INTERVAL.next_after(spec, t)
    assert first > t and first - t <= spec["every_ms"]
    assert (first - spec["anchor_ms"]) % spec["every_ms"] == 0
    assert INTERVAL.next_after(spec, first) == first + spec["every_ms"]


#: Every trigger-provider law of Qinglong's kit (``qinglong.testing.provider_laws``): validate is
#: idempotent and refuses with ``TriggerSpecError`` naming the field, answers are pure,
#: ``next_after`` strictly increases, ``next_after`` and ``latest_at_or_before`` agree
#: (``fire_once`` admits ``latest_at_or_before(now)`` and moves the cursor to ``next_after(now)``:
#: a disagreement would admit one occurrence twice or never), and the demo's example fires every
#: second.
test_interval_keeps_every_trigger_provider_law = provider_law_test(
    INTERVAL,
    st.one_of(
        st.fixed_dictionaries({"every_ms": st.one_of(st.sampled_from([1_000, 1_500, 60_000]), st.integers(1_000, 10**10))},
                              optional={"anchor_ms": st.integers(-(10**13), 10**13)}),
        st.fixed_dictionaries({"every_ms": st.one_of(st.integers(-5, 999), st.floats(), st.text(), st.booleans())}),
    ),
    TIMES,
    fresh=IntervalProvider,
    max_examples=300,
)


@pytest.mark.parametrize(
    "raw,field",
    [
        ({}, "every_ms"),
        ({"every_ms": 999}, "every_ms"),
        ({"every_ms": 0}, "every_ms"),
        ({"every_ms": -1_000}, "every_ms"),
        ({"every_ms": 1_500.0}, "every_ms"),
        ({"every_ms": "1000"}, "every_ms"),
        ({"every_ms": True}, "every_ms"),
        ({"every_ms": None}, "every_ms"),
        ({"every_ms": 1_000, "anchor_ms": 1.5}, "anchor_ms"),
        ({"every_ms": 1_000, "anchor_ms": "0"}, "anchor_ms"),
        ({"every_ms": 1_000, "anchor_ms": False}, "anchor_ms"),
        ({"every_ms": 1_000, "period": 5}, "period"),
        ({"every": 1_000}, "every"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(raw, field):
    """A bad spec is refused at publish time, naming the field, before anything is written."""
    with pytest.raises(TriggerSpecError) as caught:
        INTERVAL.validate(raw)
    assert (caught.value.kind, caught.value.field) == ("interval", field)
    assert field in str(caught.value)


def test_a_spec_that_is_not_a_table_is_refused():
    """A bare number is not a spec; the error names ``spec``."""
    with pytest.raises(TriggerSpecError) as caught:
        INTERVAL.validate(60_000)  # type: ignore[arg-type]
    assert caught.value.field == "spec"


def test_validation_fills_the_anchor_and_is_idempotent():
    """The stored spec always has both fields, and validating it again returns it unchanged.

    If re-validation changed the spec, publishing the same definition again would create a new
    revision and reset the schedule.
    """
    normalised = check_validate_idempotent(INTERVAL, {"every_ms": 60_000})
    assert normalised == {"every_ms": 60_000, "anchor_ms": 0}
    assert INTERVAL.validate({"every_ms": 1_000, "anchor_ms": -5}) == {"every_ms": 1_000, "anchor_ms": -5}


def test_describe_is_one_readable_line():
    """Operators read this in ``qinglong schedules``."""
    assert INTERVAL.describe(INTERVAL.validate({"every_ms": 30_000})) == "every 30s"
    assert INTERVAL.describe(INTERVAL.validate({"every_ms": 1_500, "anchor_ms": 200})) == "every 1500 ms from 200"


def test_the_demo_example_fires_every_period_from_the_epoch():
    """``qinglong demo`` publishes what ``example_spec`` returns when interval is the first kind
    it asks; a spec below the minimum would be refused at publish."""
    assert INTERVAL.example_spec(1_000) == {"every_ms": 1_000, "anchor_ms": 0}
    assert INTERVAL.example_spec(999) is None
