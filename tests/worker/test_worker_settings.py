"""``[worker]`` refused key by key before anything connects (a database login among them), and the local retention of Attempt
directories (no database needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from qinglong.contracts.errors import SettingsError
from qinglong.host.settings import WorkerSettings
from qinglong.worker import worker_config
from qinglong.worker.retention import sweep_attempt_dirs
from tests.worker.helpers import WorkerProcess, wait_until, write_worker_settings

GOOD = dict(url="http://127.0.0.1:1", token_file="w.token", session_lease_ms=5000, heartbeat_ms=1000, self_fence_margin_ms=1000,
            kill_grace_ms=500)


def _config(**overrides):
    return worker_config(WorkerSettings(**{**GOOD, **overrides}), hostname="host-a")


def test_the_short_test_timing_and_the_defaults_are_accepted():
    """The defaults must hold the fence out of the box, and the tests' short leases must too."""
    assert _config().session_lease_ms == 5000
    defaults = worker_config(WorkerSettings(url="http://x", token_file="t"), hostname="host-a")
    assert (defaults.worker_id, defaults.session_lease_ms, defaults.heartbeat_ms) == ("host-a", 45_000, 10_000)
    assert defaults.application_name == "qinglong worker host-a"
    assert os.path.isabs(defaults.log_dir)


@pytest.mark.parametrize("overrides, words", [
    (dict(heartbeat_ms=3000), "[worker] timing: session_lease_ms 5000 is too short for heartbeat_ms 3000"),
    (dict(kill_grace_ms=4000), "kill_grace_ms 4000"),
    (dict(url=None), "[worker] url is required"),
    (dict(token_file=None), "[worker] token_file is required"),
    (dict(worker_id="a\tb"), "[worker] worker_id"),
])
def test_a_setting_that_cannot_hold_the_fence_or_is_malformed_is_refused_naming_the_key(overrides, words):
    """A timing that cannot stop the jobs inside the lease would let two workers run one Run; a
    refusal that did not name the key would leave the operator guessing."""
    with pytest.raises(SettingsError) as err:
        _config(**overrides)
    assert words in str(err.value)


def _worker_cli(tmp_path, body: str) -> subprocess.CompletedProcess:
    settings = tmp_path / "s.toml"
    settings.write_text(body)
    return subprocess.run([sys.executable, "-m", "qinglong", "worker", "--settings", str(settings)],
                          capture_output=True, text=True, timeout=60)


def test_qinglong_worker_refuses_bad_timing_a_missing_url_and_too_many_jobs(tmp_path):
    """The process must refuse before connecting or claiming, with exit 3 and the key's name."""
    gateway = 'url = "http://127.0.0.1:1"\ntoken_file = "w.token"\n'
    bad_timing = _worker_cli(tmp_path, f'profile = "cluster"\n[worker]\n{gateway}heartbeat_ms = 30000\n')
    assert bad_timing.returncode == 3
    assert "[worker] timing" in bad_timing.stderr and "heartbeat_ms 30000" in bad_timing.stderr
    no_url = _worker_cli(tmp_path, 'profile = "cluster"\n[worker]\n')
    assert no_url.returncode == 3 and "[worker] url is required" in no_url.stderr
    too_many = _worker_cli(tmp_path, f'profile = "cluster"\n[worker]\n{gateway}max_running = 257\n')
    assert too_many.returncode == 3 and "max_running" in too_many.stderr


def test_a_database_login_in_worker_settings_is_refused_naming_the_file_the_key_and_the_way(tmp_path, monkeypatch):
    """A worker host must hold no database credential: a ``[worker] dsn`` left from an older
    deployment must stop the worker (and every other command reading the file) at once, saying
    where it is and what replaces it, never as an unknown key nor silently ignored; the value
    itself (a password) is never repeated."""
    secret = "old-Sekrit-42"
    body = f'profile = "cluster"\n[worker]\ndsn = "host=x user=w password={secret}"\n'
    done = _worker_cli(tmp_path, body)
    assert done.returncode == 3, done.stderr
    assert str(tmp_path / "s.toml") in done.stderr and "worker.dsn" in done.stderr
    assert "use [worker] url and token_file from `qinglong worker register`" in done.stderr
    assert secret not in done.stderr
    from qinglong.host.settings import load_settings

    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path / "s.toml")
    assert "worker.dsn" in str(err.value) and "qinglong worker register" in str(err.value)
    (tmp_path / "ok.toml").write_text('profile = "cluster"\n')
    monkeypatch.setenv("QINGLONG_WORKER__DSN", f"host=x password={secret}")
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path / "ok.toml")
    assert "QINGLONG_WORKER__DSN" in str(err.value) and secret not in str(err.value)


@pytest.mark.parametrize("value", ['["gpu"]', "[]"])
def test_labels_in_worker_settings_are_refused_naming_the_registration(tmp_path, value):
    """A worker's labels are its registration's: a ``[worker] labels`` left in a file would make the
    operator believe this worker offers (or no longer offers) a label the gateway never sees, so a
    task would wait, or run where they meant it not to."""
    done = _worker_cli(tmp_path, f'profile = "cluster"\n[worker]\nlabels = {value}\n')
    assert done.returncode == 3, done.stderr
    assert str(tmp_path / "s.toml") in done.stderr and "worker.labels" in done.stderr
    assert "qinglong worker register NAME --label L" in done.stderr


