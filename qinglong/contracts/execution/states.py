"""States and who may move them: the Run and Attempt state machines.

:data:`RUN_TRANSITIONS` says which actor may move a Run from which state to which;
:func:`check_run_transition` enforces it; :func:`run_state_for` maps an Attempt's state onto its Run's.
"""

from __future__ import annotations

import enum
from typing import Mapping


class RunState(str, enum.Enum):
    """The life of a Run. Terminal states are final: a Run ends in exactly one of them."""

    QUEUED = "queued"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_RUN_STATES


TERMINAL_RUN_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT, RunState.CANCELLED, RunState.LOST}
)


class AttemptState(str, enum.Enum):
    """The life of one Attempt. ``claimed`` is pristine: created (by admission or a retry) and
    not yet touched by any dispatcher; ``not_before_ms`` may hold it back (a retry's backoff)."""

    CLAIMED = "claimed"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_ATTEMPT_STATES


TERMINAL_ATTEMPT_STATES = frozenset(
    {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.TIMED_OUT, AttemptState.CANCELLED,
     AttemptState.LOST}
)


class Actor(str, enum.Enum):
    """Who makes a transition."""

    DISPATCHER = "dispatcher"  # picks a Run, starts its process
    COMPLETION = "completion"  # records a process's end (a receipt, or a verified signal)
    RECONCILER = "reconciler"  # after a restart: re-adopts, takes a receipt, or declares lost
    OPERATOR = "operator"      # `runs cancel`


#: ``(from, to) -> actors allowed``. Anything not listed is illegal.
#:
#: * the dispatcher starts a Run (queued or retry_wait -> dispatching -> running), ends one it
#:   could not start (no such program, no command) or whose cancel request it read before
#:   spawning, and ends a Run that never started when its overlap policy skips it or a replace
#:   supersedes it;
#: * completion records the end of a process it watched, from the receipt and the cancel request
#:   (no receipt and no request: lost), and a retry (-> retry_wait), also when the process ended
#:   before its own running commit landed (a job that exits at once);
#: * the reconciler, after a restart, re-adopts a process (dispatching -> running), returns a
#:   start that provably never happened to the queue, or records an end from the evidence,
#:   whether or not the running commit was made before the crash;
#: * an operator ends at once only a Run with no process (queued, retry_wait); a Run that may hold
#:   one gets a durable cancel request instead, and completion or the reconciler ends it.
RUN_TRANSITIONS: Mapping[tuple[RunState, RunState], frozenset[Actor]] = {
    (RunState.QUEUED, RunState.DISPATCHING): frozenset({Actor.DISPATCHER}),
    (RunState.RETRY_WAIT, RunState.DISPATCHING): frozenset({Actor.DISPATCHER}),
    # a start that never happened (the control plane died before spawning): back to the queue
    (RunState.DISPATCHING, RunState.QUEUED): frozenset({Actor.RECONCILER}),
    (RunState.DISPATCHING, RunState.RUNNING): frozenset({Actor.DISPATCHER, Actor.RECONCILER}),
    # the process could not be started at all (no such program, bad working directory, no
    # command: the dispatcher), or it ran and ended before the running commit: watched (a job
    # that exits at once) or found after a crash
    (RunState.DISPATCHING, RunState.FAILED): frozenset({Actor.DISPATCHER, Actor.COMPLETION,
                                                        Actor.RECONCILER}),
    (RunState.DISPATCHING, RunState.RETRY_WAIT): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    (RunState.DISPATCHING, RunState.LOST): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    (RunState.DISPATCHING, RunState.SUCCEEDED): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    (RunState.DISPATCHING, RunState.TIMED_OUT): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    # also: the dispatcher read a cancel request before it spawned anything (nothing to signal)
    (RunState.DISPATCHING, RunState.CANCELLED): frozenset({Actor.DISPATCHER, Actor.COMPLETION,
                                                           Actor.RECONCILER}),
    (RunState.RUNNING, RunState.SUCCEEDED): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    (RunState.RUNNING, RunState.FAILED): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    (RunState.RUNNING, RunState.TIMED_OUT): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    (RunState.RUNNING, RunState.CANCELLED): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    # the waiter died without a receipt (killed with the job, say): seen live or after a restart
    (RunState.RUNNING, RunState.LOST): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    (RunState.RUNNING, RunState.RETRY_WAIT): frozenset({Actor.COMPLETION, Actor.RECONCILER}),
    # a Run that holds no process may be cancelled directly, or skipped by its overlap policy
    (RunState.QUEUED, RunState.CANCELLED): frozenset({Actor.OPERATOR, Actor.DISPATCHER}),
    (RunState.RETRY_WAIT, RunState.CANCELLED): frozenset({Actor.OPERATOR, Actor.DISPATCHER}),
}


class IllegalTransition(Exception):
    """A store was asked for a transition the state machine forbids: a bug, never user input."""


def check_run_transition(current: RunState | str, target: RunState | str, actor: Actor | str) -> None:
    """Raise :class:`IllegalTransition` unless ``actor`` may move a Run from ``current`` to ``target``."""
    current, target, actor = RunState(current), RunState(target), Actor(actor)
    if actor not in RUN_TRANSITIONS.get((current, target), frozenset()):
        raise IllegalTransition(f"{actor.value} may not move a run from {current.value} to {target.value}")


def run_state_for(attempt_state: AttemptState | str) -> RunState:
    """The Run's state while its current Attempt is in ``attempt_state``."""
    attempt_state = AttemptState(attempt_state)
    if attempt_state is AttemptState.CLAIMED:
        return RunState.QUEUED
    return RunState(attempt_state.value)


__all__ = ["RunState", "TERMINAL_RUN_STATES", "AttemptState", "TERMINAL_ATTEMPT_STATES", "Actor", "RUN_TRANSITIONS",
           "IllegalTransition", "check_run_transition", "run_state_for"]
