"""A worker function the gateway's role may not execute (its EXECUTE revoked while a worker
runs): real PostgreSQL (both builds), a real ``qinglong api`` over TCP, a raw client and a real
worker."""

from __future__ import annotations

import datetime
import http.client
import json

from tests.gateway.helpers import ApiGateway, WorkerHttp, plane_settings, register, start_gateway_worker
from tests.gateway.test_gateway_attacks import dump
from tests.support.pg import ROLE_PASSWORDS
from tests.worker.helpers import wait_until

ROLE = "qinglong_gateway"
#: Leases long enough that nothing expires while heartbeats are refused: the store stays still.
LONG_LEASE = dict(session_lease_ms=60_000, heartbeat_ms=1_000, self_fence_margin_ms=5_000)


def readyz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def api_events(api: ApiGateway) -> list[dict]:
    return [json.loads(line) for line in api.text().splitlines() if line.startswith("{")]


def at(event: dict) -> datetime.datetime:
    return datetime.datetime.strptime(event["at"], "%Y-%m-%dT%H:%M:%SZ")


def lease_of(cluster, worker_id: str) -> int:
    rows = cluster.sql("SELECT lease_expires_at_ms FROM qinglong.worker_sessions WHERE worker_id = %s "
                       "AND closed_at_ms IS NULL", (worker_id,))
    return rows[0][0] if rows else 0


def test_a_worker_function_the_gateway_may_not_execute_is_schema_not_ready(cluster, tmp_path):
    """With a worker function's EXECUTE revoked from the gateway's role (SQLSTATE 42501), every
    such call was a 500 ``internal`` whose log line said only ``SchemaNotReady``: the operator
    of the API tier was not told which call failed nor why, and the worker took it for a defect
    of the gateway. Now the call is a 503 ``schema_not_ready`` (the API's table for a store not
    what this version expects), the API tier logs an error naming the call, the function and
    the SQLSTATE (never a token or the DSN's password), readiness is 503 naming the function,
    the worker reports ``worker.schema_not_ready`` as an error and sends the call again only
    after a growing pause, nothing in the store changes, and all of it recovers once EXECUTE is
    granted again."""
    settings = plane_settings(cluster, tmp_path)
    raw_token = register(settings, "w-raw")
    token = register(settings, "w-revoked")
    api = ApiGateway(settings, tmp_path / "api.stderr")
    client = WorkerHttp(api.port, raw_token)
    worker = None
    revoked = False
    try:
        status, session = client.call("open_session", {"lease_ms": 60_000})
        assert status == 200, session
        fence = {"session_id": session["session_id"], "generation": session["generation"]}
        worker = start_gateway_worker(api.url, token, tmp_path, "w-revoked", **LONG_LEASE)
        wait_until(lambda: lease_of(cluster, "w-revoked") > 0, "the worker's session")
        wait_until(lambda: readyz(api.port) == 200, "the API ready")

        cluster.sql(f"REVOKE EXECUTE ON FUNCTION qinglong.worker_heartbeat FROM {ROLE}")
        revoked = True
        before = dump(cluster)
        status, body = client.call("heartbeat", {**fence, "running": []})
        assert status == 503, body
        assert body["error"]["code"] == "schema_not_ready", body
        assert "heartbeat" in body["error"]["message"], body
        assert "42501" not in body["error"]["message"], body  # the why is for the operator
        assert dump(cluster) == before

        logged = wait_until(lambda: [e for e in api_events(api) if e["code"] == "gateway.schema_not_ready"
                                     and e.get("worker_id") == "w-raw"], "the gateway's error")
        assert logged[0]["level"] == "error", logged
        assert logged[0]["call"] == "heartbeat", logged
        assert "worker_heartbeat" in logged[0]["message"] and "42501" in logged[0]["message"], logged
        assert not any(e["code"] in ("http.handler_failed", "gateway.store_unavailable", "gateway.store_failed")
                       for e in api_events(api)), api.text()

        # readiness (the store's privilege check) says the same, naming the function
        wait_until(lambda: readyz(api.port) == 503, "the API not ready")
        unready = wait_until(lambda: [e for e in api_events(api) if e["code"] == "api.store_not_ready"],
                             "the readiness diagnostic")
        assert "worker_heartbeat" in unready[0]["message"], unready

        reports = worker.wait_event("worker.schema_not_ready", count=3)
        assert all(e["level"] == "error" for e in reports), reports
        assert "503" in reports[0]["message"] and "heartbeat" in reports[0]["message"], reports
        # paused 1 s, then 2 s: not sent again every half second as an outage is
        assert (at(reports[2]) - at(reports[0])).total_seconds() >= 2, reports
        assert worker.events("worker.store_unavailable") == []
        assert dump(cluster) == before

        text = api.text() + worker.text()
        for secret in (token, raw_token, ROLE_PASSWORDS[ROLE]):
            assert secret not in text

        held = lease_of(cluster, "w-revoked")
        cluster.sql(f"GRANT EXECUTE ON FUNCTION qinglong.worker_heartbeat TO {ROLE}")
        revoked = False
        wait_until(lambda: readyz(api.port) == 200, "the API ready again")
        status, body = client.call("heartbeat", {**fence, "running": []})
        assert status == 200, body
        wait_until(lambda: lease_of(cluster, "w-revoked") > held, "the worker's heartbeat renewing its lease")
        worker.signal()
        assert worker.wait() == 0, worker.text()
    finally:
        client.close()
        if revoked:
            cluster.sql(f"GRANT EXECUTE ON FUNCTION qinglong.worker_heartbeat TO {ROLE}")
        if worker is not None:
            worker.stop()
        api.stop()
