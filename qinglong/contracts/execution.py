"""Execution: what a task runs, the Run/Attempt state machine, and the pure decisions around it.

Everything here is pure and profile-neutral, so the local dispatcher of the edge and standalone
profiles and the cluster's remote workers share it unchanged:

* :class:`ExecutionSpec` — the part of a task revision that says what to run and how (parsed from
  the task payload by :func:`parse_execution_spec`, refused key by key);
* the state machine — :data:`RUN_TRANSITIONS` says which actor may move a Run from which state to
  which, :func:`check_run_transition` enforces it;
* :func:`retry_decision` — after an Attempt ended: retry at T, or stop;
* :func:`overlap_decision` — may this Run start now, given what of its task is running;
* :func:`classify_outcome` — the terminal state an Attempt ends in, from the evidence only
  (a completion receipt, a durable cancel request); never ``succeeded`` without a receipt.

Times are integer epoch milliseconds; durations are milliseconds.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from .errors import UserError
from .reasons import reason

# --------------------------------------------------------------------------------------------
# States and who may move them
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# The execution spec: part of the task revision (the task payload) and of its digest
# --------------------------------------------------------------------------------------------


class ConcurrencyMode(str, enum.Enum):
    """What a Run does when Runs of the same task are still active."""

    ALLOW = "allow"      # start, up to max_running of this task at once; later ones wait
    FORBID = "forbid"    # skip (cancelled, with the reason recorded) while one is active
    REPLACE = "replace"  # cancel the active one(s), start when they are gone
    QUEUE = "queue"      # wait until none is active; one at a time, in scheduled order


@dataclass(frozen=True, slots=True)
class ConcurrencyPolicy:
    mode: ConcurrencyMode = ConcurrencyMode.ALLOW
    #: ``allow`` only: most Runs of this task active at once (None: only the global limit).
    max_running: int | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When an ended Attempt gets a successor.

    ``max_attempts`` counts every Attempt (1: never retry). ``exit_codes``: the exit codes that
    retry (None: any non-zero). A timeout retries when ``on_timeout``. A ``lost`` Attempt (the
    process's fate is unknown: it may have run to the end) retries only if the task is
    ``idempotent``. A cancelled Attempt or one that could not start never retries.
    """

    max_attempts: int = 1
    initial_backoff_ms: int = 10_000
    max_backoff_ms: int = 600_000
    #: Fraction of each delay that is randomised away (0: exact backoff, 1: full jitter).
    jitter: float = 0.5
    exit_codes: tuple[int, ...] | None = None
    on_timeout: bool = True


_DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class ExecutionSpec:
    """What one Attempt runs. ``command`` is an argv: a shell only if the user writes ``sh -c``."""

    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    timeout_ms: int = 3_600_000
    concurrency: ConcurrencyPolicy = field(default_factory=ConcurrencyPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    idempotent: bool = False
    log_limit_bytes: int = 4 * 1024 * 1024
    executor: str = "local_process"
    #: Labels a cluster worker must offer to run this task (all of them). A local profile runs
    #: every Run on its own machine and does not read them.
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExecutionLimits:
    """A profile's defaults and caps for execution specs (from ``[execution]`` and the profile)."""

    default_timeout_ms: int = 3_600_000
    max_timeout_ms: int = 7 * 24 * 3_600_000
    default_log_limit_bytes: int = 4 * 1024 * 1024
    max_log_limit_bytes: int = 4 * 1024 * 1024
    max_attempts_cap: int = 20
    default_executor: str = "local_process"


#: The widest limits any profile may have: what a publisher enforces whatever the profile.
CONTRACT_LIMITS = ExecutionLimits(
    default_timeout_ms=3_600_000,
    max_timeout_ms=30 * 24 * 3_600_000,
    default_log_limit_bytes=4 * 1024 * 1024,
    max_log_limit_bytes=1024 * 1024 * 1024,
    max_attempts_cap=100,
)

#: The payload keys the execution spec reads; any other key is the task's own data.
EXECUTION_KEYS = ("command", "env", "working_dir", "timeout_ms", "concurrency", "retry", "idempotent",
                  "log_limit_bytes", "executor", "labels")

#: Environment variable names a task may not set: the ones the executor sets for each Attempt.
_RESERVED_ENV_PREFIXES = ("QINGLONG_",)
_MAX_ENV_ENTRIES = 256


def _refuse(task_id: str, key: str, expected: str, value: Any = None, *, show: bool = True) -> UserError:
    shown = f" (got {_short(value)})" if show else ""
    return UserError(f"task {task_id!r}: {key}: expected {expected}{shown}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_unicode(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (no lone surrogate), so it can be stored and passed on."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _int(task_id: str, key: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise _refuse(task_id, key, f"an integer from {lo} to {hi}", value)
    return value


def _bool(task_id: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refuse(task_id, key, "true or false", value)
    return value


def _table(task_id: str, key: str, value: Any, allowed: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _refuse(task_id, key, "a table", value)
    unknown = sorted((str(k) for k in value if k not in allowed), key=str)
    if unknown:
        raise UserError(f"task {task_id!r}: {key}.{unknown[0]}: unknown key (expected one of "
                        f"{', '.join(allowed)})")
    return value


def parse_execution_spec(task_id: str, payload: Mapping[str, Any],
                         limits: ExecutionLimits = CONTRACT_LIMITS) -> ExecutionSpec | None:
    """The execution spec of a task payload, or None when the payload names no ``command``.

    Every key is checked and a refusal names it (``task 't': timeout_ms: expected ...``); an env
    value is never echoed (it may be a secret). Defaults come from ``limits``; caps too.
    """
    from .store import check_command

    if "command" not in payload:
        for key in EXECUTION_KEYS:
            if key in payload:
                raise UserError(f"task {task_id!r}: {key}: given without a command (add a command, "
                                "e.g. `qinglong task put PROJECT TASK -- PROGRAM ARG...`)")
        return None
    command = payload["command"]
    if isinstance(command, str):
        raise _refuse(task_id, "command", "a list of arguments (argv); write [\"sh\", \"-c\", "
                      "\"...\"] for a shell", command)
    check_command(f"task {task_id!r}: command", command)

    env_value = payload.get("env", {})
    if not isinstance(env_value, Mapping):
        raise _refuse(task_id, "env", "a table of NAME = \"value\"", show=False)
    if len(env_value) > _MAX_ENV_ENTRIES:
        raise _refuse(task_id, "env", f"at most {_MAX_ENV_ENTRIES} variables", show=False)
    env: dict[str, str] = {}
    for name, value in env_value.items():
        if (not isinstance(name, str) or not name or "=" in name or "\0" in name
                or not (name[0].isalpha() or name[0] == "_")
                or not all(c.isalnum() or c == "_" for c in name) or not name.isascii()):
            # `NAME=value` written as a name: show the name only, the value may be a secret
            shown = name.split("=", 1)[0] + "=..." if isinstance(name, str) and "=" in name else name
            raise _refuse(task_id, "env", "variable names of letters, digits and _ not starting "
                          "with a digit", shown)
        if name.startswith(_RESERVED_ENV_PREFIXES):
            raise UserError(f"task {task_id!r}: env.{name}: names starting with QINGLONG_ are set "
                            "by the executor")
        if not isinstance(value, str):
            raise UserError(f"task {task_id!r}: env.{name}: expected a string value")
        if "\0" in value:
            raise UserError(f"task {task_id!r}: env.{name}: the value contains a NUL character")
        if not _is_unicode(value):
            raise UserError(f"task {task_id!r}: env.{name}: the value is not valid Unicode (a lone "
                            "surrogate: undecodable bytes or a \\ud800-\\udfff escape)")
        env[name] = value

    working_dir = payload.get("working_dir")
    if working_dir is not None:
        if (not isinstance(working_dir, str) or not working_dir.startswith("/") or "\0" in working_dir
                or not _is_unicode(working_dir)):
            raise _refuse(task_id, "working_dir", "an absolute path of valid Unicode without NUL",
                          working_dir)

    # a profile's default never exceeds its own cap: a task stating nothing is never refused
    timeout_ms = _int(task_id, "timeout_ms",
                      payload.get("timeout_ms", min(limits.default_timeout_ms, limits.max_timeout_ms)),
                      1_000, limits.max_timeout_ms)

    concurrency = ConcurrencyPolicy()
    if "concurrency" in payload:
        raw = payload["concurrency"]
        if isinstance(raw, str):
            raw = {"mode": raw}
        raw = _table(task_id, "concurrency", raw, ("mode", "max_running"))
        try:
            mode = ConcurrencyMode(raw.get("mode", "allow"))
        except ValueError:
            raise _refuse(task_id, "concurrency.mode", "one of allow, forbid, replace, queue",
                          raw.get("mode")) from None
        max_running = raw.get("max_running")
        if max_running is not None:
            if mode is not ConcurrencyMode.ALLOW:
                raise UserError(f"task {task_id!r}: concurrency.max_running: only with mode "
                                f"'allow' ({mode.value} runs one at a time)")
            max_running = _int(task_id, "concurrency.max_running", max_running, 1, 10_000)
        concurrency = ConcurrencyPolicy(mode, max_running)

    retry = RetryPolicy()
    if "retry" in payload:
        raw = payload["retry"]
        if isinstance(raw, int) and not isinstance(raw, bool):
            # a number of retries (`--retries 3`): that many Attempts after the first
            retries = _int(task_id, "retry", raw, 0, limits.max_attempts_cap - 1)
            raw = {"max_attempts": retries + 1}
        elif not isinstance(raw, Mapping):
            raise _refuse(task_id, "retry", "a table (max_attempts, initial_backoff_ms, ...) or a "
                          "number of retries", raw)
        raw = _table(task_id, "retry", raw, ("max_attempts", "initial_backoff_ms", "max_backoff_ms",
                                             "jitter", "exit_codes", "on_timeout"))
        max_attempts = _int(task_id, "retry.max_attempts", raw.get("max_attempts", 1), 1,
                            limits.max_attempts_cap)
        initial = _int(task_id, "retry.initial_backoff_ms",
                       raw.get("initial_backoff_ms", _DEFAULT_RETRY.initial_backoff_ms), 0, 86_400_000)
        maximum = _int(task_id, "retry.max_backoff_ms",
                       raw.get("max_backoff_ms", max(initial, _DEFAULT_RETRY.max_backoff_ms)), 0, 86_400_000)
        if maximum < initial:
            raise UserError(f"task {task_id!r}: retry.max_backoff_ms: expected at least "
                            f"retry.initial_backoff_ms ({initial}), got {maximum}")
        jitter = raw.get("jitter", _DEFAULT_RETRY.jitter)
        if (not isinstance(jitter, (int, float)) or isinstance(jitter, bool)
                or not 0 <= jitter <= 1):
            raise _refuse(task_id, "retry.jitter", "a number from 0 to 1", jitter)
        codes = raw.get("exit_codes")
        if codes is not None:
            if (not isinstance(codes, (list, tuple)) or not codes
                    or not all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255
                               for c in codes)):
                raise _refuse(task_id, "retry.exit_codes", "a non-empty list of exit codes 1-255",
                              codes)
            codes = tuple(sorted(set(codes)))
        on_timeout = _bool(task_id, "retry.on_timeout", raw.get("on_timeout", True))
        retry = RetryPolicy(max_attempts, initial, maximum, float(jitter), codes, on_timeout)

    idempotent = _bool(task_id, "idempotent", payload.get("idempotent", False))
    log_limit = _int(task_id, "log_limit_bytes",
                     payload.get("log_limit_bytes",
                                 min(limits.default_log_limit_bytes, limits.max_log_limit_bytes)),
                     0, limits.max_log_limit_bytes)
    executor = payload.get("executor", limits.default_executor)
    if (not isinstance(executor, str) or not executor or not executor.isprintable()
            or not _is_unicode(executor)):
        raise _refuse(task_id, "executor", "the name of an executor", executor)
    labels = parse_labels(payload.get("labels", []),
                          lambda expected, value: _refuse(task_id, "labels", expected, value))
    return ExecutionSpec(tuple(command), env, working_dir, timeout_ms, concurrency, retry,
                         idempotent, log_limit, executor, labels)


#: What a label may be: what a worker offers and a task requires (``gpu``, ``zone=eu-1``).
LABEL_PATTERN = r"^[A-Za-z0-9_.:=/-]{1,64}$"
MAX_LABELS = 32


def parse_labels(value: Any, refuse: Any) -> tuple[str, ...]:
    """A list of distinct labels, sorted; ``refuse(expected, value)`` builds the error."""
    import re

    expected = (f"a list of at most {MAX_LABELS} labels, each 1-64 characters of letters, digits "
                "and _ . : = / -")
    if not isinstance(value, (list, tuple)) or len(value) > MAX_LABELS:
        raise refuse(expected, value)
    for label in value:
        if not isinstance(label, str) or not re.match(LABEL_PATTERN, label):
            raise refuse(expected, label)
    return tuple(sorted(set(value)))


def spec_to_payload(spec: ExecutionSpec) -> dict[str, Any]:
    """The payload keys that state ``spec`` explicitly (every default written out, so what a task
    revision runs does not change when a profile's default does)."""
    payload: dict[str, Any] = {
        "command": list(spec.command),
        "timeout_ms": spec.timeout_ms,
        "concurrency": {"mode": spec.concurrency.mode.value},
        "retry": {"max_attempts": spec.retry.max_attempts,
                  "initial_backoff_ms": spec.retry.initial_backoff_ms,
                  "max_backoff_ms": spec.retry.max_backoff_ms,
                  "jitter": spec.retry.jitter,
                  "on_timeout": spec.retry.on_timeout},
        "idempotent": spec.idempotent,
        "log_limit_bytes": spec.log_limit_bytes,
        "executor": spec.executor,
    }
    if spec.env:
        payload["env"] = dict(spec.env)
    if spec.working_dir is not None:
        payload["working_dir"] = spec.working_dir
    if spec.concurrency.max_running is not None:
        payload["concurrency"]["max_running"] = spec.concurrency.max_running
    if spec.retry.exit_codes is not None:
        payload["retry"]["exit_codes"] = list(spec.retry.exit_codes)
    payload["labels"] = list(spec.labels)
    return payload


def masked_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` with every env value replaced by a placeholder: what ``task show`` prints."""
    shown = dict(payload)
    env = shown.get("env")
    if isinstance(env, Mapping):
        shown["env"] = {str(name): "(set)" for name in env}
    elif "env" in shown:
        # not a table (a payload stored by another writer, refused by parsing): it may still
        # hold NAME=value strings, so none of it is shown
        shown["env"] = "(set, not a table)"
    return shown


# --------------------------------------------------------------------------------------------
# Outcomes and retries
# --------------------------------------------------------------------------------------------


class CancelReason(str, enum.Enum):
    """Why a durable cancel request was written before any signal was sent."""

    TIMEOUT = "timeout"
    OPERATOR = "operator"
    REPLACED = "replaced"   # a newer Run of a `replace` task
    SHUTDOWN = "shutdown"   # `[execution] on_stop = "terminate"`


def cancel_words(cancel: "CancelReason | str") -> str:
    """What a durable cancel request's reason says in words (the reasons table's ``cancel_*``)."""
    return reason("cancel_" + CancelReason(cancel).value)


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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
                     lost_reason: str = "the process ended without a completion receipt") -> AttemptOutcome:
    """The outcome the evidence supports. A receipt gives the exit status; a cancel request that
    was written before its signals makes the end ``timed_out`` or ``cancelled`` (the status is
    kept when a receipt exists); with neither, the Attempt is ``lost`` (never ``succeeded``
    without a receipt)."""
    if cancel is not None:
        # The request was durable before any signal, so it explains the end whatever the status:
        # an exit 0 may be a job that traps TERM and exits cleanly, which is no proof its work was
        # done. The receipt's status is kept beside the state for the operator to read.
        cancel = CancelReason(cancel)
        state = AttemptState.TIMED_OUT if cancel is CancelReason.TIMEOUT else AttemptState.CANCELLED
        reason = cancel_words(cancel)
        return _from_receipt(state, receipt, reason)
    if receipt is None:
        return AttemptOutcome(AttemptState.LOST, reason=lost_reason)
    return _from_receipt(AttemptState.SUCCEEDED if receipt.exit_code == 0 else AttemptState.FAILED,
                         receipt, None)


def _from_receipt(state: AttemptState, receipt: Receipt | None, reason: str | None) -> AttemptOutcome:
    if receipt is None:
        return AttemptOutcome(state, reason=reason)
    return AttemptOutcome(state, receipt.exit_code, receipt.signal, receipt.ended_at_ms,
                          receipt.log_bytes, receipt.dropped_bytes, reason)


@dataclass(frozen=True, slots=True)
class RetryAt:
    """Create Attempt ``attempt_no`` (not before ``at_ms``)."""

    attempt_no: int
    at_ms: int


@dataclass(frozen=True, slots=True)
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


# --------------------------------------------------------------------------------------------
# Overlap: may a Run of a task start while others of the same task are active
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActiveRun:
    """A Run of the same task that holds a process (dispatching or running)."""

    run_id: str
    scheduled_for_ms: int
    cancel_requested: bool = False


class OverlapAction(str, enum.Enum):
    START = "start"
    WAIT = "wait"
    SKIP = "skip"        # end the candidate cancelled, with ``reason``
    REPLACE = "replace"  # request cancel of ``cancel`` and wait until they are gone


@dataclass(frozen=True, slots=True)
class OverlapDecision:
    action: OverlapAction
    reason: str = ""
    cancel: tuple[str, ...] = ()


def overlap_decision(policy: ConcurrencyPolicy, active: Sequence[ActiveRun],
                     waiting_ahead: int = 0) -> OverlapDecision:
    """Whether a dispatchable Run may start now.

    ``active``: the task's Runs holding a process. ``waiting_ahead``: dispatchable Runs of the
    same task scheduled before this one that have not started (``queue`` keeps that order; the
    other modes consider only what is active, since the dispatcher already visits in order).
    The global ``max_running`` is the dispatcher's, not the policy's.
    """
    mode = policy.mode
    if mode is ConcurrencyMode.ALLOW:
        if policy.max_running is not None and len(active) >= policy.max_running:
            return OverlapDecision(OverlapAction.WAIT, reason(
                "overlap_max_running", active=len(active), max_running=policy.max_running))
        return OverlapDecision(OverlapAction.START)
    if mode is ConcurrencyMode.FORBID:
        if active:
            return OverlapDecision(OverlapAction.SKIP, reason("overlap_forbid", run_id=active[0].run_id))
        return OverlapDecision(OverlapAction.START)
    if mode is ConcurrencyMode.REPLACE:
        if waiting_ahead:
            # an older Run of this task is visited first: it replaces what runs, this one it
            return OverlapDecision(OverlapAction.WAIT, reason("overlap_replace_older"))
        to_cancel = tuple(a.run_id for a in active if not a.cancel_requested)
        if to_cancel:
            return OverlapDecision(OverlapAction.REPLACE, reason("overlap_replacing"), to_cancel)
        if active:
            # every cancel is requested already: start only once the replaced runs are gone
            return OverlapDecision(OverlapAction.WAIT, reason("overlap_replace_waiting",
                                                              run_id=active[0].run_id))
        return OverlapDecision(OverlapAction.START)
    # QUEUE
    if active or waiting_ahead:
        return OverlapDecision(OverlapAction.WAIT, reason("overlap_queue"))
    return OverlapDecision(OverlapAction.START)


# --------------------------------------------------------------------------------------------
# Executors (plugins, hook ``qinglong_executors``)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """A durable name of a started process that cannot be confused with a later one reusing its
    pid: the boot it ran in, its pid (the leader of its own session and process group) and its
    start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""

    boot_id: str
    pid: int
    pgid: int
    start_ticks: int

    def to_json(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "pid": self.pid, "pgid": self.pgid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "ProcessHandle":
        return cls(str(value["boot_id"]), int(value["pid"]), int(value["pgid"]), int(value["start_ticks"]))


@dataclass(frozen=True, slots=True)
class StartRequest:
    """What the dispatcher asks an executor to start."""

    run_id: str
    attempt_id: str
    attempt_no: int
    scheduled_for_ms: int
    spec: ExecutionSpec
    #: A directory of this Attempt's own (created 0700 by the executor): log, receipt, pid, lock.
    attempt_dir: str
    #: A fence (a cluster worker's): the job's whole process group is killed once this instant
    #: of the monotonic clock passes unless :meth:`FencedExecutor.renew_fence` moved it later,
    #: whatever happens to the process that started it (killed, frozen, cut off). None: no fence
    #: (a local profile's jobs outlive their control plane on purpose).
    fence_deadline_mono: float | None = None


class StartError(Exception):
    """The process could not be started (no such program, bad working directory). The message
    says what, for the operator; it ends the Attempt ``failed`` without a retry."""


class ProcessState(str, enum.Enum):
    ALIVE = "alive"            # the handle's process (or its waiter) still holds the Attempt
    ENDED = "ended"            # over: read the receipt (there may be none)
    NEVER_STARTED = "never_started"  # no trace the command was ever started: safe to start it


@runtime_checkable
class Executor(Protocol):
    """Starts and watches the processes of Attempts. One instance per ``qinglong run`` process.

    Nothing an executor does is transactional; the dispatcher records each step durably around
    it. Everything after ``start`` works from the Attempt directory and the handle alone, so a
    restarted control plane can pick up what an earlier one started.
    """

    name: str

    async def start(self, request: StartRequest) -> ProcessHandle:
        """Start the process detached (its own session and group; it survives our exit) and return
        its handle once it exists. Raise :class:`StartError` when it cannot start."""
        ...

    def probe(self, attempt_dir: str, handle: ProcessHandle | None) -> ProcessState:
        """Whether the Attempt's process is alive, ended, or was never started."""
        ...

    def find_handle(self, attempt_dir: str) -> ProcessHandle | None:
        """The handle of a process started for ``attempt_dir`` whose start was not recorded (a
        crash between spawn and the running commit), if one exists and is verified."""
        ...

    async def wait(self, attempt_dir: str, handle: ProcessHandle) -> None:
        """Return when the Attempt's process (and its waiter) ended."""
        ...

    def read_receipt(self, attempt_dir: str) -> Receipt | None:
        """The completion receipt, or None if the waiter never wrote one."""
        ...

    def signal(self, handle: ProcessHandle, signum: int) -> bool:
        """Send ``signum`` to the handle's process group only after verifying the handle (boot id
        and start time); False (and nothing sent) when it no longer names our process."""
        ...


@runtime_checkable
class FencedExecutor(Executor, Protocol):
    """An executor that can arm :attr:`StartRequest.fence_deadline_mono`: what a cluster worker
    needs, since a job must not outlive its lease even when the worker itself is killed or frozen
    and cannot stop it."""

    def renew_fence(self, attempt_dir: str, deadline_mono: float) -> None:
        """Move the Attempt's fence to ``deadline_mono`` (monotonic clock); the process group is
        killed when it passes. Atomic: the fence is always either the old or the new instant."""
        ...


@dataclass(frozen=True, slots=True)
class ExecutorSpec:
    """What a plugin offers through ``qinglong_executors``: a name and a factory taking the
    :class:`ExecutorContext`."""

    name: str
    create: Any  # Callable[[ExecutorContext], Executor]
    description: str = ""


@dataclass(frozen=True, slots=True)
class ExecutorContext:
    """What an executor's factory receives."""

    #: Directory under which Attempt directories live (created 0700).
    log_dir: str
    #: Environment every job starts from (before the task's env and the QINGLONG_* variables).
    base_env: Mapping[str, str]
    #: Grace between TERM and KILL, ms.
    kill_grace_ms: int


#: The variables every job gets before its task's env (a minimal environment: the control
#: plane's own environment, which may hold its secrets, is never passed on).
def minimal_environment(home: str | None) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if home:
        env["HOME"] = home
    return env


def job_environment(base: Mapping[str, str], request: StartRequest) -> dict[str, str]:
    """The environment a job sees: ``base``, then the task's env, then what identifies the Attempt."""
    env = dict(base)
    env.update(request.spec.env)
    env.update({
        "QINGLONG_RUN_ID": request.run_id,
        "QINGLONG_ATTEMPT_ID": request.attempt_id,
        "QINGLONG_ATTEMPT": str(request.attempt_no),
        "QINGLONG_SCHEDULED_FOR_MS": str(request.scheduled_for_ms),
    })
    return env


# --------------------------------------------------------------------------------------------
# The execution side of a store (edge and standalone: the local dispatcher's)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DispatchCandidate:
    """A Run whose current Attempt is ``claimed`` and due (``not_before_ms`` passed), in dispatch
    order: scheduled time, then admission time, then run id."""

    run_id: str
    attempt_id: str
    attempt_no: int
    project_id: str
    task_id: str
    task_revision: int
    scheduled_for_ms: int
    admitted_at_ms: int
    run_state: RunState
    spec: ExecutionSpec | None  # None: the task revision names no command (the Run fails)
    #: Why ``spec`` is None when the stored payload names a command that is not a valid spec
    #: (a revision published before specs were checked): the Run fails with this reason.
    spec_error: str | None = None


@dataclass(frozen=True, slots=True)
class ActiveAttempt:
    """An Attempt holding (or maybe holding) a process: dispatching or running."""

    run_id: str
    attempt_id: str
    attempt_no: int
    project_id: str
    task_id: str
    scheduled_for_ms: int
    state: AttemptState
    executor: str
    attempt_dir: str | None
    handle: ProcessHandle | None
    started_at_ms: int | None
    deadline_ms: int | None
    cancel_reason: CancelReason | None
    cancel_requested_at_ms: int | None
    spec: ExecutionSpec | None


@dataclass(frozen=True, slots=True)
class FinishResult:
    """What recording an outcome did: the Run's state after, and the next Attempt if one was
    created. ``recorded`` is False when the Attempt had already ended (nothing changed)."""

    recorded: bool
    run_state: RunState
    next_attempt: RetryAt | None = None


@dataclass(frozen=True, slots=True)
class AttemptView:
    attempt_id: str
    attempt_no: int
    state: AttemptState
    executor: str
    created_at_ms: int
    not_before_ms: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    exit_code: int | None
    signal: int | None
    duration_ms: int | None
    log_bytes: int | None
    log_dropped_bytes: int
    log_deleted: bool
    attempt_dir: str | None
    reason: str | None
    cancel_reason: str | None
    #: The worker that held the Attempt (the cluster's remote workers; None where Runs are
    #: executed by the control plane itself, or before any worker claimed it).
    worker_id: str | None = None


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: str
    project_id: str
    task_id: str
    trigger_id: str
    scheduled_for_ms: int
    admitted_at_ms: int
    state: RunState
    attempts: int
    exit_code: int | None
    duration_ms: int | None
    finished_at_ms: int | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunSummary
    idempotency_key: str
    task_revision: int
    attempts: tuple[AttemptView, ...]


@dataclass(frozen=True, slots=True)
class PruneReport:
    runs: int = 0
    attempts: int = 0
    events: int = 0


@runtime_checkable
class ExecutionStore(Protocol):
    """The execution side of one store. Each method is one short transaction; the state machine
    (:func:`check_run_transition`) and :func:`retry_decision` decide, the store applies."""

    async def dispatch_candidates(self, now_ms: int, limit: int) -> Sequence[DispatchCandidate]:
        """Due claimed Attempts in dispatch order (at most ``limit``)."""
        ...

    async def active_attempts(self) -> Sequence[ActiveAttempt]:
        """Every dispatching or running Attempt (bounded by the profile's max_running in practice)."""
        ...

    async def begin_dispatch(self, attempt_id: str, attempt_dir: str, deadline_ms: int,
                             now_ms: int) -> bool:
        """claimed -> dispatching (Run -> dispatching), recording the directory the process will
        use. False (nothing changed) if the Attempt is no longer claimed and due."""
        ...

    async def record_started(self, attempt_id: str, handle: ProcessHandle, started_at_ms: int,
                             actor: Actor = Actor.DISPATCHER) -> bool:
        """dispatching -> running with the process's handle. False if not dispatching."""
        ...

    async def return_to_queue(self, attempt_id: str, now_ms: int) -> bool:
        """dispatching -> claimed, for a start that provably never happened (reconciler)."""
        ...

    async def record_finished(self, attempt_id: str, outcome: AttemptOutcome, now_ms: int,
                              actor: Actor, *, started: bool = True) -> FinishResult:
        """End the Attempt exactly once with ``outcome`` and apply :func:`retry_decision`: a new
        ``claimed`` Attempt (Run -> retry_wait) or the Run's terminal state. An Attempt already
        ended is left as it is (``recorded=False``)."""
        ...

    async def request_cancel(self, run_id: str, reason: CancelReason, now_ms: int,
                             actor: Actor = Actor.OPERATOR) -> RunState:
        """A durable cancel request on the Run's active Attempt (its process is then signalled);
        a Run with no process (queued, retry_wait) ends ``cancelled`` at once. Returns the Run's
        state after. A terminal Run is left as it is."""
        ...

    async def skip_run(self, run_id: str, attempt_id: str, reason: str, now_ms: int) -> bool:
        """End a claimed Run ``cancelled`` because its overlap policy skips it (reason recorded)."""
        ...

    async def admit_manual_run(self, project_id: str, task_id: str, key: str, now_ms: int) -> tuple[str, bool]:
        """Admit a manual Run of the task's head revision now, idempotency key
        ``ql3:manual:v1:<key>``. Returns ``(run_id, created)``; the same key twice admits one."""
        ...

    async def list_runs(self, *, state: RunState | None = None, project_id: str | None = None,
                        task_id: str | None = None, limit: int = 50) -> Sequence[RunSummary]:
        """Newest first (by scheduled time, then admission)."""
        ...

    async def run_detail(self, run_id: str) -> RunDetail:
        """The Run and every Attempt; :class:`~qinglong.contracts.errors.NotFound` if unknown."""
        ...

    async def finished_logs(self, older_than_ms: int, limit: int) -> Sequence[tuple[str, str]]:
        """``(attempt_id, attempt_dir)`` of ended Attempts whose log still exists, ended before
        ``older_than_ms``, oldest first."""
        ...

    async def mark_log_deleted(self, attempt_id: str, now_ms: int) -> None:
        """Record that the Attempt's log was deleted (the tombstone)."""
        ...

    async def prune(self, older_than_ms: int, batch: int) -> PruneReport:
        """Delete up to ``batch`` terminal Runs finished before ``older_than_ms`` with their
        Attempts and events, keeping what refuses a duplicate admission of their occurrence."""
        ...


# --------------------------------------------------------------------------------------------
# Reading and controlling Runs executed elsewhere (the cluster's remote workers)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredLogState:
    """Where an Attempt's log stored in the store stands, read in one snapshot with the
    Attempt's state: a follower that read ``stored_bytes`` bytes of an Attempt already ended
    (``state`` terminal) has read the whole log, since nothing is appended after the end."""

    attempt_id: str
    state: AttemptState
    #: Bytes of log stored so far (contiguous from offset 0).
    stored_bytes: int
    #: Output beyond the task's log limit, dropped by the worker (known once the Attempt ended).
    dropped_bytes: int
    #: The log was deleted by retention (the tombstone): nothing can be read any more.
    deleted: bool


@runtime_checkable
class RunControl(Protocol):
    """What ``qinglong runs``, ``runs show``, ``runs cancel`` and ``logs`` use on a backend whose
    Runs are executed elsewhere (``backend.execution()`` is None; the cluster's remote workers):
    a backend offers it as ``backend.run_control()``. Logs live in the store, shipped there by
    the worker in order; every read is a short read-only statement of the runtime role."""

    async def list_runs(self, *, state: RunState | None = None, project_id: str | None = None,
                        task_id: str | None = None, trigger_id: str | None = None,
                        limit: int = 50) -> Sequence[RunSummary]:
        """Newest first (by scheduled time, then admission); an unknown state is a UserError."""
        ...

    async def run_detail(self, run_id: str) -> RunDetail:
        """The Run and every Attempt; :class:`~qinglong.contracts.errors.NotFound` if unknown."""
        ...

    async def request_cancel(self, run_id: str, reason: CancelReason = CancelReason.OPERATOR) -> RunState:
        """A queued (or retry-waiting) Run ends ``cancelled`` at once; a dispatching or running one
        gets a durable cancel request (its worker learns it in its next heartbeat reply and
        stops the job); a terminal one is left as it is. Returns the Run's state after;
        :class:`~qinglong.contracts.errors.NotFound` for an unknown Run."""
        ...

    async def log_state(self, attempt_id: str) -> StoredLogState:
        """The Attempt's state and how much of its log is stored (one snapshot)."""
        ...

    async def read_log(self, attempt_id: str, offset: int, size: int) -> bytes:
        """Up to ``size`` stored log bytes from ``offset`` (fewer at the end; empty past it)."""
        ...


def run_state_filter(state: "RunState | str | None") -> "RunState | None":
    """A listing's state filter: None, or a :class:`RunState`; anything else is a
    :class:`~qinglong.contracts.errors.UserError` listing the states, on every backend alike."""
    if state is None:
        return None
    try:
        return RunState(state)
    except ValueError:
        raise UserError(f"unknown run state {state!r}: expected one of "
                        f"{', '.join(s.value for s in RunState)}") from None


def manual_idempotency_key(key: str) -> str:
    """``ql3:manual:v1:<key>``: the key of a manual Run."""
    return f"ql3:manual:v1:{key}"


__all__ = [name for name in dir() if not name.startswith("_")]
