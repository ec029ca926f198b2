"""The replicas' expiry decides in Python, through the contracts (control.expiry_decision): the
same outcome, retry and words the worker's own calls get from the SQL copy of the rules."""

from __future__ import annotations

import json
import random

from qinglong.contracts.execution import ExecutionSpec, RetryPolicy, spec_to_payload
from qinglong.contracts.reasons import reason
from qinglong.plugins.cluster_postgres.control import ExpiryDecision, expiry_decision

NOW = 1_800_000_000_000


def _row(state: str, expired: str = "lease", cancel: str | None = None, attempt_no: int = 1,
         retry: RetryPolicy = RetryPolicy(), idempotent: bool = False, spec: object = "pinned") -> dict:
    stored = spec_to_payload(ExecutionSpec(command=("true",), retry=retry, idempotent=idempotent))
    return {"state": state, "expired": expired, "cancel_reason": cancel, "attempt_no": attempt_no,
            "worker_id": "w1", "session_generation": 3, "now_ms": NOW,
            "spec": json.dumps(stored) if spec == "pinned" else spec}


RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=1000, max_backoff_ms=1000, jitter=0.0)


def test_an_unstarted_attempt_goes_back_to_the_queue_unless_a_cancel_was_asked():
    """Requeueing a cancelled Run would run what an operator stopped; ending an unstarted one
    lost would fail a Run that never ran."""
    assert expiry_decision(_row("dispatching")) == ExpiryDecision("requeued")
    words = reason("cancelled_before_start", cancel=reason("cancel_operator"))
    assert expiry_decision(_row("dispatching", cancel="operator", retry=RETRY)) == ExpiryDecision(
        "cancelled", words, stop_words=reason("retry_cancelled"))


def test_a_started_attempt_is_lost_and_retried_only_for_an_idempotent_task():
    """A retried non-idempotent job could run twice; a never retried idempotent one would lose
    the Run."""
    lost = reason("lease_expired", worker_id="w1", generation=3)
    assert expiry_decision(_row("running", retry=RETRY)) == ExpiryDecision(
        "lost", lost, stop_words=reason("retry_lost_not_idempotent"))
    assert expiry_decision(_row("running", retry=RETRY, idempotent=True)) == ExpiryDecision(
        "lost", lost, next_attempt_no=2, retry_after_ms=1000)
    assert expiry_decision(_row("running", retry=RETRY, idempotent=True, attempt_no=3)) == ExpiryDecision(
        "lost", lost, stop_words=reason("retry_attempts_used", attempts=3))


def test_a_long_past_deadline_times_out_and_an_operators_cancel_suppresses_its_retry():
    """A timeout retries as the policy says; a Run an operator cancelled must not come back."""
    words = reason("deadline_unreported")
    assert expiry_decision(_row("running", "deadline", retry=RETRY), random.Random(1)) == ExpiryDecision(
        "timed_out", words, next_attempt_no=2, retry_after_ms=1000)
    assert expiry_decision(_row("running", "deadline", cancel="operator", retry=RETRY)) == ExpiryDecision(
        "timed_out", words)


def test_a_spec_the_worker_could_not_run_is_never_retried_and_shows_no_stop_words():
    """Without a readable policy nothing may be invented: one attempt, as the SQL side reads it."""
    for spec in (None, "null", '{"command": ["true"]}'):
        assert expiry_decision(_row("running", idempotent=True, spec=spec)) == ExpiryDecision(
            "lost", reason("lease_expired", worker_id="w1", generation=3))
