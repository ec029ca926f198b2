"""A worker whose login the database refuses: a wrong password is not an outage.

Real ``qinglong worker`` processes against the real server, whose every role but the superuser
must present its SCRAM password over TCP (tests/pg.py).
"""

from __future__ import annotations

import signal

import pytest

from tests.support.pg import ROLE_PASSWORDS
from tests.worker.helpers import WorkerProcess, start_worker, wait_until, write_worker_settings

pytestmark = pytest.mark.postgres

WRONG = "not-the-password-4711"


def test_a_worker_with_a_wrong_password_exits_5_at_start_naming_the_login(cluster, tmp_path):
    """Retried as "store unavailable", a wrong password would keep the worker up forever, doing
    nothing and looking healthy to its supervisor (and exit 0 at the next stop); the operator
    would never learn what is wrong. It exits at once with 5, one paragraph naming the user and
    the database, never the password."""
    dsn = cluster.dsn("qinglong_gateway").replace(ROLE_PASSWORDS["qinglong_gateway"], WRONG)
    assert WRONG in dsn
    settings = write_worker_settings(tmp_path / "w.toml", dsn, worker_id="w-auth", log_dir=tmp_path / "logs")
    worker = WorkerProcess(settings, tmp_path / "w.stderr")
    try:
        assert worker.wait() == 5, worker.text()
        text = worker.text()
        assert "refused the worker's login" in text and "qinglong_gateway" in text, text
        assert WRONG not in text
        assert not worker.events("worker.store_unavailable"), text
    finally:
        worker.stop()


def test_a_login_refused_after_the_start_is_an_error_tried_again_with_a_growing_pause(cluster, tmp_path):
    """The role's password changes while the worker runs and its connection is cut. If the refusal
    were a warning of an unavailable store, an operator's alerting on errors would never see it;
    if the worker tried again every half second, it would hammer the server and its log. It is
    reported as an error, with pauses growing between tries (fewer reports than tries at a fixed
    pace), and the worker goes on once the password is right again."""
    role = "qinglong_gateway"
    worker = start_worker(cluster, tmp_path, "w-reauth")
    try:
        worker.wait_event("worker.session_opened")
        cluster.sql(f"ALTER ROLE {role} PASSWORD '{WRONG}'")
        try:
            cluster.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            first = worker.wait_event("worker.auth_failed")[0]
            assert first["level"] == "error", first
            # three reports: with pauses of 1, 2 and 4 s between tries, at least 3 s apart
            reports = worker.wait_event("worker.auth_failed", 3)
            from datetime import datetime
            at = [datetime.fromisoformat(e["at"].replace("Z", "+00:00")) for e in reports[:3]]
            assert (at[2] - at[0]).total_seconds() >= 2.0, [e["at"] for e in reports]
        finally:
            cluster.sql(f"ALTER ROLE {role} PASSWORD '{ROLE_PASSWORDS[role]}'")
        worker.wait_event("worker.store_available")
        assert WRONG not in worker.text()
        assert all(e["level"] == "error" for e in worker.events("worker.auth_failed"))
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        worker.stop()
