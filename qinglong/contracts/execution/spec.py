"""The execution spec: what a task runs and how, part of the task revision (the task payload) and
of its digest.

:func:`parse_execution_spec` reads it from a payload, refusing key by key against the
:class:`ExecutionLimits` in force; :func:`spec_to_payload` writes every value out explicitly;
:func:`masked_payload` is what may be shown.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any, Mapping, Sequence

from ..frozen import record
from ..errors import QUOTE_LIMIT, UserError, quoted
from ..secrets import SEALED_PREFIX


class ConcurrencyMode(str, enum.Enum):
    """What a Run does when Runs of the same task are still active."""

    ALLOW = "allow"      # start, up to max_running of this task at once; later ones wait
    FORBID = "forbid"    # skip (cancelled, with the reason recorded) while one is active
    REPLACE = "replace"  # cancel the active one(s), start when they are gone
    QUEUE = "queue"      # wait until none is active; one at a time, in scheduled order


@record
class ConcurrencyPolicy:
    mode: ConcurrencyMode = ConcurrencyMode.ALLOW
    #: ``allow`` only: most Runs of this task active at once (None: only the global limit).
    max_running: int | None = None


@record
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


@record
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


@record
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
#: The longest environment variable name a task may set.
MAX_ENV_NAME_CHARS = 128


def _refuse(task_id: str, key: str, expected: str, value: Any = None, *, show: bool = True) -> UserError:
    shown = f" (got {_short(value)})" if show else ""
    return UserError(f"task {quoted(task_id)}: {key}: expected {expected}{shown}")


def _short(value: Any) -> str:
    return quoted(value)


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
                         limits: ExecutionLimits = CONTRACT_LIMITS, *,
                         allow_sealed: bool = False) -> ExecutionSpec | None:
    """The execution spec of a task payload, or None when the payload names no ``command``.

    Every key is checked and a refusal names it (``task 't': timeout_ms: expected ...``); an env
    value is never echoed (it may be a secret). Defaults come from ``limits``; caps too. A sealed
    env value (:mod:`qinglong.contracts.secrets`) is refused unless ``allow_sealed`` (a spec read
    to be shown, never to be run).
    """
    from ..events import check_notify
    from ..store import check_command

    if "notify" in payload:
        check_notify(task_id, payload["notify"])
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
        if len(name) > MAX_ENV_NAME_CHARS:
            raise UserError(f"task {quoted(task_id)}: env: variable name {quoted(name)}: expected at most "
                            f"{MAX_ENV_NAME_CHARS} characters")  # over the quote's length: it says how many
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
        if value.startswith(SEALED_PREFIX) and not allow_sealed:
            raise UserError(f"task {task_id!r}: env.{name}: the value is sealed and was not opened (a job "
                            "gets it in clear only from the control plane: claim through the API tier's gateway)")
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
    executor = check_executor_name(task_id, payload.get("executor", limits.default_executor))
    labels = parse_labels(payload.get("labels", []),
                          lambda expected, value: _refuse(task_id, "labels", expected, value))
    return ExecutionSpec(tuple(command), env, working_dir, timeout_ms, concurrency, retry,
                         idempotent, log_limit, executor, labels)


def check_executor_name(task_id: str, name: Any) -> str:
    """An executor's name as a task states it: shaped like an identifier (1-64 ASCII letters,
    digits, ``-``, ``_``, ``.``, starting with a letter or digit), as executor plugins are named.
    Whether it exists is not checked: it may exist only where the task runs (a worker)."""
    from ..names import is_identifier

    if not is_identifier(name):
        # a name longer than the quote is shown with its length already
        length = (f", {len(name)} characters" if isinstance(name, str) and 64 < len(name) <= QUOTE_LIMIT
                  else "")
        raise UserError(f"task {quoted(task_id)}: executor: expected the name of an executor, 1-64 ASCII "
                        f"letters, digits, '-', '_' or '.', starting with a letter or digit (got "
                        f"{quoted(name)}{length})")
    return name


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


def keep_env_values(task_id: str, payload: Mapping[str, Any], kept: Sequence[str],
                    current: Mapping[str, Any] | None) -> dict[str, Any]:
    """``payload`` with the env values named in ``kept`` taken from ``current`` (the task's head
    payload): how an editor that never reads env values back leaves a value unchanged. A kept
    name must be in the head's env and not be given a value too; no other value of ``current``
    is carried over, and a refusal never echoes a value."""
    merged = dict(payload)
    if not kept:
        return merged
    env = merged.get("env", {})
    if not isinstance(env, Mapping):
        raise _refuse(task_id, "env", "a table of NAME = \"value\"", show=False)
    old = current.get("env") if current is not None else None
    old = old if isinstance(old, Mapping) else {}
    env = dict(env)
    for name in kept:
        if not isinstance(name, str) or name not in old or not isinstance(old[name], str):
            shown = name if isinstance(name, str) else type(name).__name__
            raise UserError(f"task {task_id!r}: keep_env: {shown!r} is not a variable of the task's "
                            "current revision (give its value instead)")
        if name in env:
            raise UserError(f"task {task_id!r}: keep_env: {name!r} is given a value too (keep it or "
                            "replace it, not both)")
        env[name] = old[name]
    merged["env"] = env
    return merged


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


__all__ = ["ConcurrencyMode", "ConcurrencyPolicy", "RetryPolicy", "ExecutionSpec", "ExecutionLimits",
           "CONTRACT_LIMITS", "EXECUTION_KEYS", "parse_execution_spec", "LABEL_PATTERN", "MAX_LABELS",
           "MAX_ENV_NAME_CHARS", "check_executor_name",
           "parse_labels", "spec_to_payload", "masked_payload", "keep_env_values"]