def test_a_worker_that_cannot_reach_its_gateway_keeps_trying_and_never_prints_its_token(tmp_path):
    """A worker started before its API tier must wait for it rather than exit, and reach it once
    it listens; and its token must never reach its diagnostics."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    secret = "qlw_worker-Sekrit-99"
    token_file = tmp_path / "w.token"
    token_file.write_text(secret + "\n")
    token_file.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = write_worker_settings(tmp_path / "w.toml", url=f"http://127.0.0.1:{port}", token_file=token_file,
                                     worker_id="w-away", log_dir=tmp_path / "logs")
    seen: list[tuple[str, str]] = []

    class Unready(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, self.headers.get("Authorization", "")))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    worker = WorkerProcess(settings, tmp_path / "w.stderr")
    server = None
    try:
        worker.wait_event("worker.store_unavailable")
        assert worker.proc.poll() is None
        server = ThreadingHTTPServer(("127.0.0.1", port), Unready)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        wait_until(lambda: seen, "the worker to try its gateway again once it listens")
        assert seen[0][0].startswith("/worker/v1/") and seen[0][1] == f"Bearer {secret}"
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        assert secret not in worker.text()
        assert worker.events("worker.stopped")
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        worker.stop()


@pytest.mark.parametrize("answer", [b"[1]", b"null", b'"ok"', b"<html>Sign in to the network</html>"])
def test_a_200_that_is_not_the_worker_protocol_is_an_outage_not_a_crash(tmp_path, answer):
    """A captive portal, a proxy's error page or a stray server behind ``[worker] url`` answers
    200 with something other than the protocol's JSON object. The worker crashed on it with a
    traceback and exit 1 (a JSON array or null), or stopped with exit 4 and the words "worker_id:
    expected str" (a page): in the middle of its work that kills a healthy worker and hands its
    Runs over for a proxy's hiccup, and nothing told the operator that the URL was answered by
    something else. It is an unavailable gateway, reported as such, and tried again."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    token_file = tmp_path / "w.token"
    token_file.write_text("qlw_worker-Sekrit-77\n")
    token_file.chmod(0o600)
    answered: list[str] = []

    class Foreign(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answered.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Foreign)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = write_worker_settings(tmp_path / "w.toml", url=f"http://127.0.0.1:{server.server_port}",
                                     token_file=token_file, worker_id="w-foreign", log_dir=tmp_path / "logs")
    worker = WorkerProcess(settings, tmp_path / "w.stderr")
    try:
        (event,) = worker.wait_event("worker.store_unavailable")
        assert "not the worker protocol" in event["message"] and "[worker] url" in event["message"], event
        # tried again, not given up on: a second answer reaches the server while it still runs
        wait_until(lambda: len(answered) >= 2, "the worker to try its gateway again")
        assert worker.proc.poll() is None, worker.text()
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.text()
        assert "Traceback" not in worker.text() and not worker.events("worker.fatal")
        assert "Sekrit" not in worker.text()
    finally:
        server.shutdown()
        server.server_close()
        worker.stop()


def test_retention_deletes_only_old_attempt_directories_no_job_holds(tmp_path):
    """Without retention a worker's disk fills with logs the store already holds; a sweep that
    touched anything but an old, unheld Attempt directory would delete a live job's log or an
    operator's file."""
    old, held, fresh = (str(uuid.uuid4()) for _ in range(3))
    for name in (old, held, fresh, "not-an-attempt"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "log").write_bytes(b"x")
    eight_days_ago = time.time() - 8 * 86_400
    for name in (old, held, "not-an-attempt"):
        for path in (tmp_path / name / "log", tmp_path / name):
            os.utime(path, (eight_days_ago, eight_days_ago))
    assert sweep_attempt_dirs(str(tmp_path), 7, {held}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([held, fresh, "not-an-attempt"])
    assert sweep_attempt_dirs(str(tmp_path / "missing"), 7, set()) == 0


def test_install_token_copies_a_mounted_token_to_a_private_token_file(tmp_path):
    """A Secret mounted by Kubernetes is root's and group-readable: the worker refuses it as its
    token file, so the pod's init container installs it as the worker's own 0600 file; a source
    holding no token must not become one (nor be printed)."""
    from qinglong.worker import read_token_file

    source = tmp_path / "secret-token"
    source.write_text("qlw_mounted-Token-1")
    source.chmod(0o644)
    target = tmp_path / "work" / "token"
    target.parent.mkdir()
    settings = tmp_path / "w.toml"
    settings.write_text(f'profile = "cluster"\n[worker]\nurl = "http://127.0.0.1:1"\ntoken_file = "{target}"\n')
    done = subprocess.run([sys.executable, "-m", "qinglong", "worker", "install-token", str(source), "--settings",
                           str(settings)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert oct(target.stat().st_mode & 0o777) == "0o600" and read_token_file(str(target)) == "qlw_mounted-Token-1"
    source.write_text("host=db password=Sekrit")
    refused = subprocess.run([sys.executable, "-m", "qinglong", "worker", "install-token", str(source),
                              "--settings", str(settings)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "holds no worker token" in refused.stderr
    assert "Sekrit" not in refused.stderr and read_token_file(str(target)) == "qlw_mounted-Token-1"
