"""The management API of a real ``qinglong run`` over TCP: the CLI's shapes, one error shape, scopes,
project limits, Idempotency-Key, logs, status and cron preview, and failed authentication
rate-limited per address."""

from __future__ import annotations

import json
from urllib.parse import quote

from qinglong.contracts.jitter import JitteredSchedule
from qinglong.contracts.providers import fire_times
from qinglong.plugins.cron.provider import CronProvider

from api_helpers import API_HTTP, Client, Plane, api_settings, cli, make_token
from host_helpers import wait_until


def test_the_api_speaks_the_cli_json_shapes_with_one_error_shape(tmp_path):
    """An API whose shapes drifted from `--json` breaks every script that moves from the CLI to the
    API; errors of several shapes make clients guess; a Run admitted twice for one Idempotency-Key
    runs a job twice."""
    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    write = make_token(settings, "deployer", "write")
    plane = Plane(settings)
    client = Client(plane.port, write)
    try:
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/tasks/hello",
                                         {"payload": {"command": ["sh", "-c", "echo hello api"]}})
        assert status == 200, body
        assert body["task_revision"] == 1
        status, shown, _ = client.request("GET", "/api/v1/projects/ops/tasks/hello")
        assert status == 200
        assert shown == json.loads(cli(settings, "task", "show", "ops", "hello", "--json"))
        status, listed, _ = client.request("GET", "/api/v1/projects/ops/tasks")
        assert listed == json.loads(cli(settings, "task", "list", "ops", "--json"))
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/triggers/nightly",
                                         {"task_id": "hello", "kind": "cron",
                                          "spec": {"expression": "30 2 * * *", "timezone": "UTC"}})
        assert status == 201, body
        status, triggers, _ = client.request("GET", "/api/v1/projects/ops/triggers")
        assert triggers == json.loads(cli(settings, "trigger", "list", "ops", "--json"))
        status, nxt, _ = client.request("GET", "/api/v1/projects/ops/triggers/nightly/next?count=2")
        assert status == 200 and len(nxt["next"]) == 2 and nxt["next"][0]["at"].endswith("02:30:00.000Z")
        # a jitter set through the API is kept by an update that leaves it out, and the preview
        # shows the starts the scheduler will make, not the nominal times
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/triggers/nightly", {"jitter_ms": 600_000})
        assert status == 200 and body["jitter_ms"] == 600_000, body
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/triggers/nightly", {"enabled": True})
        assert status == 200 and body["jitter_ms"] == 600_000, body
        status, moved, _ = client.request("GET", "/api/v1/projects/ops/triggers/nightly/next?count=2&after_ms=0")
        spec = CronProvider().validate({"expression": "30 2 * * *", "timezone": "UTC"})
        assert [t["at_ms"] for t in moved["next"]] == fire_times(
            JitteredSchedule(CronProvider(), "ops", "nightly", 600_000), spec, 0, 2)

        headers = {"Idempotency-Key": "deploy-42"}
        first = client.request("POST", "/api/v1/projects/ops/tasks/hello/runs", headers=headers)
        again = client.request("POST", "/api/v1/projects/ops/tasks/hello/runs", headers=headers)
        assert (first[0], again[0]) == (201, 200)
        assert first[1]["run_id"] == again[1]["run_id"] and again[1]["created"] is False
        run_id = first[1]["run_id"]

        def ended():
            status, run, _ = client.request("GET", f"/api/v1/runs/{run_id}")
            return run if run["state"] == "succeeded" else None

        run = wait_until(ended, "the manual Run to succeed", timeout=60, every=0.1, alive=plane.process)
        assert run == json.loads(cli(settings, "runs", "show", run_id, "--json"))
        status, page, _ = client.request("GET", "/api/v1/runs?limit=50")
        assert page["runs"] == [{k: v for k, v in r.items() if k != "idempotency_key"}
                                for r in json.loads(cli(settings, "runs", "--json", "--limit", "50"))]
        assert [r["run_id"] for r in page["runs"]] == [run_id] and page["next"] is None
        status, log, response = client.request("GET", f"/api/v1/runs/{run_id}/log")
        assert status == 200 and log == b"hello api\n" and response.getheader("X-Log-Size") == "10"
        status, part, _ = client.request("GET", f"/api/v1/runs/{run_id}/log?offset=6&length=3")
        assert part == b"api"
        status, stream, response = client.request("GET", f"/api/v1/runs/{run_id}/log?follow=1")
        assert response.getheader("Content-Type").startswith("text/event-stream")
        assert b"event: log\ndata: hello api\n" in stream and stream.endswith(b"event: end\ndata: the attempt ended\n\n")
        status, cancelled, _ = client.request("POST", f"/api/v1/runs/{run_id}/cancel")
        assert (status, cancelled) == (200, {"run_id": run_id, "state_before": "succeeded", "state": "succeeded"})

        status, state, _ = client.request("GET", "/api/v1/status")
        assert status == 200 and state["profile"] == "edge" and state["ready"] is True
        assert set(state) == set(json.loads(cli(settings, "status", "--once", "--json")))
        spec = quote(json.dumps({"expression": "0 9 * * 1-5"}))
        status, preview, _ = client.request("GET", f"/api/v1/kinds/cron/next?spec={spec}&count=3")
        assert status == 200 and len(preview["next"]) == 3
        status, refused, _ = client.request("GET", f"/api/v1/kinds/cron/next?spec={quote(json.dumps({'expression': '61 * * * *'}))}")
        assert status == 422 and "minute" in refused["error"]["message"], refused
        status, unknown, _ = client.request("GET", f"/api/v1/kinds/nosuchkind/next?spec={spec}")
        assert status in (404, 422), unknown

        for method, path, body, expected, code, field in (
                ("GET", "/api/v1/runs/nosuchrun", None, 404, "unknown", None),
                ("GET", "/api/v1/projects/nope/tasks", None, 404, "unknown", None),
                ("POST", "/api/v1/projects", {"project_id": "ops"}, 409, "conflict", None),
                ("PUT", "/api/v1/projects/ops/tasks/bad", {"payload": {"command": ["x"], "timeout_ms": -1}},
                 422, "invalid", None),
                ("PUT", "/api/v1/projects/ops/tasks/bad", {}, 422, "invalid", "payload"),
                ("PUT", "/api/v1/projects/ops/tasks/bad", {"nothing": 1}, 422, "invalid", "nothing"),
                ("GET", "/api/v1/runs?limit=0", None, 422, "invalid", "limit")):
            status, body, _ = client.request(method, path, body)
            assert status == expected, (path, status, body)
            assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "field"}, body
            assert body["error"]["code"] == code and body["error"]["field"] == field, (path, body)
    finally:
        client.close()
        plane.stop()


