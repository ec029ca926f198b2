"""The task's execution spec (``parse_execution_spec``, ``spec_to_payload``, ``masked_payload``).

``task put`` refuses a bad spec through ``parse_execution_spec`` before anything is written, and
the spec it accepts is stored as the payload ``spec_to_payload`` writes, inside the task revision
and its digest. A refusal that does not name its key leaves the user guessing; one that echoes an
env value prints a secret to a terminal, a log or a CI transcript; a payload that does not parse
back to the same spec changes what a stored revision runs.
"""

from __future__ import annotations

import copy
import json
import math
import traceback

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.contracts.errors import UserError
from qinglong.contracts.execution import (
    CONTRACT_LIMITS,
    ConcurrencyMode,
    ConcurrencyPolicy,
    ExecutionLimits,
    ExecutionSpec,
    RetryPolicy,
    masked_payload,
    parse_execution_spec,
    spec_to_payload,
)

SPEC_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TASK = "t"
COMMAND = ["/bin/true"]

# --------------------------------------------------------------------------------------------
# Refusals name their key
# --------------------------------------------------------------------------------------------

#: ``(the key the refusal must name, the payload keys beside a valid command)``.
REFUSALS = [
    ("command", {"command": []}),
    ("command", {"command": ["", "x"]}),
    ("command", {"command": ["a\0b"]}),
    ("command", {"command": [1, 2]}),
    ("command", {"command": ["\ud800"]}),
    ("command", {"command": ["x" * 5000]}),
    ("command", {"command": None}),
    ("env", {"env": "A=1"}),
    ("env", {"env": ["A=1"]}),
    ("env", {"env": {"1A": "x"}}),
    ("env", {"env": {"A-B": "x"}}),
    ("env", {"env": {"": "x"}}),
    ("env", {"env": {"ÄRGER": "x"}}),
    ("env", {"env": {f"V{i}": "x" for i in range(257)}}),
    ("env.QINGLONG_RUN_ID", {"env": {"QINGLONG_RUN_ID": "x"}}),
    ("env.A", {"env": {"A": 1}}),
    ("env.A", {"env": {"A": None}}),
    ("env.A", {"env": {"A": "a\0b"}}),
    ("env.A", {"env": {"A": "\udcff"}}),
    ("working_dir", {"working_dir": "relative/dir"}),
    ("working_dir", {"working_dir": ""}),
    ("working_dir", {"working_dir": 5}),
    ("working_dir", {"working_dir": "/a\0b"}),
    ("working_dir", {"working_dir": "/\ud800"}),
    ("timeout_ms", {"timeout_ms": 999}),
    ("timeout_ms", {"timeout_ms": True}),
    ("timeout_ms", {"timeout_ms": "30m"}),
    ("timeout_ms", {"timeout_ms": 1500.0}),
    ("timeout_ms", {"timeout_ms": CONTRACT_LIMITS.max_timeout_ms + 1}),
    ("concurrency", {"concurrency": 5}),
    ("concurrency.mode", {"concurrency": "sometimes"}),
    ("concurrency.mode", {"concurrency": {"mode": ["forbid"]}}),
    ("concurrency.modes", {"concurrency": {"modes": "forbid"}}),
    ("concurrency.max_running", {"concurrency": {"mode": "forbid", "max_running": 2}}),
    ("concurrency.max_running", {"concurrency": {"mode": "allow", "max_running": 0}}),
    ("concurrency.max_running", {"concurrency": {"max_running": True}}),
    ("concurrency.max_running", {"concurrency": {"max_running": 2.0}}),
    ("retry", {"retry": -1}),
    ("retry", {"retry": True}),
    ("retry", {"retry": "3"}),
    ("retry", {"retry": CONTRACT_LIMITS.max_attempts_cap}),
    ("retry.backoff", {"retry": {"backoff": 1}}),
    ("retry.max_attempts", {"retry": {"max_attempts": 0}}),
    ("retry.max_attempts", {"retry": {"max_attempts": True}}),
    ("retry.max_attempts", {"retry": {"max_attempts": CONTRACT_LIMITS.max_attempts_cap + 1}}),
    ("retry.initial_backoff_ms", {"retry": {"initial_backoff_ms": -1}}),
    ("retry.initial_backoff_ms", {"retry": {"initial_backoff_ms": False}}),
    ("retry.max_backoff_ms", {"retry": {"initial_backoff_ms": 5000, "max_backoff_ms": 1000}}),
    ("retry.max_backoff_ms", {"retry": {"max_backoff_ms": 86_400_001}}),
    ("retry.jitter", {"retry": {"jitter": 2}}),
    ("retry.jitter", {"retry": {"jitter": -0.1}}),
    ("retry.jitter", {"retry": {"jitter": True}}),
    ("retry.jitter", {"retry": {"jitter": math.nan}}),
    ("retry.jitter", {"retry": {"jitter": "0.5"}}),
    ("retry.exit_codes", {"retry": {"exit_codes": []}}),
    ("retry.exit_codes", {"retry": {"exit_codes": [0]}}),
    ("retry.exit_codes", {"retry": {"exit_codes": [256]}}),
    ("retry.exit_codes", {"retry": {"exit_codes": [True]}}),
    ("retry.exit_codes", {"retry": {"exit_codes": "1"}}),
    ("retry.on_timeout", {"retry": {"on_timeout": "yes"}}),
    ("retry.on_timeout", {"retry": {"on_timeout": 1}}),
    ("idempotent", {"idempotent": "true"}),
    ("idempotent", {"idempotent": 1}),
    ("log_limit_bytes", {"log_limit_bytes": -1}),
    ("log_limit_bytes", {"log_limit_bytes": True}),
    ("log_limit_bytes", {"log_limit_bytes": CONTRACT_LIMITS.max_log_limit_bytes + 1}),
    ("executor", {"executor": ""}),
    ("executor", {"executor": 5}),
    ("executor", {"executor": "a\nb"}),
]


