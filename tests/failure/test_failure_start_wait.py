"""A replica (``qinglong run``, cluster profile) started while its PostgreSQL is down waits for it
(``[lifecycle] start_wait_ms``), reporting each refused attempt, and becomes ready once the server
is back, without exiting; a refused login is not waited out."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from tests.failure.failure_helpers import qinglong_command, write_cluster_settings
from tests.support.pg import ROLE_PASSWORDS

pytestmark = pytest.mark.postgres


def _next_event(proc: subprocess.Popen, code: str, seen: list[str]) -> dict:
    """Read the replica's stderr up to the diagnostic ``code`` (every line kept in ``seen``); an
    exit before it fails the test."""
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("code") == code:
                return event
    raise AssertionError(f"the replica exited ({proc.wait()}) before {code}:\n" + "".join(seen[-20:]))


def test_replica_started_while_postgres_is_down_waits_and_becomes_ready(failure_server, failure_db, tmp_path):
    """Without the wait a replica started while its database restarts exits 5 at once and is
    lost until an orchestrator restarts it; a wait that printed its DSN would leak the runtime
    role's password into the log. PostgreSQL is started only after the replica reported that its
    first attempt was refused, so the replica did start into a dead server."""
    settings = write_cluster_settings(tmp_path / "replica.toml", failure_db.dsn("qinglong_runtime"),
                                      owner="waits", pool_timeout_ms=1000)
    failure_server.stop()
    seen: list[str] = []
    proc = None
    try:
        proc = subprocess.Popen(qinglong_command(settings), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        waiting = _next_event(proc, "lifecycle.store_waiting", seen)
        assert waiting["level"] == "warning" and waiting["attempt"] == 1, waiting
        assert "Connection refused" in waiting["message"], waiting
        failure_server.start()
        _next_event(proc, "lifecycle.admission_open", seen)
        assert proc.poll() is None, "".join(seen)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
        seen.append(rest)
    finally:
        if failure_server.postmaster_pid() is None:
            failure_server.start()  # the next tests need it
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, "".join(seen)
    log = "".join(seen)
    assert ROLE_PASSWORDS["qinglong_runtime"] not in log
    assert "Traceback" not in log


def test_replica_with_a_wrong_password_exits_5_at_once(failure_db, tmp_path):
    """A refused login does not change until the settings do: waiting it out would hold a
    misconfigured replica for the whole start wait (here 10 minutes, with a pool timeout of
    10 minutes) instead of saying at once what is wrong; it exits 5 without a single retry,
    naming the user, never the password given."""
    wrong = "not-the-password-7f3a"
    dsn = failure_db.dsn("qinglong_runtime").replace(ROLE_PASSWORDS["qinglong_runtime"], wrong)
    settings = write_cluster_settings(tmp_path / "replica.toml", dsn, owner="refused",
                                      pool_timeout_ms=600_000)
    text = settings.read_text().replace("[lifecycle]\n", "[lifecycle]\nstart_wait_ms = 600000\n")
    settings.write_text(text)
    result = subprocess.run(qinglong_command(settings), capture_output=True, text=True, timeout=120)
    assert result.returncode == 5, result.stderr
    assert "lifecycle.store_waiting" not in result.stderr
    assert "qinglong_runtime" in result.stderr
    assert wrong not in result.stderr and "Traceback" not in result.stderr
