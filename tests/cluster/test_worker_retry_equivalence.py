"""The retry rule is written twice: in Python (contracts.execution.retry_decision, which the edge
and standalone profiles and the cluster's expiry apply) and in SQL (the cluster's _retry_decision,
which the worker's own calls apply: worker_complete, session close, a failed claim). This
property test holds the two equal, reason strings included."""

from __future__ import annotations

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.contracts.execution import (
    AttemptOutcome,
    AttemptState,
    ExecutionSpec,
    RetryAt,
    RetryPolicy,
    Stop,
    retry_decision,
    spec_to_payload,
)
from qinglong.contracts.records import canonical_json

NOW = 1_800_000_000_000
ENDED = [s for s in AttemptState if s.terminal]


@st.composite
def policies(draw) -> RetryPolicy:
    initial = draw(st.one_of(st.just(0), st.integers(0, 86_400_000)))
    maximum = draw(st.integers(initial, 86_400_000))
    codes = draw(st.one_of(st.none(), st.lists(st.integers(1, 255), min_size=1, max_size=5, unique=True)))
    return RetryPolicy(
        max_attempts=draw(st.integers(1, 100)),
        initial_backoff_ms=initial,
        max_backoff_ms=maximum,
        jitter=draw(st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0, 1))),
        exit_codes=None if codes is None else tuple(sorted(codes)),
        on_timeout=draw(st.booleans()),
    )


def test_sql_retry_decision_equals_the_contracts_retry_decision(cluster):
    """If the two rules drifted, the same failure would be retried on one profile and not on
    another, or a lost job of a non-idempotent task retried (run twice) on the cluster."""
    with psycopg.connect(cluster.dsn("qinglong_owner"), autocommit=True) as conn:

        @settings(max_examples=200, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        @given(policy=policies(), idempotent=st.booleans(), attempt_no=st.integers(1, 120),
               state=st.sampled_from(ENDED), exit_code=st.one_of(st.none(), st.integers(0, 255)),
               started=st.booleans())
        def check(policy, idempotent, attempt_no, state, exit_code, started):
            spec = ExecutionSpec(command=("true",), retry=policy, idempotent=idempotent)
            outcome = AttemptOutcome(state, exit_code=exit_code)
            expected = retry_decision(policy, idempotent, attempt_no, outcome, NOW, started=started)
            got = conn.execute(
                "SELECT next_attempt_no, not_before_ms, stop_state, stop_reason FROM "
                "qinglong._retry_decision(%s::jsonb, %s, %s, %s, %s, %s)",
                (canonical_json(spec_to_payload(spec)), attempt_no, state.value, exit_code, started,
                 NOW)).fetchone()
            if isinstance(expected, Stop):
                assert got == (None, None, expected.state.value, expected.reason)
                return
            assert isinstance(expected, RetryAt)
            next_no, not_before, stop_state, stop_reason = got
            assert (next_no, stop_state, stop_reason) == (expected.attempt_no, None, None)
            delay = min(policy.max_backoff_ms, policy.initial_backoff_ms * 2 ** min(attempt_no - 1, 62))
            assert delay - delay * policy.jitter - 1e-6 <= not_before - NOW <= delay

        check()
