"""Outcomes and retries: how an Attempt ended, from the evidence only, and whether another follows.

:func:`classify_outcome` gives the terminal state from a completion receipt and a durable cancel
request (never ``succeeded`` without a receipt); :func:`retry_decision` says retry at T, or stop.
"""

from __future__ import annotations

import enum
import random

from ..frozen import record
from ..reasons import reason
from .spec import RetryPolicy
from .states import AttemptState, RunState


class CancelReason(str, enum.Enum):
    """Why a durable cancel request was written before any signal was sent."""

    TIMEOUT = "timeout"
    OPERATOR = "operator"
    REPLACED = "replaced"   # a newer Run of a `replace` task
    SHUTDOWN = "shutdown"   # `[execution] on_stop = "terminate"`


def cancel_words(cancel: "CancelReason | str") -> str:
    """What a durable cancel request's reason says in words (the reasons table's ``cancel_*``)."""
    return reason("cancel_" + CancelReason(cancel).value)


@record
class Receipt:
    """What the process's waiter wrote when the process ended: proof of its outcome.

    ``exit_code`` is the program's status (0-255) or None when it died of ``signal``.
    ``dropped_bytes`` counts output beyond the log limit (discarded, the job kept running).
    """

    exit_code: int | None
    signal: int | None
    ended_at_ms: int
    log_bytes: int
    dropped_bytes: int = 0
    #: What else the waiter saw, in words (processes the job left holding its output), or None.
    note: str | None = None
    #: How much later than ``ended_at_ms`` the end may truly have been: a time read from a file's
    #: modification stamp comes from the kernel's coarse clock, which lags by up to one tick.
    ended_slack_ms: int = 0


@record
class AttemptOutcome:
    """How an Attempt ended, as recorded exactly once."""

    state: AttemptState
    exit_code: int | None = None
    signal: int | None = None
    ended_at_ms: int | None = None
    log_bytes: int | None = None
    log_dropped_bytes: int = 0
    reason: str | None = None  # why, in words (a start error, why it is lost, what cancelled it)


def classify_outcome(receipt: Receipt | None, cancel: CancelReason | str | None, *,
                     lost_reason: str = "the process ended without a completion receipt",
                     requested_at_ms: int | None = None) -> AttemptOutcome:
    """The outcome the evidence supports. A receipt gives the exit status; a cancel request that
    was written before its signals makes the end ``timed_out`` or ``cancelled`` (the status is
    kept when a receipt exists, and the reason says the job exited after the request); with
    neither, the Attempt is ``lost`` (never ``succeeded`` without a receipt).

    ``requested_at_ms``: when the cancel request was written, on the clock of the receipt's end
    time. A job whose receipt proves it ended before that (even at the latest its clock allows)
    was not ended by the request (its signals follow the request): its own exit is its outcome."""
    if (cancel is not None and receipt is not None and requested_at_ms is not None
            and receipt.ended_at_ms + max(0, receipt.ended_slack_ms) < requested_at_ms):
        cancel = None
    if cancel is not None:
        # The request was durable before any signal, so it explains the end whatever the status:
        # an exit 0 may be a job that traps TERM and exits cleanly, which is no proof its work was
        # done. The receipt's status is kept beside the state for the operator to read.
        cancel = CancelReason(cancel)
        state = AttemptState.TIMED_OUT if cancel is CancelReason.TIMEOUT else AttemptState.CANCELLED
        reason = cancel_words(cancel)
        if receipt is not None and receipt.exit_code is not None:
            reason += f"; the job exited {receipt.exit_code} after the request"
        return _from_receipt(state, receipt, reason)
    if receipt is None:
        return AttemptOutcome(AttemptState.LOST, reason=lost_reason)
    return _from_receipt(AttemptState.SUCCEEDED if receipt.exit_code == 0 else AttemptState.FAILED,
                         receipt, None)


def _from_receipt(state: AttemptState, receipt: Receipt | None, reason: str | None) -> AttemptOutcome:
    if receipt is None:
        return AttemptOutcome(state, reason=reason)
    if receipt.note:
        reason = f"{reason}; {receipt.note}" if reason else receipt.note
    return AttemptOutcome(state, receipt.exit_code, receipt.signal, receipt.ended_at_ms,
                          receipt.log_bytes, receipt.dropped_bytes, reason)


@record
class RetryAt:
    """Create Attempt ``attempt_no`` (not before ``at_ms``)."""

    attempt_no: int
    at_ms: int


@record
class Stop:
    """No further Attempt; the Run ends in ``state``."""

    state: RunState
    reason: str


def backoff_ms(policy: RetryPolicy, attempt_no: int, rng: random.Random | None = None) -> int:
    """Delay before Attempt ``attempt_no + 1``: ``initial * 2**(attempt_no-1)`` capped at ``max``,
    of which the ``jitter`` fraction is drawn uniformly (so the delay lies in
    ``[(1-jitter)*d, d]``)."""
    exponent = min(max(attempt_no - 1, 0), 62)
    delay = min(policy.max_backoff_ms, policy.initial_backoff_ms * (2 ** exponent))
    if policy.jitter and delay:
        rng = rng or random.Random()
        # subtract the random part, so the delay never exceeds d nor falls below (1-jitter)*d
        delay -= int(rng.random() * delay * min(policy.jitter, 1.0))
    return max(delay, 0)


def retry_decision(policy: RetryPolicy, idempotent: bool, attempt_no: int, outcome: AttemptOutcome,
                   now_ms: int, rng: random.Random | None = None, *, started: bool = True) -> RetryAt | Stop:
    """After Attempt ``attempt_no`` ended with ``outcome``: retry at T, or stop in a terminal state.

    ``started`` is False when the process could not be started at all (never retried: the same
    program is missing next time too)."""
    if not outcome.state.terminal:
        raise ValueError(f"retry_decision needs an ended attempt, not one {outcome.state.value}")
    if attempt_no < 1:
        raise ValueError(f"attempt numbers start at 1, not {attempt_no}")
    state = RunState(outcome.state.value)
    if outcome.state is AttemptState.SUCCEEDED:
        return Stop(RunState.SUCCEEDED, reason("retry_succeeded"))
    if outcome.state is AttemptState.CANCELLED:
        return Stop(state, reason("retry_cancelled"))
    if not started:
        return Stop(state, reason("retry_not_started"))
    if attempt_no >= policy.max_attempts:
        if policy.max_attempts == 1:
            return Stop(state, reason("retry_none_configured"))
        return Stop(state, reason("retry_attempts_used", attempts=policy.max_attempts))
    if outcome.state is AttemptState.LOST and not idempotent:
        return Stop(state, reason("retry_lost_not_idempotent"))
    if outcome.state is AttemptState.TIMED_OUT and not policy.on_timeout:
        return Stop(state, reason("retry_timeout_not_retried"))
    if outcome.state is AttemptState.FAILED and policy.exit_codes is not None:
        if outcome.exit_code not in policy.exit_codes:
            status = outcome.exit_code if outcome.exit_code is not None else reason("retry_exit_by_signal")
            return Stop(state, reason("retry_exit_not_listed", status=status))
    return RetryAt(attempt_no + 1, now_ms + backoff_ms(policy, attempt_no, rng))


__all__ = ["CancelReason", "cancel_words", "Receipt", "AttemptOutcome", "classify_outcome", "RetryAt", "Stop",
           "backoff_ms", "retry_decision"]
