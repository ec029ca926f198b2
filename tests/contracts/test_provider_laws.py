"""The trigger-provider laws of ``qinglong.testing.provider_laws``, applied to the built-in cron
provider, and shown to catch each kind of broken provider a plugin author could ship.

The same functions are what a third party's tests call with its own provider
(``examples/interval-trigger/tests``); if they stopped catching a broken provider, a kind that
loses or duplicates Runs would pass its author's tests.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import strategies as st

from qinglong.contracts.errors import TriggerSpecError
from qinglong.plugins.cron.provider import CronProvider
from qinglong.testing.provider_laws import (
    LawViolation,
    check_agreement,
    check_example_spec,
    check_next_after,
    check_provider_laws,
    check_purity,
    check_validate_idempotent,
    provider_law_test,
)

#: Around the 2024 transitions of Berlin and New York, where cron's wall times jump or repeat.
TRANSITIONS_MS = (1_711_846_800_000, 1_729_990_800_000, 1_710_054_000_000, 1_730_613_600_000)
INSTANTS = st.one_of(st.integers(1_577_836_800_000, 2_082_758_400_000),
                     st.builds(lambda t, d: t + d, st.sampled_from(TRANSITIONS_MS),
                               st.integers(-3 * 3_600_000, 3 * 3_600_000)))
CRON_SPECS = st.fixed_dictionaries({
    "expression": st.one_of(
        st.sampled_from(["* * * * * *", "*/15 * * * * *", "30 2 * * *", "0 1-3 * * *", "@daily",
                         "@hourly", "0 0 29 2 *", "59 23 31 12 *", "5 4 * * 0,6"]),
        st.builds("{} {} * * *".format, st.integers(0, 59), st.integers(0, 23)),
        st.just("R 0 * * *"), st.just("61 * * * *"), st.just(""),
    ),
    "timezone": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
                                 "Nowhere/City"]),
})

test_cron_keeps_every_trigger_provider_law = provider_law_test(
    CronProvider(), CRON_SPECS, INSTANTS, fresh=CronProvider, max_examples=300)


class Every:
    """A correct fixed-period provider; the broken ones below each change one thing."""

    kind = "every"

    def validate(self, spec):
        if not isinstance(spec.get("ms"), int) or spec["ms"] < 1:
            raise TriggerSpecError(self.kind, "ms", "expected a positive integer")
        return {"ms": spec["ms"]}

    def next_after(self, spec, after_ms):
        return (after_ms // spec["ms"] + 1) * spec["ms"]

    def latest_at_or_before(self, spec, at_ms):
        return at_ms // spec["ms"] * spec["ms"]

    def describe(self, spec):
        return f"every {spec['ms']} ms"

    def example_spec(self, every_ms):
        return {"ms": every_ms}


class NotIdempotent(Every):
    def validate(self, spec):
        return {"ms": spec["ms"], "seen": spec.get("seen", 0) + 1}


class RefusesWithAnyError(Every):
    def validate(self, spec):
        raise ValueError("bad spec")


class ReadsState(Every):
    calls = itertools.count()

    def next_after(self, spec, after_ms):
        return super().next_after(spec, after_ms) + (next(self.calls) % 2) * spec["ms"]


class Stalls(Every):
    def next_after(self, spec, after_ms):
        return after_ms // spec["ms"] * spec["ms"] or spec["ms"]


class LatestOffByOne(Every):
    def latest_at_or_before(self, spec, at_ms):
        return super().latest_at_or_before(spec, at_ms) - spec["ms"]


class WrongExample(Every):
    def example_spec(self, every_ms):
        return {"ms": every_ms * 2}


def test_a_correct_provider_passes_every_law():
    """The checks must accept a provider that keeps the laws, or authors would learn to ignore them."""
    provider = Every()
    spec = check_validate_idempotent(provider, {"ms": 1000})
    for at in (-1, 0, 1, 999, 1000, 1_700_000_000_123):
        check_provider_laws(provider, spec, at, fresh=Every)
    assert check_validate_idempotent(provider, {"ms": 0}) is None  # a refusal naming its field is fine


@pytest.mark.parametrize("provider, check, law", [
    (NotIdempotent(), lambda p: check_validate_idempotent(p, {"ms": 1000}), "validate is idempotent"),
    (RefusesWithAnyError(), lambda p: check_validate_idempotent(p, {"ms": 1000}), "refusals are TriggerSpecError"),
    (ReadsState(), lambda p: check_purity(p, {"ms": 1000}, 5_500), "the same inputs give the same answers"),
    (Stalls(), lambda p: check_next_after(p, {"ms": 1000}, 5_500), "next_after is strictly increasing"),
    (LatestOffByOne(), lambda p: check_agreement(p, {"ms": 1000}, 5_500), "next_after and latest_at_or_before agree"),
    (WrongExample(), lambda p: check_example_spec(p, 5_500), "an example spec fires at its period"),
])
def test_each_broken_provider_is_caught_naming_the_law(provider, check, law):
    """Each of these providers would lose or duplicate Runs (or create a revision per republish);
    the kit must fail its author's test with the law it broke."""
    with pytest.raises(LawViolation, match=f"trigger kind 'every' breaks '{law}'"):
        check(provider)
