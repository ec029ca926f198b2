"""The one table of reason strings (contracts.reasons) and the rules that print from it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong.contracts.execution import (
    CancelReason,
    ConcurrencyMode,
    ConcurrencyPolicy,
    ExecutionSpec,
    RetryPolicy,
    spec_to_payload,
)
from qinglong.contracts.reasons import REASONS, fields, reason, sql_reason_function
from qinglong.contracts.stored_spec import MISSING, stored_retry_policy, stored_spec_problem


def test_every_template_names_its_values_and_holds_no_other_brace():
    """A stray brace would print literally on one side and be a value on the other."""
    for key, template in REASONS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", key), key
        stripped = re.sub(r"\{[a-z_]+\}", "", template)
        assert "{" not in stripped and "}" not in stripped, key


def test_a_reason_needs_exactly_its_values():
    """A value left out (or misspelt) would print a template's braces to an operator."""
    assert fields("retry_scheduled") == ("attempt_no", "state", "what", "next_attempt_no", "not_before")
    assert reason("retry_attempts_used", attempts=3) == "all 3 attempts used"
    with pytest.raises(TypeError):
        reason("retry_attempts_used")
    with pytest.raises(TypeError):
        reason("retry_succeeded", extra=1)
    with pytest.raises(KeyError):
        reason("no_such_reason")


def test_the_generated_sql_holds_every_key_once_with_its_quotes_doubled():
    """A key left out of the SQL would raise in a worker's call; a quote not doubled would end
    the SQL string early."""
    text = sql_reason_function()
    for key in REASONS:
        assert text.count(f"WHEN '{key}' THEN") == 1, key
    assert "concurrency ''forbid''" in text


@st.composite
def specs(draw) -> ExecutionSpec:
    mode = draw(st.sampled_from(list(ConcurrencyMode)))
    return ExecutionSpec(
        command=("true",),
        concurrency=ConcurrencyPolicy(mode, draw(st.one_of(st.none(), st.integers(1, 9)))
                                      if mode is ConcurrencyMode.ALLOW else None),
        retry=RetryPolicy(max_attempts=draw(st.integers(1, 20)), jitter=draw(st.floats(0, 1)),
                          exit_codes=draw(st.one_of(st.none(), st.tuples(st.integers(1, 255)))),
                          on_timeout=draw(st.booleans())),
        idempotent=draw(st.booleans()), labels=draw(st.sampled_from([(), ("a", "b")])))


@given(spec=specs())
def test_every_published_spec_is_runnable_by_a_worker_with_its_own_policy(spec):
    """A spec the publisher writes that the stored-spec rule refused would fail every Run of the
    task on the cluster; a policy read back differently would retry differently."""
    stored = spec_to_payload(spec)
    assert stored_spec_problem(stored) is None
    assert stored_retry_policy(stored) == (spec.retry, spec.idempotent)


def test_a_stored_spec_that_cannot_be_run_is_named_and_never_retried():
    """A missing or broken spec must fail its Run with a reason, not run with invented defaults."""
    assert stored_spec_problem(MISSING) == reason("spec_missing")
    assert stored_spec_problem(None) == reason("spec_no_command")
    assert stored_spec_problem({"command": ["true"]}) == reason("spec_invalid")
    assert stored_retry_policy({"command": ["true"]}) == (RetryPolicy(max_attempts=1), False)


def test_cancel_words_come_from_the_table():
    """Each cancel reason must have its words, or a cancelled Run would record none."""
    from qinglong.contracts.execution import cancel_words

    assert {cancel_words(c) for c in CancelReason} == {REASONS[f"cancel_{c.value}"] for c in CancelReason}
