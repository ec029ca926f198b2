"""``[http]`` settings: refused values name their key, the profile's default address may be taken
without failing the start, an address the operator set may not."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys

import pytest

from host_helpers import wait_until
from http_helpers import Plane, child_env, write_settings
from qinglong.contracts.errors import SettingsError
from qinglong.host.http import resolve_token
from qinglong.host.settings import load_settings


@pytest.fixture(autouse=True)
def _no_environment_overrides(monkeypatch):
    import os

    for name in list(os.environ):
        if name.upper().startswith("QINGLONG_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("body, key, words", [
    ('listen = "8080"', "http.listen", 'expected "host:port"'),
    ('listen = "127.0.0.1:99999"', "http.listen", 'expected "host:port"'),
    ("listen = 8080", "http.listen", "string"),
    ('token = "short"', "http.token", "at least 16"),
    ("max_connections = 0", "http.max_connections", "greater than or equal to 1"),
    ('listen = "127.0.0.1:8080"\nport = 1', "http.port", "unknown key"),
])
def test_a_bad_http_value_is_refused_naming_its_file_and_key(tmp_path, body, key, words):
    """A misspelled or malformed [http] value silently ignored leaves probes and metrics on an
    address nobody expects, or off."""
    settings = write_settings(tmp_path, http=body)
    with pytest.raises(SettingsError) as refused:
        load_settings(settings)
    message = str(refused.value)
    assert f"key '{key}'" in message and str(settings) in message and words in message, message
    assert "short" not in message or key != "http.token"


def test_a_token_env_naming_no_variable_is_refused_without_showing_any_value(tmp_path, monkeypatch):
    """A token variable that is not set must not turn into 'no token' on a public address."""
    settings = write_settings(tmp_path, http='listen = "0.0.0.0:9"\ntoken_env = "QL_TEST_NO_SUCH_TOKEN"')
    monkeypatch.delenv("QL_TEST_NO_SUCH_TOKEN", raising=False)
    with pytest.raises(SettingsError, match="key 'http.token_env': environment variable QL_TEST_NO_SUCH_TOKEN"):
        resolve_token(load_settings(settings))
    monkeypatch.setenv("QL_TEST_NO_SUCH_TOKEN", "tiny-secret")
    with pytest.raises(SettingsError) as refused:
        resolve_token(load_settings(settings))
    assert "tiny-secret" not in str(refused.value)
    secret = "a-long-enough-token-value"
    monkeypatch.setenv("QL_TEST_NO_SUCH_TOKEN", secret)
    assert resolve_token(load_settings(settings)) == secret.encode()
    loopback = write_settings(tmp_path, http='listen = "[::1]:9"')
    assert resolve_token(load_settings(loopback)) is None  # loopback: no token needed


def _hold(port: int) -> socket.socket:
    """Bind and listen on 127.0.0.1:``port`` for this test alone. Another process of the suite may
    hold it now (the default address of a standalone process) and let it go at any moment, which
    would turn "taken" into "free" between two steps: wait until it is ours, then keep it."""

    def bound() -> socket.socket | None:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            sock.close()
            assert exc.errno == errno.EADDRINUSE
            return None
        sock.listen(1)
        return sock

    return wait_until(bound, f"127.0.0.1:{port} to be let go by the process holding it", timeout=120)


def test_the_profile_default_address_taken_is_a_warning_but_a_configured_one_fails_the_start(tmp_path):
    """Two standalone processes on one host (or a test suite) must not fail because the default
    port is taken, yet an operator who set an address must learn at start that it is not served."""
    held = _hold(8080)
    try:
        settings = write_settings(tmp_path, profile="standalone", http="")
        plane = Plane(settings, http=False)
        try:
            assert plane.ready_message == "READY=1"
            text = plane.stderr.wait_for("http.not_listening", timeout=60)
            assert "127.0.0.1:8080 (key 'http.listen')" in text
        finally:
            assert plane.stop() == 0
        explicit = write_settings(tmp_path, profile="standalone", http='listen = "127.0.0.1:8080"')
        failed = subprocess.run([sys.executable, "-m", "qinglong", "--settings", str(explicit), "run",
                                 "--for-seconds", "30"], env=child_env(), cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert failed.returncode == 3  # a user error: the configured address
        assert "cannot listen on 127.0.0.1:8080 (key 'http.listen')" in failed.stderr, failed.stderr
        assert "lifecycle.admission_open" not in failed.stderr
    finally:
        held.close()


def test_config_show_masks_the_http_token(tmp_path):
    """`qinglong config show` output pasted into a ticket must not carry the bearer token."""
    secret = "token-in-the-settings-file-0123"
    settings = write_settings(tmp_path, http=f'listen = "0.0.0.0:9"\ntoken = "{secret}"')
    shown = subprocess.run([sys.executable, "-m", "qinglong", "--settings", str(settings), "config", "show"],
                           env=child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "0.0.0.0:9" in shown.stdout and secret not in shown.stdout + shown.stderr
