"""The HTTP surface of a real ``qinglong run``: probes across start and stop, systemd readiness, the
bearer token off loopback (the probes answer without it, with fixed phrases only), request bounds, and a real scrape checked by prometheus_client's parser
and promtool."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from host_helpers import wait_until
from http_helpers import Plane, child_env, cli, fetch, surface_port, write_settings
from qinglong.contracts.observe import METRICS, MetricType

TOKEN = "s3cret-token-" + "x" * 24


def _scrape(plane: Plane, token: str | None = None) -> tuple[dict, str]:
    status, body, _ = plane.get("/metrics", {"Authorization": f"Bearer {token}"} if token else None)
    assert status == 200, body
    return {family.name: family for family in text_string_to_metric_families(body)}, body


def _sample(families: dict, family: str, sample: str, **labels: str) -> float | None:
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_readyz_is_200_from_ready_1_and_503_from_the_first_moment_of_a_stop(tmp_path):
    """A load balancer or Kubernetes that sees 200 before the scheduler runs sends work to a replica
    that cannot do it; one that still sees 200 while the process stops keeps sending work to it;
    systemd that hears READY=1 before /readyz says so starts dependants too early."""
    pidfile = tmp_path / "job.pid"
    settings = write_settings(tmp_path, http='listen = "127.0.0.1:0"\nrequest_timeout_ms = 60000')
    # a stop that takes a while: a job that ignores TERM, and on_stop = terminate with a long grace
    settings.write_text(settings.read_text().replace(
        "kill_grace_ms = 1000\n", 'kill_grace_ms = 120000\non_stop = "terminate"\n')
        + "[lifecycle]\nstop_timeout_ms = 180000\n")
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "stubborn", "--", "sh", "-c",
        f'echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; trap "" TERM; sleep 120')
    cli(settings, "task", "run", "ops", "stubborn")
    plane = Plane(settings)
    job_pid = None
    try:
        assert plane.ready_message == "READY=1"
        keep = plane.connection()  # kept alive across the stop
        keep.request("GET", "/readyz")
        response = keep.getresponse()
        assert (response.status, response.read()) == (200, b"ready\n")
        status, body, _ = plane.get("/livez")
        assert (status, body) == (200, "alive\n")
        job_pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), "the job to run",
                                 timeout=60, every=0.05, alive=plane.process))

        plane.process.send_signal(signal.SIGTERM)
        assert plane.notify.receive() == "STOPPING=1"
        plane.stderr.wait_for("lifecycle.admission_withdrawn", timeout=60)
        keep.request("GET", "/readyz")
        response = keep.getresponse()
        assert response.status == 503
        assert response.read() == b"stopping: the process is shutting down\n"
        keep.request("GET", "/livez")
        response = keep.getresponse()
        assert (response.status, response.read()) == (200, b"alive\n")
        with pytest.raises(ConnectionRefusedError):  # admission withdrawn: no new connection
            socket.create_connection(("127.0.0.1", plane.port), timeout=60).close()
        assert plane.process.poll() is None, "the stop should still wait for the stubborn job"
        keep.close()
        os.killpg(os.getpgid(job_pid), signal.SIGKILL)  # the job ends: the stop completes in order
        assert plane.process.wait(timeout=60) == 0
    finally:
        plane.stop()
        if job_pid is not None:
            try:
                os.killpg(os.getpgid(job_pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_systemd_hears_ready_and_stopping_with_the_http_surface_off(tmp_path):
    """A Type=notify unit of an edge router without [http] would wait for READY=1 until its start
    timeout and be killed, and an edge process without [http] must not pay for prometheus_client."""
    settings = write_settings(tmp_path, http="")
    plane = Plane(settings, http=False)
    try:
        assert plane.ready_message == "READY=1"
        assert "http.listening" not in plane.stderr.text()
        plane.process.send_signal(signal.SIGTERM)
        assert plane.notify.receive() == "STOPPING=1"
        assert plane.process.wait(timeout=60) == 0
    finally:
        plane.stop()
    probe = ("import sys\nfrom qinglong.host.cli import main\n"
             "code = main(['--settings', sys.argv[1], 'run', '--for-seconds', '0.3'])\n"
             "print(code, 'prometheus_client' in sys.modules, 'starlette' in sys.modules and 'uvicorn' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(settings)], env=child_env(), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "False", "False"], (out.stdout, out.stderr)
    on = write_settings(tmp_path, http='listen = "127.0.0.1:0"')
    out = subprocess.run([sys.executable, "-c", probe, str(on)], env=child_env(), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "True", "True"], (out.stdout, out.stderr)


def test_a_listen_address_off_loopback_needs_a_token_that_is_checked_and_never_shown(tmp_path):
    """Without a token a metrics and status endpoint bound to 0.0.0.0 tells anyone on the network
    what runs when; a token printed in stderr ends up in journald and support tickets."""
    settings = write_settings(tmp_path, http='listen = "0.0.0.0:0"')
    refused = subprocess.run([sys.executable, "-m", "qinglong", "--settings", str(settings), "run",
                              "--for-seconds", "5"], env=child_env(), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 3, refused.stderr
    assert "key 'http.listen'" in refused.stderr and "[http] token" in refused.stderr
    assert "lifecycle.database_opened" not in refused.stderr  # refused before anything started

    settings = write_settings(tmp_path, http='listen = "0.0.0.0:0"\ntoken_env = "QL_TEST_HTTP_TOKEN"')
    plane = Plane(settings, env=child_env(QL_TEST_HTTP_TOKEN=TOKEN))
    try:
        for headers in ({}, {"Authorization": "Bearer wrong-" + TOKEN[6:]}, {"Authorization": TOKEN},
                        {"Authorization": f"Basic {TOKEN}"}):
            for path in ("/metrics", "/", "/nowhere"):
                status, body, response = plane.get(path, headers)
                assert status == 401, (path, headers, status)
                assert response.getheader("WWW-Authenticate", "").startswith("Bearer")
                assert TOKEN not in body
        status, body, _ = plane.get("/", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and "<html" in body.lower()
        status, body, _ = plane.get("/metrics", {"Authorization": f"bearer {TOKEN}"})
        assert status == 200 and "qinglong_build_info" in body
    finally:
        plane.stop()
    assert TOKEN not in plane.stderr.finish()


def test_off_loopback_the_probes_answer_without_the_token_and_nothing_else_does(tmp_path):
    """A kubelet httpGet probe cannot send a header from a Secret: if /livez and /readyz wanted the
    token every replica would stay unready (or each pod would pay a whole interpreter per probe);
    if the probe paths opened anything else (a look-alike path, /metrics behind a query), anyone on
    the network would read the metrics and the status page."""
    settings = write_settings(tmp_path, http='listen = "0.0.0.0:0"\ntoken_env = "QL_TEST_HTTP_TOKEN"')
    plane = Plane(settings, env=child_env(QL_TEST_HTTP_TOKEN=TOKEN))
    kubelet = {"User-Agent": "kube-probe/1.32", "Accept": "*/*", "Connection": "close"}
    try:
        # the kubelet's own request, and the same with a wrong or malformed token: probes ignore it
        for headers in (kubelet, dict(kubelet, Authorization="Bearer wrong-" + TOKEN[6:]),
                        dict(kubelet, Authorization="garbage")):
            for path, answer in (("/livez", "alive\n"), ("/readyz", "ready\n"), ("/readyz?full=1", "ready\n")):
                status, body, response = plane.get(path, headers)
                assert (status, body) == (200, answer), (path, headers)
                assert response.getheader("WWW-Authenticate") is None
        conn = plane.connection()
        try:
            conn.request("HEAD", "/readyz")
            head = conn.getresponse()
            assert (head.status, head.read()) == (200, b"")
            conn.request("POST", "/livez", body=b"")
            assert conn.getresponse().status == 405  # still read-only
        finally:
            conn.close()
        for path in ("/metrics", "/", "/metrics?/livez", "/livez/../metrics", "/readyz/"):
            status, body, response = plane.get(path, kubelet)
            assert status == 401, (path, status, body)
            assert response.getheader("WWW-Authenticate", "").startswith("Bearer")
            assert "qinglong_" not in body and "<html" not in body.lower()
    finally:
        plane.stop()
    assert TOKEN not in plane.stderr.finish()


def test_a_probe_answers_only_fixed_phrases_whatever_the_readiness_line_holds(tmp_path):
    """The probes answer anyone on the network: a readiness line that carried an error's text, a
    DSN, a path or a task's environment would hand it to whoever asks; and a start step whose line
    is missing from the fixed phrases would be answered as a bare 'not ready', hiding why."""
    import ast
    import asyncio

    from qinglong.host import lifecycle as lifecycle_module
    from qinglong.host.containers import build_container
    from qinglong.host.http.server import PROBE_LINES
    from qinglong.host.readiness import Readiness
    from qinglong.host.settings import load_settings

    tree = ast.parse(open(lifecycle_module.__file__).read())
    steps = [call.args[0] for call in ast.walk(tree) if isinstance(call, ast.Call)
             and isinstance(call.func, ast.Attribute) and call.func.attr == "starting"]
    assert len(steps) >= 5
    for step in steps:
        assert isinstance(step, ast.Constant), f"line {step.lineno}: a readiness line built from a value"
        assert f"starting: {step.value}" in PROBE_LINES, step.value
    fresh, stopping = Readiness(), Readiness()
    stopping.mark_stopping()
    assert {fresh.reason, stopping.reason} <= PROBE_LINES

    settings = write_settings(tmp_path, http=f'listen = "127.0.0.1:0"\ntoken = "{TOKEN}"')

    async def scenario() -> None:
        lifecycle = build_container(load_settings(settings)).lifecycle()
        await lifecycle.start()
        try:
            port = surface_port(lifecycle)
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, fetch, port, "/readyz") == (200, b"ready\n")
            readiness = lifecycle.readiness
            readiness.ready = False
            readiness.reason = "starting: connecting to postgresql://qinglong:hunter2@db:5432/q"
            assert await loop.run_in_executor(None, fetch, port, "/readyz") == (503, b"not ready\n")
            readiness.reason = "starting: startup recovery"
            assert await loop.run_in_executor(None, fetch, port, "/readyz") == (503, b"starting: startup recovery\n")
            readiness.ready = True
        finally:
            await lifecycle.stop()

    asyncio.run(scenario())


def _raw(port: int, data: bytes, *, timeout: float = 60) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_oversized_requests_slow_clients_and_too_many_connections_are_cut(tmp_path):
    """An unbounded surface lets one client exhaust a router's memory with a huge header, pin a
    connection forever by sending a byte a minute, or take every connection the probes need."""
    settings = write_settings(tmp_path, http='listen = "127.0.0.1:0"\nmax_header_bytes = 2048\n'
                                             'max_body_bytes = 16\nmax_connections = 2\nrequest_timeout_ms = 1500')
    plane = Plane(settings)
    try:
        big = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"a" * 4096 + b"\r\n\r\n"
        assert _raw(plane.port, big).startswith(b"HTTP/1.1 431 ")
        body = b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\n\r\n" + b"b" * 17
        assert _raw(plane.port, body).startswith(b"HTTP/1.1 413 ")
        chunked = b"GET /livez HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        assert _raw(plane.port, chunked).startswith(b"HTTP/1.1 411 ")
        small = b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\nConnection: close\r\n\r\n" + b"c" * 16
        assert _raw(plane.port, small).startswith(b"HTTP/1.1 200 ")
        garbage = b"NOT HTTP AT ALL\r\n\r\n"
        assert _raw(plane.port, garbage).startswith(b"HTTP/1.1 400 ")
        post = b"POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        assert _raw(plane.port, post).startswith(b"HTTP/1.1 405 ")

        # a slow client: half a request line, then nothing; cut by the server, not by us
        started = time.monotonic()
        cut = _raw(plane.port, b"GET /liv", timeout=60)
        assert cut.startswith(b"HTTP/1.1 408 "), cut
        assert time.monotonic() - started < 60

        held = [plane.connection(), plane.connection()]
        for conn in held:  # served once and kept alive: both slots are taken
            conn.request("GET", "/livez")
            assert conn.getresponse().read() == b"alive\n"
        third = _raw(plane.port, b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert third.startswith(b"HTTP/1.1 200 "), third  # the oldest idle one made room
        held[0].request("GET", "/livez")  # it was closed by the server
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine)):
            held[0].getresponse()
        for conn in held:
            conn.close()
    finally:
        plane.stop()


def test_probes_answer_while_idle_connections_hold_every_slot(tmp_path):
    """An orchestrator whose liveness probe is refused while 20 idle TCP connections (a scanner, a
    leaking client, a slow-loris) hold the connection limit restarts a healthy scheduler."""
    settings = write_settings(tmp_path, http='listen = "127.0.0.1:0"\nrequest_timeout_ms = 60000')
    plane = Plane(settings)
    idle = []
    try:
        for _ in range(20):
            idle.append(socket.create_connection(("127.0.0.1", plane.port), timeout=60))
        idle[-1].sendall(b"GET /liv")  # one of them half a request: a slow client
        for path, answer in (("/livez", "alive\n"), ("/readyz", "ready\n")):
            status, body, _ = plane.get(path)
            assert (status, body) == (200, answer), (path, status, body)
        idle.append(socket.create_connection(("127.0.0.1", plane.port), timeout=60))
        status, body, _ = plane.get("/metrics")
        assert status == 200 and "qinglong_build_info" in body
    finally:
        for sock in idle:
            sock.close()
        plane.stop()


def test_a_real_scrape_holds_every_contract_metric_with_its_type_and_promtool_accepts_it(tmp_path):
    """A metric missing, renamed or of another type breaks the alert rules and dashboards written
    against the contract; admissions, their lag and finished attempts that are not counted hide a
    scheduler that fell behind."""
    settings = write_settings(tmp_path, profile="standalone")
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "hello", "--", "sh", "-c", "echo hello")
    cli(settings, "trigger", "add", "ops", "every-second", "--task", "hello", "--cron", "* * * * * *")
    # the standalone profile serves the API, so every path but the probes needs a token
    scraper = cli(settings, "token", "create", "prometheus", "--scope", "read").strip()
    plane = Plane(settings)
    try:
        assert plane.get("/metrics")[0] == 401

        def counted():
            families, body = _scrape(plane, scraper)
            admitted = _sample(families, "qinglong_admissions", "qinglong_admissions_total") or 0
            finished = _sample(families, "qinglong_attempts_finished", "qinglong_attempts_finished_total",
                               outcome="succeeded") or 0
            return (families, body) if admitted >= 2 and finished >= 1 else None

        families, body = wait_until(counted, "two admissions and a finished attempt", timeout=60, every=0.2)
    finally:
        plane.stop()
    for spec in METRICS:
        name = spec.name
        if spec.type is MetricType.COUNTER:
            name = name.removesuffix("_total")
        # the Prometheus text format has no info type: an info metric is a gauge of value 1
        expected_type = "gauge" if spec.type is MetricType.INFO else spec.type.value
        assert name in families, f"{spec.name} missing from the scrape"
        family = families[name]
        assert family.type == expected_type, (spec.name, family.type)
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == set(spec.labels), (spec.name, sample)
    assert _sample(families, "qinglong_build_info", "qinglong_build_info", profile="standalone") == 1
    lags = _sample(families, "qinglong_admission_lag_seconds", "qinglong_admission_lag_seconds_count")
    assert lags is not None and lags >= 2
    assert _sample(families, "qinglong_dispatch_lag_seconds", "qinglong_dispatch_lag_seconds_count") >= 1
    assert _sample(families, "qinglong_schedules_total", "qinglong_schedules_total", enabled="true") == 1
    assert _sample(families, "qinglong_rounds", "qinglong_rounds_total", result="ok") >= 1

    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is needed: .ci/install-system-deps installs it"
    checked = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True,
                             timeout=60)
    findings = [line for line in (checked.stdout + checked.stderr).splitlines() if line.strip()]
    # the one lint promtool reports is the contract's gauge named qinglong_schedules_total
    assert all(line.startswith('qinglong_schedules_total non-counter metrics should not have "_total"')
               for line in findings), findings
    assert "error" not in (checked.stdout + checked.stderr).lower()
