"""The gateway's readiness, and the gateway killed -9 under a running worker: real PostgreSQL
(both builds), a real ``qinglong api`` over TCP restarted on the same port, a real worker and
real jobs that mark each start of their Attempt."""

from __future__ import annotations

import http.client
import json
import signal
import socket

from tests.gateway.helpers import ApiGateway, plane_settings, register, start_gateway_worker
from tests.worker.helpers import admit, attempts, publish_task, py_job, wait_run_state, wait_until


def readyz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_readiness_fails_while_the_gateways_role_has_no_connection_limit(cluster, tmp_path):
    """Without the check, a role whose CONNECTION LIMIT was dropped would let the API tier (or anyone
    holding its password) take every connection of the server, and nobody would be told."""
    settings = plane_settings(cluster, tmp_path)
    api = ApiGateway(settings, tmp_path / "api.stderr")
    role = "qinglong_gateway"
    try:
        wait_until(lambda: readyz(api.port) == 200, "the API ready")
        cluster.sql(f"ALTER ROLE {role} CONNECTION LIMIT -1")
        try:
            wait_until(lambda: readyz(api.port) == 503, "the API not ready")
            wait_until(lambda: "no CONNECTION LIMIT" in api.text(), "the diagnostic naming the limit")
        finally:
            cluster.sql(f"ALTER ROLE {role} CONNECTION LIMIT 64")
        wait_until(lambda: readyz(api.port) == 200, "the API ready again")
    finally:
        api.stop()


def test_the_api_tier_says_which_setting_made_it_unready(cluster, tmp_path):
    """A DBA sets ``session_replication_role = replica`` for the gateway's role while the API tier
    runs: every worker call would then write with foreign keys and triggers off. ``/readyz``
    turned 503, but the diagnostic said only "the store is not ready: SchemaNotReady": the
    operator of the API tier could not learn what drifted nor the RESET that ends it, while
    ``qinglong run`` names both. The API tier's diagnostic names them too."""
    settings = plane_settings(cluster, tmp_path)
    api = ApiGateway(settings, tmp_path / "api.stderr")
    db = cluster.dbname
    try:
        wait_until(lambda: readyz(api.port) == 200, "the API ready")
        cluster.sql(f"ALTER ROLE qinglong_gateway IN DATABASE {db} SET session_replication_role = replica")
        try:
            wait_until(lambda: readyz(api.port) == 503, "the API not ready")
            (event,) = wait_until(lambda: [json.loads(line) for line in api.text().splitlines()
                                           if '"api.store_not_ready"' in line], "the diagnostic")
            assert "session_replication_role=replica" in event["message"], event
            assert f'ALTER ROLE "qinglong_gateway" IN DATABASE "{db}" RESET session_replication_role' \
                in event["message"], event
        finally:
            cluster.sql(f"ALTER ROLE qinglong_gateway IN DATABASE {db} RESET session_replication_role")
        wait_until(lambda: readyz(api.port) == 200, "the API ready again")
    finally:
        api.stop()


