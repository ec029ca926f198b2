"""The control plane's secrets key: where it is read from, and the AES-GCM sealer built on it.

The sealing rule is :mod:`qinglong.contracts.secrets`; this module only finds the keys
(``[secrets]``) and hands the stores a :class:`HostSealer` through the container. The key is
read when first needed, so a store without env values never needs one; a missing, unreadable or
malformed key is a :class:`~qinglong.contracts.errors.SecretsError` naming the setting.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from typing import Any, Mapping, Sequence

from qinglong.contracts.capabilities import LocalStoreSettings
from qinglong.contracts.errors import SecretsError
from qinglong.contracts.secrets import KEY_BYTES, Sealer


def aes_gcm(key: bytes) -> Any:
    """``cryptography``'s AES-GCM under ``key``."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise SecretsError("sealing task env values needs the cryptography package, which is not "
                           "installed: pip install 'qinglong[edge]' (or [standalone], [cluster])") from None
    return AESGCM(key)


def new_key_text() -> str:
    """A fresh key as a key file holds it: base64 of 32 random bytes, one line."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii") + "\n"


def parse_key(text: str, origin: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise SecretsError(f"{origin}: expected the base64 of {KEY_BYTES} bytes on one line "
                           "(`qinglong secrets generate` writes one)")
    return key


def read_key_file(path: str, origin: str) -> bytes:
    try:
        # O_NONBLOCK: a FIFO in the key's place must be refused, not wait for a writer forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SecretsError(f"{origin}: the key file {path} does not exist") from None
    except OSError as exc:
        raise SecretsError(f"{origin}: the key file {path} cannot be read "
                           f"({exc.strerror or exc.__class__.__name__})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SecretsError(f"{origin}: the key file {path} is not a regular file; put the key "
                               "there (`qinglong secrets generate` writes one)")
        text = os.read(fd, 4096).decode("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc.__class__.__name__
        raise SecretsError(f"{origin}: the key file {path} cannot be read ({reason})") from None
    finally:
        os.close(fd)
    return parse_key(text, f"{origin} ({path})")


def create_key_file(path: str) -> None:
    """Write a fresh key to ``path`` (mode 0600), unless a file is there already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise SecretsError(f"[secrets] key_file: the key file {path} cannot be created "
                           f"({exc.strerror or exc.__class__.__name__})") from None
    try:
        data = new_key_text().encode("ascii")
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except OSError as exc:
        # An empty or partial key would refuse every later seal, after space came back too.
        os.unlink(path)
        raise SecretsError(f"[secrets] key_file: the key file {path} cannot be written "
                           f"({exc.strerror or exc.__class__.__name__}); nothing was sealed") from None
    finally:
        os.close(fd)


def default_key_file(backend_settings: Any) -> str | None:
    """``<database>.key`` beside the file a local store's path resolves to, so every name of the
    file (a symlink, a symlinked directory) finds one key; None for other stores (a key is
    required)."""
    if isinstance(backend_settings, LocalStoreSettings) and isinstance(backend_settings.path, str) \
            and backend_settings.path:
        return os.path.realpath(backend_settings.path) + ".key"
    return None


def _named_key_file(backend_settings: Any) -> str | None:
    """``<database>.key`` beside the path as written, where versions before the key followed the
    file kept it."""
    if isinstance(backend_settings, LocalStoreSettings) and isinstance(backend_settings.path, str) \
            and backend_settings.path:
        return os.path.abspath(backend_settings.path) + ".key"
    return None


class HostSealer:
    """A :class:`~qinglong.contracts.secrets.Sealer` whose keys are read on first use: the
    current key from the variable ``key_env`` names, else ``key_file`` (else the local store's
    default file, created when a value is first sealed), then ``previous_key_files`` and
    ``older`` (rotation), which open values but never seal."""

    def __init__(self, settings: Any, default_file: str | None, *, older: Sequence[str] = (),
                 environ: Mapping[str, str] | None = None, named_file: str | None = None) -> None:
        self._settings = settings
        self._default_file = default_file
        self._named_file = named_file
        self._older = tuple(older)
        self._environ = os.environ if environ is None else environ
        self._sealer: Sealer | None = None

    def _current(self, create: bool) -> bytes:
        name = self._settings.key_env
        text = self._environ.get(name)
        if text:
            return parse_key(text, f"environment variable {name} ([secrets] key_env)")
        if self._settings.key_file:
            return read_key_file(self._settings.key_file, "[secrets] key_file")
        if self._default_file is None:
            raise SecretsError(f"no secrets key: set [secrets] key_file, or the environment variable {name} "
                               "([secrets] key_env), to the base64 of a 32-byte key (`qinglong secrets "
                               "generate` writes one)")
        named = self._named_file
        if named and named != self._default_file and not os.path.lexists(self._default_file) \
                and os.path.lexists(named):
            # A second key beside the file would split its values between two keys.
            raise SecretsError(f"[secrets] key_file (default: beside the database): the key file "
                               f"{self._default_file} does not exist, but {named} does, beside the "
                               "name the database was reached by; the key belongs beside the file "
                               f"itself: move it to {self._default_file}")
        if create:
            create_key_file(self._default_file)
        return read_key_file(self._default_file, "[secrets] key_file (default: beside the database)")

    def _loaded(self, create: bool = False) -> Sealer:
        if self._sealer is None:
            keys = [self._current(create)]
            keys += [read_key_file(p, "[secrets] previous_key_files") for p in self._settings.previous_key_files]
            keys += [read_key_file(p, "--old-key-file") for p in self._older]
            self._sealer = Sealer(keys, aes_gcm)
        return self._sealer

    @property
    def key_id(self) -> str:
        return self._loaded(create=True).key_id

    def has_key(self, key_id: str) -> bool:
        return self._loaded().has_key(key_id)

    def seal(self, plaintext: str, aad: bytes) -> str:
        return self._loaded(create=True).seal(plaintext, aad)

    def open(self, sealed: str, aad: bytes) -> str:
        return self._loaded().open(sealed, aad)

    def load(self) -> "HostSealer":
        """Read the keys now (a SecretsError if they cannot be)."""
        self._loaded(create=True)
        return self


def host_sealer(loaded: Any, backend_settings: Any, older: Sequence[str] = ()) -> HostSealer:
    """The sealer of a process's settings (the container's provider)."""
    return HostSealer(loaded.settings.secrets, default_key_file(backend_settings), older=older,
                      named_file=_named_key_file(backend_settings))


__all__ = ["HostSealer", "host_sealer", "aes_gcm", "new_key_text", "parse_key", "read_key_file",
           "create_key_file", "default_key_file"]