def test_scopes_nest_and_a_project_token_sees_nothing_of_other_projects(tmp_path):
    """A read token that could start a Run, or a token of one team that could see (or learn the
    existence of) another team's tasks and logs, hands one team's credential the other's hosts."""
    settings = api_settings(tmp_path)
    for project in ("ops", "web"):
        cli(settings, "project", "create", project)
        cli(settings, "task", "put", project, "job", "--", "sh", "-c", "echo secret-of-" + project)
    read = make_token(settings, "dash", "read")
    run = make_token(settings, "runner", "run", "ops")
    admin = make_token(settings, "root", "admin")
    plane = Plane(settings)
    client = Client(plane.port)
    try:
        status, body, _ = client.request("POST", "/api/v1/projects/ops/tasks/job/runs", token=read)
        assert status == 403 and body["error"]["code"] == "forbidden"
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/tasks/job", {"payload": {"command": ["x"]}},
                                         token=run)
        assert status == 403
        status, made, _ = client.request("POST", "/api/v1/projects/ops/tasks/job/runs", token=run)
        assert status == 201
        status, body, _ = client.request("POST", "/api/v1/projects/web/tasks/job/runs", token=run)
        missing, _, _ = client.request("POST", "/api/v1/projects/nowhere/tasks/job/runs", token=run)
        assert (status, missing) == (404, 404)
        assert body["error"]["message"] == "project 'web' does not exist; create it first"
        status, projects, _ = client.request("GET", "/api/v1/projects", token=run)
        assert [p["project_id"] for p in projects] == ["ops"]
        status, web_run, _ = client.request("POST", "/api/v1/projects/web/tasks/job/runs", token=admin)
        assert status == 201
        for path in (f"/api/v1/runs/{web_run['run_id']}", f"/api/v1/runs/{web_run['run_id']}/log"):
            status, body, _ = client.request("GET", path, token=run)
            assert status == 404 and b"secret-of-web" not in json.dumps(body).encode(), (path, body)
        status, page, _ = client.request("GET", "/api/v1/runs", token=run)
        assert {r["project_id"] for r in page["runs"]} == {"ops"}
        status, _, _ = client.request("GET", "/api/v1/runs?project=web", token=run)
        assert status == 404
        status, _, _ = client.request("GET", "/api/v1/audit", token=run)
        assert status == 403
        status, audit, _ = client.request("GET", "/api/v1/audit", token=admin)
        assert [(e["actor"], e["action"], e["object"], e["result"]) for e in audit[:2]] == [
            ("root", "task.run", "web/job", "ok"), ("runner", "task.run", "ops/job", "ok")]
        assert all(e["source"] == "127.0.0.1" for e in audit[:2])
        status, made_token, _ = client.request("POST", "/api/v1/tokens", {"name": "bot", "scope": "read"}, token=admin)
        assert status == 201 and made_token["secret"].startswith("qlt_")
        status, _, _ = client.request("GET", "/api/v1/projects", token=made_token["secret"])
        assert status == 200
        status, tokens, _ = client.request("GET", "/api/v1/tokens", token=admin)
        assert made_token["secret"] not in json.dumps(tokens)
    finally:
        client.close()
        plane.stop()