@pytest.mark.parametrize(("key", "keys"), REFUSALS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(REFUSALS)])
def test_a_bad_spec_is_refused_naming_its_key_and_nothing_in_it_changes(key: str, keys: dict) -> None:
    """If a refusal did not name its key, the user could not tell what to fix; if a bool passed
    as a number (``timeout_ms = true``) or a bad value passed at all, a task would be stored that
    its dispatcher cannot run or runs differently than written; if parsing changed the payload it
    was given, the caller's copy (written next, or shown) would no longer be what the user sent."""
    payload = {"command": COMMAND, **keys}
    before = copy.deepcopy(payload)
    with pytest.raises(UserError) as refused:
        parse_execution_spec(TASK, payload)
    assert str(refused.value).startswith(f"task {TASK!r}: {key}: "), str(refused.value)
    assert repr(payload) == repr(before)  # repr: a NaN is never == itself


@pytest.mark.parametrize("key", ["env", "working_dir", "timeout_ms", "concurrency", "retry", "idempotent",
                                 "log_limit_bytes", "executor"])
def test_execution_keys_without_a_command_are_refused_naming_the_key(key: str) -> None:
    """If a spec without a command were accepted, ``task put --timeout 30m`` with the command
    forgotten would store a task that admits Runs which all fail at dispatch."""
    with pytest.raises(UserError) as refused:
        parse_execution_spec(TASK, {key: None, "note": "own data"})
    assert str(refused.value).startswith(f"task {TASK!r}: {key}: given without a command")


def test_a_payload_without_any_execution_key_has_no_spec() -> None:
    """If a task's own data (no execution keys) were refused, tasks stored before execution
    existed could no longer be put again; they admit and fail at dispatch instead."""
    assert parse_execution_spec(TASK, {"note": "own data", "n": 3}) is None


