"""Secrets at rest: the one rule for sealing a task's env values and a trigger's secret spec keys.

A sealed value is ``ql-sealed:v1:<key id>:<base64 of nonce + ciphertext>``. The ciphertext comes
from an AEAD (AES-GCM in the host) under the key the id names, with associated data that binds it
to its project, task and variable name, so a value copied to another name or task does not open.
The key id is derived from the key itself, so several keys can be loaded at once (a rotation) and
each value finds its own. A trigger spec key whose name ends in ``secret`` (:func:`is_secret_key`,
e.g. a ``hook`` trigger's HMAC key) is sealed the same way, bound to its project, trigger and key
name; the digest of a spec is of its values in clear. This module is pure: the AEAD is handed in
(:class:`Aead`), and the stores receive a :class:`Sealer` from the host; nothing here reads a key
from anywhere.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from .errors import SecretsError, UserError

SEALED_PREFIX = "ql-sealed:v1:"
KEY_BYTES = 32
NONCE_BYTES = 12


class Aead(Protocol):
    """An authenticated cipher under one key (``cryptography``'s ``AESGCM`` has this shape);
    ``decrypt`` raises on a wrong key or altered data."""

    def encrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes: ...

    def decrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes: ...


@runtime_checkable
class SealerLike(Protocol):
    """What a store needs: seal under the current key, open under any loaded key."""

    @property
    def key_id(self) -> str: ...

    def seal(self, plaintext: str, aad: bytes) -> str: ...

    def open(self, sealed: str, aad: bytes) -> str: ...

    def has_key(self, key_id: str) -> bool: ...


def key_id_of(key: bytes) -> str:
    """A short public name of ``key`` (never enough to find the key)."""
    return "k" + hashlib.sha256(b"qinglong secrets key id\0" + key).hexdigest()[:12]


def is_sealed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(SEALED_PREFIX)


def sealed_key_id(value: str) -> str | None:
    """The key id a sealed value names, or None when ``value`` is not sealed (or malformed)."""
    if not is_sealed(value):
        return None
    key_id, sep, _ = value[len(SEALED_PREFIX):].partition(":")
    return key_id if sep and key_id else None


class Sealer:
    """Seals under the first key, opens under any of ``keys`` (raw 32-byte keys). ``cipher``
    builds the AEAD of one key; ``nonce`` gives random bytes (a fresh nonce per value)."""

    def __init__(self, keys: Sequence[bytes], cipher: Callable[[bytes], Aead], *,
                 nonce: Callable[[int], bytes] = os.urandom) -> None:
        if not keys:
            raise SecretsError("no secrets key is loaded")
        self._ciphers: dict[str, Aead] = {}
        for key in keys:
            if len(key) != KEY_BYTES:
                raise SecretsError(f"a secrets key must be {KEY_BYTES} bytes (got {len(key)})")
            self._ciphers.setdefault(key_id_of(key), cipher(key))
        self._current = key_id_of(keys[0])
        self._nonce = nonce

    @property
    def key_id(self) -> str:
        """The id of the key new values are sealed under."""
        return self._current

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def has_key(self, key_id: str) -> bool:
        return key_id in self._ciphers

    def seal(self, plaintext: str, aad: bytes) -> str:
        nonce = self._nonce(NONCE_BYTES)
        sealed = self._ciphers[self._current].encrypt(nonce, plaintext.encode("utf-8"), aad)
        return f"{SEALED_PREFIX}{self._current}:{base64.b64encode(nonce + sealed).decode('ascii')}"

    def open(self, sealed: str, aad: bytes) -> str:
        """The plaintext of ``sealed``; a SecretsError (naming the key id, never the value) when
        it is malformed, under a key not loaded, or does not authenticate."""
        key_id = sealed_key_id(sealed)
        if key_id is None:
            raise SecretsError("a sealed value is malformed")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise SecretsError(f"a value is sealed under key {key_id}, which is not loaded "
                               f"(loaded: {', '.join(self._ciphers)})")
        try:
            raw = base64.b64decode(sealed[len(SEALED_PREFIX) + len(key_id) + 1:], validate=True)
        except (binascii.Error, ValueError):
            raise SecretsError(f"a value sealed under key {key_id} is malformed") from None
        if len(raw) <= NONCE_BYTES:
            raise SecretsError(f"a value sealed under key {key_id} is malformed")
        try:
            data = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
            return data.decode("utf-8")
        except Exception:  # the AEAD's own error type: altered, or bound to another name
            raise SecretsError(f"a value sealed under key {key_id} does not open: it was altered or "
                               "belongs to another variable or task") from None


def env_aad(project_id: str, task_id: str, name: str) -> bytes:
    """The associated data of one env value: its project, task and variable name."""
    return "\0".join(("qinglong env v1", project_id, task_id, name)).encode("utf-8")


def is_secret_key(name: Any) -> bool:
    """Whether a trigger spec key holds a secret: sealed at rest, masked wherever shown."""
    return str(name).endswith("secret")


def trigger_aad(project_id: str, trigger_id: str, key: str) -> bytes:
    """The associated data of one secret spec value: its project, trigger and key name."""
    return "\0".join(("qinglong trigger v1", project_id, trigger_id, key)).encode("utf-8")


def _secret_items(spec: Any) -> list[tuple[str, str]]:
    if not isinstance(spec, Mapping):
        return []
    return [(str(k), v) for k, v in spec.items() if is_secret_key(k) and isinstance(v, str)]


def opened_trigger_spec(sealer: SealerLike | None, project_id: str, trigger_id: str,
                        spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with its sealed secret values opened: where a signature is verified, or a spec
    digested or republished. A value that does not open is a SecretsError naming the trigger and
    key, never its text; without a sealer a sealed value never passes for the secret itself."""
    sealed = [(k, v) for k, v in _secret_items(spec) if is_sealed(v)]
    if not sealed:
        return dict(spec)
    if sealer is None:
        raise SecretsError(f"trigger {project_id}/{trigger_id}: its secret is sealed and no secrets key "
                           "is loaded (set [secrets] key_file)")
    opened = dict(spec)
    for key, value in sealed:
        try:
            opened[key] = sealer.open(value, trigger_aad(project_id, trigger_id, key))
        except SecretsError as exc:
            raise SecretsError(f"trigger {project_id}/{trigger_id}: spec.{key}: {exc}") from None
    return opened


def given_trigger_spec(sealer: SealerLike | None, project_id: str, trigger_id: str,
                       spec: Any) -> Any:
    """A spec given to a publisher with a sealed secret kept from the head (an edit that did not
    restate it) opened, before the spec is validated; a sealed value bound to another trigger or
    key is a UserError, never taken as the secret itself."""
    if not isinstance(spec, Mapping) or not any(is_sealed(v) for _, v in _secret_items(spec)):
        return spec
    try:
        return opened_trigger_spec(sealer, project_id, trigger_id, spec)
    except SecretsError:
        keys = [k for k, v in _secret_items(spec) if is_sealed(v)]
        if sealer is None or any(not sealer.has_key(sealed_key_id(v) or "")
                                 for _, v in _secret_items(spec) if is_sealed(v)):
            raise
        raise UserError(f"trigger {trigger_id!r}: spec.{keys[0]}: a sealed value given for this key does "
                        "not open (give the secret itself, or keep the current one)") from None


def sealed_trigger_spec(sealer: SealerLike | None, project_id: str, trigger_id: str,
                        spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec as stored: every secret value (in clear, or sealed under an older key) sealed
    under the current key. Without a sealer the spec as given."""
    items = _secret_items(spec)
    if sealer is None or not items:
        return dict(spec)
    plain = opened_trigger_spec(sealer, project_id, trigger_id, spec)
    sealed = {k: sealer.seal(plain[k], trigger_aad(project_id, trigger_id, k)) for k, _ in items}
    return {**plain, **sealed}


def spec_needs_sealing(sealer: SealerLike, spec: Any) -> bool:
    """Whether a stored trigger spec holds a secret in clear or one sealed under an older key."""
    return any(not is_sealed(v) or sealed_key_id(v) != sealer.key_id for _, v in _secret_items(spec))


def spec_key_ids(specs: Iterable[Any]) -> set[str]:
    """The key ids the sealed secret values of trigger ``specs`` name."""
    return {k for spec in specs for _, v in _secret_items(spec) for k in [sealed_key_id(v)] if k}


def _env_of(payload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    env = payload.get("env")
    return env if isinstance(env, Mapping) else None


def sealed_env_payload(sealer: SealerLike | None, project_id: str, task_id: str,
                       payload: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(plain, stored)`` of a payload given to a publisher: ``plain`` with every env value in
    clear (a value sealed for this very variable, e.g. one kept from the head, is opened; the
    digest is of ``plain``), ``stored`` with every env value sealed under the current key. Without
    a sealer both are the payload as given, which must then hold no sealed value."""
    env = _env_of(payload)
    if env is None:
        return dict(payload), dict(payload)
    if sealer is None:
        opened_env_payload(None, project_id, task_id, payload)  # refuses sealed values
        return dict(payload), dict(payload)
    plain, sealed = {}, {}
    for name, value in env.items():
        if isinstance(value, str):
            aad = env_aad(project_id, task_id, str(name))
            if is_sealed(value):
                value = _open_given(sealer, value, aad, task_id, str(name))
            plain[name], sealed[name] = value, sealer.seal(value, aad)
        else:  # refused by the spec parser, naming the variable
            plain[name] = sealed[name] = value
    return {**payload, "env": plain}, {**payload, "env": sealed}


def _open_given(sealer: SealerLike, value: str, aad: bytes, task_id: str, name: str) -> str:
    try:
        return sealer.open(value, aad)
    except SecretsError as exc:
        if sealed_key_id(value) is not None and not sealer.has_key(sealed_key_id(value) or ""):
            raise SecretsError(f"task {task_id!r}: env.{name}: {exc}") from None
        raise UserError(f"task {task_id!r}: env.{name}: a sealed value given for this variable does "
                        "not open (give the value itself, or keep the current one)") from None


def env_values_to_redact(sealer: SealerLike | None, project_id: str, task_id: str, payload: Any) -> tuple[str, ...]:
    """The env values in clear of a stored task ``payload``: what a message quoting the job's log
    must redact. Values that do not open (no key, a wrong one) give none, never their sealed text."""
    if not isinstance(payload, Mapping):
        return ()
    try:
        payload = opened_env_payload(sealer, project_id, task_id, payload)
    except SecretsError:
        return ()
    env = payload.get("env")
    return tuple(v for v in env.values() if isinstance(v, str)) if isinstance(env, Mapping) else ()


def opened_env_payload(sealer: SealerLike | None, project_id: str, task_id: str,
                       payload: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` with every sealed env value opened: what a job runs with. A value that does
    not open is a SecretsError naming the task and variable, never its text."""
    env = _env_of(payload)
    if env is None or not any(is_sealed(v) for v in env.values()):
        return dict(payload)
    if sealer is None:
        raise SecretsError(f"task {task_id!r}: env values are sealed and no secrets key is loaded "
                           "(set [secrets] key_file)")
    opened = {}
    for name, value in env.items():
        if is_sealed(value):
            try:
                value = sealer.open(value, env_aad(project_id, task_id, str(name)))
            except SecretsError as exc:
                raise SecretsError(f"task {project_id}/{task_id}: env.{name}: {exc}") from None
        opened[name] = value
    return {**payload, "env": opened}


def opened_state(sealer: SealerLike | None, state: Any) -> Any:
    """A :class:`~qinglong.contracts.apply.ProjectState` with its tasks' env values opened: what
    a publisher plans an apply against (a desired ``STORED`` value then stands for the value in
    clear, and digests compare values in clear), its triggers' secret spec values opened too,
    inside its own transaction only."""
    import dataclasses

    tasks = {task_id: dataclasses.replace(record, payload=opened_env_payload(
                 sealer, record.project_id, record.task_id, record.payload))
             for task_id, record in state.tasks.items()}
    triggers = {trigger_id: dataclasses.replace(head, spec=opened_trigger_spec(
                    sealer, head.project_id, head.trigger_id, head.spec))
                for trigger_id, head in state.triggers.items()}
    return dataclasses.replace(state, tasks=tasks, triggers=triggers)


def payload_needs_sealing(sealer: SealerLike, payload: Mapping[str, Any]) -> bool:
    """Whether a stored payload holds a plaintext env value or one sealed under an older key."""
    env = _env_of(payload)
    if env is None:
        return False
    return any(isinstance(v, str) and (not is_sealed(v) or sealed_key_id(v) != sealer.key_id)
               for v in env.values())


def key_ids_in(payloads: Iterable[Mapping[str, Any]]) -> set[str]:
    """The key ids the sealed env values of ``payloads`` name."""
    found: set[str] = set()
    for payload in payloads:
        env = _env_of(payload)
        for value in (env or {}).values():
            key_id = sealed_key_id(value) if isinstance(value, str) else None
            if key_id is not None:
                found.add(key_id)
    return found


def check_keys_loaded(sealer: SealerLike | None, key_ids: Iterable[str], where: str) -> None:
    """Refuse (SecretsError naming the setting) when a stored value's key is not loaded."""
    missing = sorted(k for k in key_ids if sealer is None or not sealer.has_key(k))
    if missing:
        loaded = "no key" if sealer is None else f"key {sealer.key_id}"
        raise SecretsError(f"{where} holds values sealed under key {', '.join(missing)}, but {loaded} "
                           "is loaded: set [secrets] key_file (or the variable [secrets] key_env names) "
                           "to the key they were sealed with, or rotate with `qinglong secrets rotate`")


__all__ = ["SEALED_PREFIX", "KEY_BYTES", "NONCE_BYTES", "Aead", "SealerLike", "Sealer", "key_id_of",
           "is_sealed", "sealed_key_id", "env_aad", "sealed_env_payload", "opened_env_payload",
           "payload_needs_sealing", "opened_state", "key_ids_in", "check_keys_loaded", "is_secret_key",
           "trigger_aad", "opened_trigger_spec", "given_trigger_spec", "sealed_trigger_spec",
           "spec_needs_sealing", "spec_key_ids"]
