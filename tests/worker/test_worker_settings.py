"""``[worker]`` refused key by key before anything connects, and the local retention of Attempt
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
from tests.worker.helpers import WorkerProcess, write_worker_settings

GOOD = dict(dsn="host=127.0.0.1 user=w", session_lease_ms=5000, heartbeat_ms=1000, self_fence_margin_ms=1000,
            kill_grace_ms=500)


def _config(**overrides):
    return worker_config(WorkerSettings(**{**GOOD, **overrides}), hostname="host-a")


def test_the_short_test_timing_and_the_defaults_are_accepted():
    """The defaults must hold the fence out of the box, and the tests' short leases must too."""
    assert _config().session_lease_ms == 5000
    defaults = worker_config(WorkerSettings(dsn="host=x"), hostname="host-a")
    assert (defaults.worker_id, defaults.session_lease_ms, defaults.heartbeat_ms) == ("host-a", 45_000, 10_000)
    assert defaults.application_name == "qinglong worker host-a"
    assert os.path.isabs(defaults.log_dir)


@pytest.mark.parametrize("overrides, words", [
    (dict(heartbeat_ms=3000), "[worker] timing: session_lease_ms 5000 is too short for heartbeat_ms 3000"),
    (dict(kill_grace_ms=4000), "kill_grace_ms 4000"),
    (dict(dsn=None), "[worker] url is required"),
    (dict(dsn="  "), "[worker] url is required"),
    (dict(labels=["gpu", "bad label"]), "[worker] labels: 'bad label' is not a label"),
    (dict(labels=[f"l{i}" for i in range(33)]), "[worker] labels: expected at most 32"),
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


def test_qinglong_worker_refuses_bad_timing_a_missing_dsn_and_a_profile_without_workers(tmp_path):
    """The process must refuse before connecting or claiming, with exit 3 and the key's name."""
    bad_timing = _worker_cli(tmp_path, 'profile = "cluster"\n[worker]\ndsn = "host=x"\nheartbeat_ms = 30000\n')
    assert bad_timing.returncode == 3
    assert "[worker] timing" in bad_timing.stderr and "heartbeat_ms 30000" in bad_timing.stderr
    no_dsn = _worker_cli(tmp_path, 'profile = "cluster"\n[worker]\n')
    assert no_dsn.returncode == 3 and "[worker] url is required" in no_dsn.stderr
    edge = _worker_cli(tmp_path, f'profile = "edge"\n[backend]\npath = "{tmp_path / "q.db"}"\n'
                                 '[worker]\ndsn = "host=x"\n')
    assert edge.returncode == 3 and "offers none" in edge.stderr and "worker protocol" in edge.stderr
    too_many = _worker_cli(tmp_path, 'profile = "cluster"\n[worker]\ndsn = "host=x"\nmax_running = 257\n')
    assert too_many.returncode == 3 and "max_running" in too_many.stderr


def test_a_worker_that_cannot_reach_its_store_keeps_trying_and_never_prints_its_password(tmp_path):
    """A worker started before its database must wait for it rather than exit; and the DSN's
    password must never reach its diagnostics."""
    secret = "worker-Sekrit-99"
    settings = write_worker_settings(tmp_path / "w.toml", f"host=127.0.0.1 port=1 user=w password={secret}",
                                     worker_id="w-away", log_dir=tmp_path / "logs")
    worker = WorkerProcess(settings, tmp_path / "w.stderr")
    try:
        worker.wait_event("worker.store_unavailable", 2)
        assert worker.proc.poll() is None
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        assert secret not in worker.text()
        assert worker.events("worker.stopped")
    finally:
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
