"""A worker whose token the gateway refuses: a wrong or replaced token is not an outage.

Real ``qinglong worker`` processes against a real ``qinglong api`` gateway on the real server;
tokens issued and rotated with the real CLI.
"""

from __future__ import annotations

import signal

import pytest

from tests.support.gateway import GatewayPlane, WorkerHttp, start_gateway_worker, write_token_file
from tests.worker.helpers import start_worker, wait_until

pytestmark = pytest.mark.postgres

WRONG = "qlw_not-the-token-4711"


def test_a_worker_with_a_wrong_token_exits_5_at_start_naming_the_refusal(cluster, tmp_path, worker_gateway):
    """Retried as "store unavailable", a wrong token would keep the worker up forever, doing
    nothing and looking healthy to its supervisor (and exit 0 at the next stop); the operator
    would never learn what is wrong. It exits at once with 5, one paragraph naming the refused
    token file and the way to a new token, never the token."""
    worker_gateway.register("w-auth")
    worker = start_gateway_worker(worker_gateway.url, WRONG, tmp_path, "w-auth")
    try:
        assert worker.wait() == 5, worker.text()
        text = worker.text()
        assert "refused the worker's token" in text and "token_file" in text, text
        assert WRONG not in text
        assert not worker.events("worker.store_unavailable"), text
    finally:
        worker.stop()


def test_a_token_refused_after_the_start_is_an_error_tried_again_with_a_growing_pause(cluster, tmp_path,
                                                                                      worker_gateway):
    """The worker's token is rotated while it runs and its file still holds the old one. If the
    refusal were a warning of an unavailable store, an operator's alerting on errors would never
    see it; if the worker tried again every half second, it would hammer the gateway and its log.
    It is reported as an error, with pauses growing between tries (fewer reports than tries at a
    fixed pace), and the worker goes on once its file holds the new token."""
    worker = start_worker(worker_gateway, tmp_path, "w-reauth")
    try:
        worker.wait_event("worker.session_opened")
        new = worker_gateway.cli("worker", "rotate", "w-reauth").stdout.strip()
        assert new.startswith("qlw_")
        first = worker.wait_event("worker.auth_failed")[0]
        assert first["level"] == "error", first
        # three reports: with pauses of 1, 2 and 4 s between tries, at least 3 s apart
        reports = worker.wait_event("worker.auth_failed", 3)
        from datetime import datetime
        at = [datetime.fromisoformat(e["at"].replace("Z", "+00:00")) for e in reports[:3]]
        assert (at[2] - at[0]).total_seconds() >= 2.0, [e["at"] for e in reports]
        write_token_file(tmp_path / "w-reauth.token", new)
        worker.wait_event("worker.store_available")
        wait_until(lambda: len(worker.events("worker.heartbeat")) or worker.events("worker.session_opened"),
                   "the worker to go on")
        assert new not in worker.text()
        assert all(e["level"] == "error" for e in worker.events("worker.auth_failed"))
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        worker.stop()


def test_an_api_tier_without_the_gateway_is_named_not_blamed_on_the_token(cluster, tmp_path):
    """``[worker] url`` points at a ``qinglong api`` that serves no worker gateway (``[api]
    gateway_dsn`` unset there): it answers 401 for the unknown path, and the worker said its
    valid token was "unknown or revoked" and to rotate it. An operator following that retires a
    good token and still has no worker, never learning the API tier lacks its gateway. The worker
    exits 5 at start as for any refusal, but names the URL and the missing gateway, not the token."""
    import re

    from tests.support.gateway import ApiGateway, plane_settings, register

    settings = plane_settings(cluster, tmp_path)
    token = register(settings, "w-nogw")  # a valid registration
    settings.write_text(re.sub(r"gateway_dsn = .*\n", "", settings.read_text()))
    api = ApiGateway(settings, tmp_path / "api.stderr")
    try:
        worker = start_gateway_worker(api.url, token, tmp_path, "w-nogw")
        try:
            assert worker.wait() == 5, worker.text()
            text = worker.text()
            assert "[worker] url" in text and "no worker gateway" in text, text
            assert "unknown or revoked" not in text and "rotate" not in text, text
            assert token not in text
        finally:
            worker.stop()
    finally:
        api.stop()
    # the token was never the problem: it still opens a session on a gateway
    plane = GatewayPlane(cluster, tmp_path / "with-gateway")
    try:
        client = WorkerHttp(plane.api.port, token)
        try:
            assert client.call("open_session", {"lease_ms": 30_000})[0] == 200
        finally:
            client.close()
    finally:
        plane.stop()
