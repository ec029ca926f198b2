"""A worker's stop while its claim is long-polled at the gateway: a real ``qinglong api`` with the
gateway, a real ``qinglong worker`` reaching it through a counting proxy, real PostgreSQL."""

from __future__ import annotations

import signal

from devtools.fault_proxy import TO_CLIENT, TO_SERVER
from tests.gateway.helpers import ApiGateway, plane_settings, register, start_gateway_worker
from tests.worker.helpers import wait_until
from tests.worker_failure.harness import SniffingProxy

CLAIM_REQUEST = b"POST /worker/v1/claim "
CLAIM_ANSWER = b'"claimed"'


def test_a_stopping_worker_does_not_wait_for_the_answer_to_its_waiting_claim(cluster, tmp_path):
    """The claim waits at the gateway (20 s here) in a thread of the worker; a stop waited for
    its answer, so every SIGTERM of an idle worker took up to the whole wait and a fleet stopped
    one by one took minutes: an orchestrator's grace period ran out and KILLed the worker, whose
    session was then left to expire instead of being closed. Ordered by events, not by time: the
    worker has exited and closed its session while the gateway still holds its last claim."""
    settings = plane_settings(cluster, tmp_path, claim_wait_ms=20_000)
    token = register(settings, "w-stop")
    api = ApiGateway(settings, tmp_path / "api.stderr")
    host, port = api.url.rsplit("/", 1)[-1].rsplit(":", 1)
    proxy = SniffingProxy((host, int(port)), watch=(CLAIM_REQUEST, CLAIM_ANSWER)).start()
    worker = None
    try:
        # a lease long enough that the worker's own bound on a claim's wait is the gateway's
        worker = start_gateway_worker(f"http://127.0.0.1:{proxy.port}", token, tmp_path, "w-stop",
                                      claim_wait_ms=60_000, session_lease_ms=60_000, heartbeat_ms=5000,
                                      self_fence_margin_ms=5000)
        worker.wait_event("worker.session_opened")
        wait_until(lambda: proxy.count(TO_SERVER, CLAIM_REQUEST) > proxy.count(TO_CLIENT, CLAIM_ANSWER),
                   "a claim waiting at the gateway")
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.text()
        assert proxy.count(TO_CLIENT, CLAIM_ANSWER) < proxy.count(TO_SERVER, CLAIM_REQUEST), \
            "the worker stopped only once the gateway had answered its waiting claim"
        worker.wait_event("worker.session_closed")
        closed = cluster.sql("SELECT closed_at_ms FROM qinglong.worker_sessions WHERE worker_id = 'w-stop'")
        assert closed and all(row[0] is not None for row in closed), closed
    finally:
        if worker is not None:
            worker.stop()
        proxy.close()
        api.stop()
