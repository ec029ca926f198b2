"""The one sealing rule (``qinglong.contracts.secrets``): how a task's env values are kept at
rest. If these failed, a stored value would not come back, would open under the wrong key, could
be altered unseen, or could be moved to another variable or task and still open there."""

import base64
import os

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, strategies as st

from qinglong.contracts.errors import SecretsError, UserError
from qinglong.contracts.execution import parse_execution_spec
from qinglong.contracts.records import content_digest
from qinglong.contracts.secrets import (
    SEALED_PREFIX,
    Sealer,
    env_aad,
    is_sealed,
    key_id_of,
    key_ids_in,
    opened_env_payload,
    payload_needs_sealing,
    sealed_env_payload,
    sealed_key_id,
)

keys = st.binary(min_size=32, max_size=32)
values = st.text(max_size=200)
names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True)
ids = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)


def sealer(*raw: bytes) -> Sealer:
    return Sealer(list(raw), AESGCM)


@given(keys, values, ids, ids, names)
def test_a_sealed_value_opens_to_itself_under_its_key(key, value, project, task, name):
    s = sealer(key)
    sealed = s.seal(value, env_aad(project, task, name))
    assert is_sealed(sealed) and sealed_key_id(sealed) == s.key_id == key_id_of(key)
    assert s.open(sealed, env_aad(project, task, name)) == value


@given(keys, values)
def test_the_sealed_text_never_holds_the_value(key, value):
    sealed = sealer(key).seal(value, b"aad")
    if len(value) >= 8:  # a shorter one may occur in base64 by chance
        assert value not in sealed


@given(keys, keys, values)
def test_another_key_never_opens_a_value(key, other, value):
    sealed = sealer(key).seal(value, b"aad")
    if key_id_of(key) == key_id_of(other):
        return
    forged = sealed.replace(key_id_of(key), key_id_of(other), 1)
    with pytest.raises(SecretsError):
        sealer(other).open(sealed, b"aad")  # its key is not loaded
    with pytest.raises(SecretsError):
        sealer(other).open(forged, b"aad")  # named as the other key's: does not authenticate


@given(keys, values, st.data())
def test_an_altered_value_never_opens(key, value, data):
    s = sealer(key)
    sealed = s.seal(value, b"aad")
    prefix = sealed[:len(SEALED_PREFIX) + len(s.key_id) + 1]
    raw = bytearray(base64.b64decode(sealed[len(prefix):]))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(SecretsError):
        s.open(prefix + base64.b64encode(bytes(raw)).decode(), b"aad")


@given(keys, values, st.tuples(ids, ids, names), st.tuples(ids, ids, names))
def test_a_value_is_bound_to_its_project_task_and_name(key, value, here, there):
    s = sealer(key)
    sealed = s.seal(value, env_aad(*here))
    if here == there:
        assert s.open(sealed, env_aad(*there)) == value
    else:
        with pytest.raises(SecretsError):
            s.open(sealed, env_aad(*there))


@given(keys, keys, values)
def test_during_a_rotation_values_under_either_key_open_and_new_ones_use_the_new(new, old, value):
    before = sealer(old).seal(value, b"aad")
    both = sealer(new, old)
    assert both.open(before, b"aad") == value
    assert sealed_key_id(both.seal(value, b"aad")) == key_id_of(new)


@given(keys, st.dictionaries(names, values, max_size=5))
def test_a_payload_is_stored_sealed_and_digested_in_clear(key, env):
    s = sealer(key)
    payload = {"command": ["true"], "env": env}
    plain, stored = sealed_env_payload(s, "p", "t", payload)
    assert plain == payload
    assert all(is_sealed(v) for v in stored["env"].values())
    assert not payload_needs_sealing(s, stored)
    assert opened_env_payload(s, "p", "t", stored) == payload
    # a head's sealed values given back (kept) are the same payload in clear: the same digest
    again, _ = sealed_env_payload(s, "p", "t", stored)
    assert content_digest(again) == content_digest(payload)
    assert key_ids_in([stored]) == ({s.key_id} if env else set())


def test_a_sealed_value_given_for_another_variable_is_refused_without_echo():
    s = sealer(os.urandom(32))
    theirs = s.seal("their-secret", env_aad("p", "other", "TOKEN"))
    with pytest.raises(UserError) as refused:
        sealed_env_payload(s, "p", "t", {"command": ["true"], "env": {"TOKEN": theirs}})
    assert "their-secret" not in str(refused.value) and theirs not in str(refused.value)


def test_without_a_sealer_a_sealed_value_is_refused_never_run():
    stored = sealed_env_payload(sealer(os.urandom(32)), "p", "t", {"command": ["true"], "env": {"A": "x"}})[1]
    with pytest.raises(SecretsError, match=r"\[secrets\] key_file"):
        opened_env_payload(None, "p", "t", stored)
    with pytest.raises(UserError, match="sealed and was not opened"):
        parse_execution_spec("t", stored)
    assert parse_execution_spec("t", stored, allow_sealed=True) is not None


def test_a_key_of_the_wrong_size_is_refused():
    with pytest.raises(SecretsError, match="32 bytes"):
        sealer(b"short")


def test_a_secrets_error_has_its_own_exit_code_and_http_status():
    from qinglong.contracts.errors import ExitCode, exit_code_for, http_status_for

    assert exit_code_for(SecretsError("x")) is ExitCode.SECRETS == 6
    assert http_status_for(SecretsError("x")) == (503, "secrets_unavailable")
