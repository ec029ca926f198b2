"""A worker call the store fails with an error that is no outage (here a check violation raised
by a test-only trigger on a table the real SECURITY DEFINER function writes): real PostgreSQL
(both builds), a real ``qinglong api`` over TCP, a raw client and a real worker; and the
gateway's store side alone for both forms of the completion."""

from __future__ import annotations

import asyncio
import datetime
import json

import pytest

from qinglong.contracts.errors import StoreFailed
from qinglong.contracts.execution import AttemptOutcome, AttemptState, RunState
from qinglong.contracts.worker import new_lease_token
from qinglong.plugins.cluster_postgres.gateway import create_worker_gateway

from tests.gateway.helpers import ApiGateway, WorkerHttp, plane_settings, register, start_gateway_worker
from tests.gateway.test_gateway_attacks import dump
from tests.support.pg import ROLE_PASSWORDS
from tests.support.postgres import fresh_name
from tests.worker.helpers import admit, publish_task, py_job, wait_until, worker_dsn


def refuse(cluster, table: str, when: str = "true") -> str:
    """A trigger that makes writes of ``table`` (those ``when`` holds for) raise
    ``check_violation`` (23514), as a defect in a worker function would; returns its schema
    (dropped with the trigger by :func:`allow`)."""
    schema = fresh_name("qltest")
    cluster.sql(f"CREATE SCHEMA {schema}")
    cluster.sql(f"CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "RAISE EXCEPTION 'a write the test refuses' USING ERRCODE = 'check_violation'; END $$")
    cluster.sql(f"CREATE TRIGGER {schema}_refuse BEFORE INSERT OR UPDATE ON qinglong.{table} "
                f"FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION {schema}.refuse()")
    return schema


def allow(cluster, table: str, schema: str) -> None:
    cluster.sql(f"DROP TRIGGER IF EXISTS {schema}_refuse ON qinglong.{table}")
    cluster.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def api_events(api: ApiGateway) -> list[dict]:
    return [json.loads(line) for line in api.text().splitlines() if line.startswith("{")]


def at(event: dict) -> datetime.datetime:
    return datetime.datetime.strptime(event["at"], "%Y-%m-%dT%H:%M:%SZ")


def test_a_call_the_store_fails_is_a_500_and_an_error_not_an_outage(cluster, tmp_path):
    """Every database error the gateway did not recognise was "store unavailable": a 503, a
    warning at most once per "outage", and a worker retrying every half second forever, so a
    defect in a worker function (a violated constraint, an error in its SQL) hid as a flaky
    database. Now it is a 500 ``store_failed``, an error on the API tier naming the call (never
    a token, the DSN or its password), an error on the worker, which sends that call again only
    after a growing pause, and nothing in the store changes."""
    settings = plane_settings(cluster, tmp_path)
    raw_token = register(settings, "w-raw")
    token = register(settings, "w-failing")
    api = ApiGateway(settings, tmp_path / "api.stderr")
    schema = refuse(cluster, "worker_sessions")
    client = WorkerHttp(api.port, raw_token)
    worker = None
    try:
        before = dump(cluster)
        status, body = client.call("open_session", {"lease_ms": 15_000})
        assert status == 500, body
        assert body["error"]["code"] == "store_failed", body
        assert dump(cluster) == before

        (logged,) = wait_until(lambda: [e for e in api_events(api) if e["code"] == "gateway.store_failed"],
                               "the gateway's error")
        assert logged["level"] == "error", logged
        assert "open_session" in logged["message"] and "worker_open_session" in logged["message"], logged
        assert "23514" in logged["message"], logged
        assert logged["worker_id"] == "w-raw", logged
        assert not any(e["code"] == "gateway.store_unavailable" for e in api_events(api))

        worker = start_gateway_worker(api.url, token, tmp_path, "w-failing")
        reports = worker.wait_event("worker.store_failed", count=3)
        assert all(e["level"] == "error" for e in reports), reports
        assert "500" in reports[0]["message"] and "open_session" in reports[0]["message"], reports
        # paused 1 s, then 2 s: not sent again every half second as an outage is
        assert (at(reports[2]) - at(reports[0])).total_seconds() >= 2, reports
        assert worker.events("worker.store_unavailable") == []
        assert cluster.sql("SELECT count(*) FROM qinglong.worker_sessions")[0][0] == 0

        text = api.text() + worker.text()
        for secret in (token, raw_token, ROLE_PASSWORDS["qinglong_gateway"]):
            assert secret not in text

        allow(cluster, "worker_sessions", schema)  # the defect fixed: the worker's next try opens its session
        wait_until(lambda: cluster.sql("SELECT count(*) FROM qinglong.worker_sessions WHERE worker_id = %s",
                                       ("w-failing",))[0][0] == 1, "the worker's session")
        worker.signal()
        assert worker.wait() == 0, worker.text()
    finally:
        client.close()
        if worker is not None:
            worker.stop()
        allow(cluster, "worker_sessions", schema)
        api.stop()


def test_a_completion_the_store_fails_is_a_defect_and_changes_nothing(cluster):
    """The gateway's store side called every unrecognised database error an outage, also inside
    ``complete_and_claim``'s pipeline (whose second statement fails as "pipeline aborted", an
    OperationalError): a completion a defect refused was retried as a flaky database forever.
    Both forms of the completion raise StoreFailed naming the function, and neither the
    completion nor the claim in its transaction is left in the store."""
    first = admit(cluster, publish_task(cluster, "failed-a", {"command": py_job("print(1)")}))
    second = admit(cluster, publish_task(cluster, "failed-b", {"command": py_job("print(2)")}))

    async def body():
        gateway = await create_worker_gateway(worker_dsn(cluster), "gateway w-failed", 1)
        try:
            session = await gateway.open_session("w-failed", [], 2, 15_000)
            (held,) = await gateway.claim(session.fence, [new_lease_token()])
            assert held.run_id == first
            await gateway.started(session.fence, held.lease)
            schema = refuse(cluster, "attempts", "NEW.state IN ('succeeded', 'failed')")
            try:
                before = dump(cluster)
                done = AttemptOutcome(AttemptState.SUCCEEDED, exit_code=0, log_bytes=0)
                with pytest.raises(StoreFailed, match=r"worker_complete: CheckViolation \[23514\]"):
                    await gateway.complete_and_claim(session.fence, held.lease, done, [new_lease_token()])
                with pytest.raises(StoreFailed, match=r"worker_complete: CheckViolation \[23514\]"):
                    await gateway.complete(session.fence, held.lease, done)
                assert dump(cluster) == before
            finally:
                allow(cluster, "attempts", schema)
            # the defect fixed, the same completion is accepted on the same connection
            reply, claimed = await gateway.complete_and_claim(session.fence, held.lease, done, [new_lease_token()])
            assert reply.run_state == RunState.SUCCEEDED
            assert [c.run_id for c in claimed] == [second]
        finally:
            await gateway.close()

    asyncio.run(body())