@pytest.mark.parametrize("command", ["backup.sh", "backup.sh --full /srv", "sh -c 'echo tick'"])
def test_a_command_given_as_a_string_is_refused_with_the_argv_hint(command: str) -> None:
    """If a string command were accepted it would either be split (quoting silently wrong) or run
    through a shell the user never asked for; the refusal says how to write either."""
    with pytest.raises(UserError) as refused:
        parse_execution_spec(TASK, {"command": command})
    message = str(refused.value)
    assert message.startswith(f"task {TASK!r}: command: expected a list of arguments")
    assert '["sh", "-c", "..."]' in message


# --------------------------------------------------------------------------------------------
# Env values never appear in an error
# --------------------------------------------------------------------------------------------

#: Ways of getting an env wrong (or something beside it) with a secret in the env.
def _bad_env_payloads(secret: str) -> list[dict]:
    return [
        {"command": COMMAND, "env": {"TOKEN": secret + "\0"}},
        {"command": COMMAND, "env": {"TOKEN": secret + "\ud800"}},
        {"command": COMMAND, "env": {"1TOKEN": secret}},
        {"command": COMMAND, "env": {"TOKEN=" + secret: "x"}},
        {"command": COMMAND, "env": {"QINGLONG_TOKEN": secret}},
        {"command": COMMAND, "env": [f"TOKEN={secret}"]},
        {"command": COMMAND, "env": f"TOKEN={secret}"},
        {"command": COMMAND, "env": {"TOKEN": secret.encode("utf-8", "surrogatepass")}},
        {"command": COMMAND, "env": {"TOKEN": [secret]}},
        {"command": COMMAND, "env": {"TOKEN": secret, "BAD-NAME": "x"}},
        {"command": COMMAND, "env": {f"V{i}": secret for i in range(300)}},
        {"command": COMMAND, "env": {"TOKEN": secret}, "timeout_ms": "soon"},
        {"command": COMMAND, "env": {"TOKEN": secret}, "retry": {"jitter": 3}},
        {"command": "run.sh", "env": {"TOKEN": secret}},
        {"env": {"TOKEN": secret}},
    ]


def _all_text(error: BaseException) -> str:
    """The error as a user or a log could ever see it: message, repr, causes and contexts."""
    return "".join(traceback.format_exception(error)) + repr(error.args)


@SPEC_SETTINGS
@given(marker=st.uuids().map(lambda u: u.hex), body=st.text(max_size=40))
def test_no_refusal_ever_shows_an_env_value(marker: str, body: str) -> None:
    """If a refusal echoed an env value (a password, an API token), ``task put`` would print the
    secret to the terminal, to CI logs and to whatever collects our stderr."""
    secret = marker + body
    for payload in _bad_env_payloads(secret):
        with pytest.raises(UserError) as refused:
            parse_execution_spec(TASK, payload)
        text = _all_text(refused.value)
        assert marker not in text, (payload.keys(), str(refused.value))
        assert secret not in text


@SPEC_SETTINGS
@given(marker=st.uuids().map(lambda u: u.hex), names=st.lists(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=5, unique=True))
def test_the_masked_payload_shows_env_names_but_never_values(marker: str, names: list[str]) -> None:
    """If ``task show`` printed the payload unmasked, every secret in a task's env would be shown
    to anyone who can list tasks."""
    payload = {"command": COMMAND, "env": {name: f"{marker}-{i}" for i, name in enumerate(names)},
               "timeout_ms": 60_000}
    shown = masked_payload(payload)
    assert marker not in json.dumps(shown)
    assert sorted(shown["env"]) == sorted(names)
    assert shown["timeout_ms"] == 60_000
    assert payload["env"][names[0]].startswith(marker)  # the caller's payload is left as it was
    for env in ([f"{names[0]}={marker}"], f"{names[0]}={marker}", [[names[0], marker]]):
        # an env that is not a table (stored by another writer) is hidden whole, not echoed
        assert marker not in json.dumps(masked_payload({"command": COMMAND, "env": env}))


# --------------------------------------------------------------------------------------------
# Round trips, defaults and caps
# --------------------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: not n.startswith("QINGLONG_"))