def test_failed_authentication_is_rate_limited_per_address(tmp_path):
    """Unlimited guesses let a scanner try tokens as fast as the host answers; a limit that slowed
    every client would let one scanner lock the operators out."""
    settings = api_settings(tmp_path, extra="failed_auth_burst = 5\nfailed_auth_per_second = 0.001\n")
    good = make_token(settings, "ok", "read")
    plane = Plane(settings)
    client = Client(plane.port)
    try:
        for _ in range(5):
            assert client.request("GET", "/api/v1/projects", token="qlt_wrong")[0] == 401
        status, body, response = client.request("GET", "/api/v1/projects", token="qlt_wrong")
        assert status == 429 and int(response.getheader("Retry-After")) >= 1
        assert body["error"]["code"] == "rate_limited"
        assert client.request("GET", "/api/v1/projects", token=good)[0] == 429  # this address waits
        other = Client(plane.port)
        other.conn.source_address = ("127.0.0.2", 0)
        try:
            assert other.request("GET", "/api/v1/projects", token=good)[0] == 200  # others do not
        finally:
            other.close()
    finally:
        client.close()
        plane.stop()


def test_qinglong_api_serves_the_api_with_probes_and_refuses_plain_http_off_loopback(tmp_path):
    """A cluster operator needs the API without the scheduler (stateless, behind a Service); one
    listening in clear text on a network address would hand every token to whoever listens."""
    import subprocess
    import sys

    from api_helpers import ApiProcessPlane
    from http_helpers import child_env, write_settings

    settings = write_settings(tmp_path, http='listen = "127.0.0.1:0"')
    cli(settings, "project", "create", "ops")
    token = make_token(settings, "ops-laptop", "read")
    plane = ApiProcessPlane(settings)
    client = Client(plane.port)
    try:
        wait_until(lambda: client.request("GET", "/readyz")[0] == 200, "the store check", timeout=60, every=0.1)
        assert client.request("GET", "/livez")[0] == 200
        assert client.request("GET", "/api/v1/projects")[0] == 401
        assert client.request("GET", "/metrics")[0] == 401
        status, projects, _ = client.request("GET", "/api/v1/projects", token=token)
        assert (status, [p["project_id"] for p in projects]) == (200, ["ops"])
        assert client.request("GET", "/metrics", token=token)[0] == 200
    finally:
        client.close()
        assert plane.stop() == 0
    public = write_settings(tmp_path, http='listen = "0.0.0.0:0"\ntoken = "a-scrape-token-0123456789"')
    refused = subprocess.run([sys.executable, "-m", "qinglong", "--settings", str(public), "api"], env=child_env(),
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3 and "TLS" in refused.stderr and "key 'http.listen'" in refused.stderr


def test_a_run_admitted_or_cancelled_through_the_api_wakes_the_dispatcher(tmp_path):
    """A Run admitted through the API, or a cancel requested there, must not wait for the
    dispatcher's fallback poll (a minute here): the job would start, or go on running after its
    cancel, that long. Each wait below is bounded well inside that minute."""
    settings = tmp_path / "settings.toml"
    settings.write_text(
        f'profile = "edge"\n[backend]\npath = "{tmp_path / "q.db"}"\n'
        "[execution]\npoll_ms = 60000\nkill_grace_ms = 1000\n[api]\nenabled = true\n"
        f"[http]\n{API_HTTP}\n")
    cli(settings, "project", "create", "ops")
    write = make_token(settings, "deployer", "write")
    plane = Plane(settings)
    client = Client(plane.port, write)
    try:
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/tasks/hold",
                                         {"payload": {"command": ["sleep", "600"]}})
        assert status == 200, body
        status, made, _ = client.request("POST", "/api/v1/projects/ops/tasks/hold/runs")
        assert status == 201, made
        run_id = made["run_id"]

        def in_state(state: str):
            def check():
                _, run, _ = client.request("GET", f"/api/v1/runs/{run_id}")
                return run if run["state"] == state else None
            return check

        wait_until(in_state("running"), "the Run started", timeout=30, every=0.1, alive=plane.process)
        status, cancelled, _ = client.request("POST", f"/api/v1/runs/{run_id}/cancel")
        assert status == 200, cancelled
        wait_until(in_state("cancelled"), "the Run cancelled", timeout=30, every=0.1, alive=plane.process)
    finally:
        client.close()
        plane.stop()