#: The job marks each start of its Attempt (O_EXCL: a second start leaves another file), then runs
#: long enough for the gateway to be killed and restarted under it.
MARK_JOB = r"""
import os, sys, time
marks = sys.argv[1]
name = os.path.join(marks, os.environ["QINGLONG_RUN_ID"] + "." + os.environ["QINGLONG_ATTEMPT"])
try:
    os.close(os.open(name + ".start", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
except FileExistsError:
    os.close(os.open(name + ".again.%d" % os.getpid(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
time.sleep(float(sys.argv[2]))
print("done")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_gateway_killed_9_mid_run_starts_nothing_twice_and_records_each_outcome_once(cluster, tmp_path):
    """Without idempotent calls behind the gateway a worker retrying through a restarted gateway
    could start an Attempt twice, lose its outcome or record it twice; without the self-fence's
    bound on a waiting claim a claim could outlive the gateway."""
    port = free_port()
    settings = plane_settings(cluster, tmp_path)
    text = settings.read_text().replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{port}"')
    settings.write_text(text)
    token = register(settings, "w-chaos", capacity=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    api = ApiGateway(settings, tmp_path / "api-1.stderr")
    worker = None
    try:
        worker = start_gateway_worker(api.url, token, tmp_path, "w-chaos", session_lease_ms=15_000,
                                      heartbeat_ms=1_000, self_fence_margin_ms=2_000, kill_grace_ms=500)
        run_ids = []
        for n, seconds in enumerate(("4", "6")):
            trigger = publish_task(cluster, f"chaos-{n}", {"command": py_job(MARK_JOB, str(marks), seconds),
                                                           "timeout_ms": 120_000})
            run_ids.append(admit(cluster, trigger))
        wait_until(lambda: len(list(marks.glob("*.start"))) == 2, "both jobs started")
        api.kill()  # kill -9 mid-run: heartbeats and log shipping fail until it is back
        worker.wait_event("worker.store_unavailable")
        api = ApiGateway(settings, tmp_path / "api-2.stderr")
        assert api.port == port
        for run_id in run_ids:
            assert wait_run_state(cluster, run_id) == "succeeded", worker.text()
        # a third Run after the restart: a waiting claim through the new gateway takes it
        trigger = publish_task(cluster, "chaos-after", {"command": py_job(MARK_JOB, str(marks), "0"),
                                                        "timeout_ms": 60_000})
        run_ids.append(admit(cluster, trigger))
        assert wait_run_state(cluster, run_ids[-1]) == "succeeded"
        for run_id in run_ids:
            (attempt,) = attempts(cluster, run_id)
            assert attempt["state"] == "succeeded"
        assert len(list(marks.glob("*.start"))) == 3
        assert list(marks.glob("*.again.*")) == []
        events = cluster.sql("SELECT run_id::text, count(*) FROM qinglong.run_events WHERE event_type = 'run.finished' "
                             "GROUP BY run_id")
        assert sorted(events) == sorted((r, 1) for r in run_ids)
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        if worker is not None:
            worker.stop()
        api.stop()


def test_a_gateway_whose_store_is_away_tells_no_caller_where_the_store_is(cluster, tmp_path):
    """While the gateway's database could not be reached, any caller that sent ``Bearer qlw_``
    and anything (no registration needed: the token's lookup is what failed) was answered 503
    with the database's host, port, name and role and libpq's own words: the map of the store's
    network handed to whoever asks, and to every worker host's logs, which are to know nothing
    of the store. The answer is a fixed phrase; the reason goes to the API tier's own
    diagnostics, once per outage, without the password."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    password = "gw-Sekrit-4711"
    dsn = (f"host=127.0.0.1 port={port} user=qinglong_gateway password={password} "
           f"dbname={cluster.dbname} connect_timeout=2")
    api = ApiGateway(plane_settings(cluster, tmp_path, gateway_dsn=dsn), tmp_path / "api.stderr")
    try:
        answers = []
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=60)
            try:
                conn.request("POST", "/worker/v1/open_session", body=b"{}",
                             headers={"Authorization": "Bearer qlw_made-up", "Content-Type": "application/json"})
                response = conn.getresponse()
                answers.append((response.status, response.read().decode()))
            finally:
                conn.close()
        for status, body in answers:
            assert status == 503, body
            assert json.loads(body)["error"]["code"] == "store_unavailable", body
            for detail in (str(port), cluster.dbname, "qinglong_gateway", "127.0.0.1", "PostgreSQL", password):
                assert detail not in body, (detail, body)
        reasons = [json.loads(line) for line in api.text().splitlines()
                   if line.startswith("{") and '"gateway.store_unavailable"' in line]
        assert len(reasons) == 1, api.text()  # once for the outage, not once per request
        assert str(port) in reasons[0]["message"] and password not in api.text()
    finally:
        api.stop()


def test_readiness_refuses_a_gateway_dsn_that_logs_in_as_another_role(cluster, tmp_path):
    """The gateway's check read ``current_user`` but never compared it with ``[backend]
    gateway_role``: a ``gateway_dsn`` logging in as a superuser whose login switches to the
    gateway's role (``ALTER ROLE ... SET role``) passed every check, so the API tier served
    workers over a superuser's session, and a DSN of another role with a connection limit was
    refused with words that never said the DSN named the wrong role. Readiness now names the
    configured and the actual role (``current_user`` and ``session_user``), never the password."""
    from tests.support.postgres import fresh_name

    password = "gw-impostor-secret-Pw4"
    other, switching = fresh_name("gw_other"), fresh_name("gw_switch")
    # superusers, so no grant on the database is needed (one would be drift readiness refuses)
    cluster.sql(f"CREATE ROLE {other} LOGIN SUPERUSER CONNECTION LIMIT 8 PASSWORD '{password}'")
    cluster.sql(f"CREATE ROLE {switching} LOGIN SUPERUSER CONNECTION LIMIT 8 PASSWORD '{password}'")
    cluster.sql(f"ALTER ROLE {switching} SET role = 'qinglong_gateway'")
    try:
        for n, (login, actual) in enumerate(((other, f"current_user {other!r}, session_user {other!r}"),
                                              (switching, f"current_user 'qinglong_gateway', "
                                                          f"session_user {switching!r}"))):
            dsn = cluster.server.dsn(login, password, cluster.dbname)
            settings = plane_settings(cluster, tmp_path, gateway_dsn=dsn)
            api = ApiGateway(settings, tmp_path / f"api-{n}.stderr")
            try:
                (event,) = wait_until(lambda: [json.loads(line) for line in api.text().splitlines()
                                               if '"api.gateway_not_ready"' in line], "the diagnostic")
                assert readyz(api.port) == 503
                assert "'qinglong_gateway' ([backend] gateway_role)" in event["message"], event
                assert actual in event["message"], event
                assert password not in api.text()
            finally:
                api.stop()
        # the configured role itself is ready
        api = ApiGateway(plane_settings(cluster, tmp_path), tmp_path / "api-ok.stderr")
        try:
            wait_until(lambda: readyz(api.port) == 200, "the API ready")
        finally:
            api.stop()
    finally:
        cluster.sql(f"DROP ROLE {other}")
        cluster.sql(f"DROP ROLE {switching}")