@st.composite
def specs(draw: st.DrawFn, limits: ExecutionLimits = CONTRACT_LIMITS) -> ExecutionSpec:
    mode = draw(st.sampled_from(list(ConcurrencyMode)))
    max_running = draw(st.none() | st.integers(1, 10_000)) if mode is ConcurrencyMode.ALLOW else None
    initial = draw(st.integers(0, 86_400_000))
    retry = RetryPolicy(
        max_attempts=draw(st.integers(1, limits.max_attempts_cap)),
        initial_backoff_ms=initial,
        max_backoff_ms=draw(st.integers(initial, 86_400_000)),
        jitter=draw(st.floats(0, 1)),
        exit_codes=draw(st.none() | st.sets(st.integers(1, 255), min_size=1, max_size=5)
                        .map(lambda c: tuple(sorted(c)))),
        on_timeout=draw(st.booleans()),
    )
    return ExecutionSpec(
        command=tuple([draw(_text.filter(bool))] + draw(st.lists(_text, max_size=4))),
        env=draw(st.dictionaries(_names, _text, max_size=4)),
        working_dir=draw(st.none() | _text.map(lambda t: "/" + t)),
        timeout_ms=draw(st.integers(1_000, limits.max_timeout_ms)),
        concurrency=ConcurrencyPolicy(mode, max_running),
        retry=retry,
        idempotent=draw(st.booleans()),
        log_limit_bytes=draw(st.integers(0, limits.max_log_limit_bytes)),
        executor=draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True)),
    )


@SPEC_SETTINGS
@given(spec=specs())
def test_a_spec_written_as_a_payload_parses_back_to_itself(spec: ExecutionSpec) -> None:
    """If ``spec_to_payload`` and ``parse_execution_spec`` disagreed, a stored revision (JSON in
    the store) would run something else than what ``task put`` accepted: another timeout, retry
    policy or environment, and its digest would not say so."""
    payload = spec_to_payload(spec)
    stored = json.loads(json.dumps(payload, sort_keys=True, ensure_ascii=False))
    assert parse_execution_spec(TASK, stored) == spec
    assert spec_to_payload(parse_execution_spec(TASK, stored)) == stored


@SPEC_SETTINGS
@given(spec=specs(), timeout=st.integers(1_000, 10**6), log=st.integers(0, 10**6))
def test_a_stored_spec_does_not_change_when_the_profile_defaults_do(spec: ExecutionSpec, timeout: int,
                                                                    log: int) -> None:
    """If a payload left a default implicit, changing ``[execution] default_timeout_ms`` or the
    log limit would silently change what every stored revision runs (and its digest would not)."""
    other = ExecutionLimits(default_timeout_ms=timeout, max_timeout_ms=CONTRACT_LIMITS.max_timeout_ms,
                            default_log_limit_bytes=log, max_log_limit_bytes=CONTRACT_LIMITS.max_log_limit_bytes,
                            max_attempts_cap=CONTRACT_LIMITS.max_attempts_cap, default_executor="elsewhere")
    assert parse_execution_spec(TASK, spec_to_payload(spec), other) == spec


SMALL = ExecutionLimits(default_timeout_ms=60_000, max_timeout_ms=120_000, default_log_limit_bytes=1_000,
                        max_log_limit_bytes=2_000, max_attempts_cap=3, default_executor="other")


def test_defaults_come_from_the_limits() -> None:
    """If a task stating nothing got other defaults than its profile's, ``task show`` would show a
    timeout and log limit the dispatcher does not apply."""
    spec = parse_execution_spec(TASK, {"command": COMMAND}, SMALL)
    assert spec == ExecutionSpec(command=tuple(COMMAND), env={}, working_dir=None, timeout_ms=60_000,
                                 concurrency=ConcurrencyPolicy(ConcurrencyMode.ALLOW, None),
                                 retry=RetryPolicy(), idempotent=False, log_limit_bytes=1_000,
                                 executor="other")
    assert parse_execution_spec(TASK, {"command": COMMAND, "retry": {}}, SMALL).retry.max_attempts == 1


@pytest.mark.parametrize(("keys", "key", "cap"), [
    ({"timeout_ms": 120_001}, "timeout_ms", "120000"),
    ({"log_limit_bytes": 2_001}, "log_limit_bytes", "2000"),
    ({"retry": {"max_attempts": 4}}, "retry.max_attempts", "3"),
    ({"retry": 3}, "retry", "2"),
])
def test_caps_from_the_limits_are_refused_one_past_and_accepted_at(keys: dict, key: str, cap: str) -> None:
    """If a cap were not enforced, a router's 4 MiB log limit or a profile's longest timeout
    could be exceeded by any task (a full disk, a job that is never stopped); if the cap itself
    were refused, the largest allowed value would be unusable."""
    with pytest.raises(UserError) as refused:
        parse_execution_spec(TASK, {"command": COMMAND, **keys}, SMALL)
    message = str(refused.value)
    assert message.startswith(f"task {TASK!r}: {key}: expected an integer from ") and f" to {cap} " in message
    (name, value), = keys.items()
    at_cap = value - 1 if isinstance(value, int) else {"max_attempts": value["max_attempts"] - 1}
    spec = parse_execution_spec(TASK, {"command": COMMAND, name: at_cap}, SMALL)
    assert spec.timeout_ms <= 120_000 and spec.log_limit_bytes <= 2_000 and spec.retry.max_attempts <= 3


def test_a_default_above_its_cap_is_clamped_not_refused() -> None:
    """If a profile default above the cap were applied, tasks stating nothing would exceed the
    cap; if it were refused, every such ``task put`` would fail naming a key the user never wrote."""
    limits = ExecutionLimits(default_timeout_ms=10**9, max_timeout_ms=120_000,
                             default_log_limit_bytes=10**9, max_log_limit_bytes=2_000)
    spec = parse_execution_spec(TASK, {"command": COMMAND}, limits)
    assert (spec.timeout_ms, spec.log_limit_bytes) == (120_000, 2_000)


def test_shorthands_mean_what_the_cli_flags_say() -> None:
    """If ``--retries 3`` meant three Attempts (or ``--concurrency forbid`` were not a mode), a
    task would run once less (or overlap) compared to what its author asked for."""
    spec = parse_execution_spec(TASK, {"command": COMMAND, "retry": 3, "concurrency": "forbid"})
    assert spec.retry.max_attempts == 4
    assert spec.concurrency == ConcurrencyPolicy(ConcurrencyMode.FORBID)
    spec = parse_execution_spec(TASK, {"command": COMMAND, "retry": {"exit_codes": [3, 1, 3]}})
    assert spec.retry.exit_codes == (1, 3)


_ENV_NAMES = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
_ENV = st.dictionaries(_ENV_NAMES, st.text(alphabet="#%&~", max_size=12), max_size=6)  # never in a message


@given(current=_ENV, given_values=_ENV, data=st.data())
def test_kept_env_values_come_from_the_head_and_nothing_else_leaks(current, given_values, data):
    """An editor that keeps a value by name must get exactly the head's value, every given value
    must stay as given, and no other value of the head may be carried over (a removed secret
    would come back)."""
    from qinglong.contracts.errors import UserError
    from qinglong.contracts.execution import keep_env_values

    keepable = sorted(set(current) - set(given_values))
    kept = data.draw(st.lists(st.sampled_from(keepable), unique=True) if keepable else st.just([]))
    merged = keep_env_values("t", {"command": ["true"], "env": given_values}, kept, {"env": current})
    assert merged["env"] == {**given_values, **{name: current[name] for name in kept}}
    assert merged["command"] == ["true"]
    # a name not in the head, or kept and given at once, is refused without echoing a value
    for bad_kept, given in ((["NOT_THERE_"], given_values), (list(current)[:1], current)):
        if bad_kept and (bad_kept[0] not in current or bad_kept[0] in given):
            try:
                keep_env_values("t", {"env": given}, bad_kept, {"env": current})
            except UserError as exc:
                assert all(v not in str(exc) for v in current.values() if v)
            else:
                raise AssertionError("a bad keep_env was accepted")
