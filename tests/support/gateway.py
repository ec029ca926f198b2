"""The worker gateway for tests: a real ``qinglong api`` serving ``/worker/v1`` over TCP on a real
cluster database, workers registered with the real CLI (``qinglong worker register``), and real
``qinglong worker`` processes speaking to it with ``[worker] url`` and a 0600 token file.

A worker's labels and capacity come from its registration; :meth:`GatewayPlane.start_worker`
registers it with the labels and ``max_running`` it is started with, so the two agree.
The ``worker_gateway`` fixture gives a started plane on the ``cluster`` database, stopped after
the test.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cliserver import run_qinglong
from tests.support.cluster import ClusterDb
from tests.support.pg import ROLE_PASSWORDS
from tests.worker.helpers import SHORT_TIMING, WorkerProcess, wait_until


def gateway_role_dsn(db: ClusterDb, host: str | None = None, port: int | None = None) -> str:
    """The gateway's role's DSN on ``db`` (through ``host:port``, a proxy, when given)."""
    password = ROLE_PASSWORDS["qinglong_gateway"]
    if host is None:
        return db.dsn("qinglong_gateway")
    return (f"host={host} port={port} user=qinglong_gateway password={password} "
            f"dbname={db.dbname} connect_timeout=2")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def plane_settings(db: ClusterDb, root: Path, *, pool_size: int = 2, claim_wait_ms: int = 20_000,
                   max_connections: int = 64, gateway_dsn: str | None = None) -> Path:
    """A cluster settings file for ``qinglong api`` with the worker gateway on (mode 0600)."""
    path = root / "api.toml"
    path.write_text("\n".join([
        'profile = "cluster"',
        "[backend]",
        f'runtime_dsn = "{db.dsn("qinglong_runtime")}"',
        f'admin_dsn = "{db.dsn("qinglong_admin")}"',
        f'owner_dsn = "{db.dsn("qinglong_owner")}"',
        "[http]",
        'listen = "127.0.0.1:0"',
        f"max_connections = {max_connections}",
        "request_timeout_ms = 60000",
        "[api]",
        "enabled = true",
        f'gateway_dsn = "{gateway_dsn or gateway_role_dsn(db)}"',
        f"gateway_pool_size = {pool_size}",
        f"gateway_claim_wait_ms = {claim_wait_ms}",
        '[diagnostics]\nformat = "json"',
    ]) + "\n")
    path.chmod(0o600)
    return path


def cli(settings: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = run_qinglong(["--settings", str(settings), *args], cwd=os.getcwd(), env=child_env(),
                        timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"qinglong {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def register(settings: Path, name: str, *, labels: tuple[str, ...] = (), projects: tuple[str, ...] = (),
             capacity: int = 2) -> str:
    """Register worker ``name`` with the real CLI; its token (printed once)."""
    args = ["worker", "register", name, "--capacity", str(capacity)]
    for label in labels:
        args += ["--label", label]
    for project in projects:
        args += ["--project", project]
    token = cli(settings, *args).stdout.strip()
    assert token.startswith("qlw_")
    return token


class ApiGateway:
    """``qinglong api`` with the gateway on, until stopped; its port from ``http.listening``."""

    def __init__(self, settings: Path, stderr_path: Path) -> None:
        self.settings = settings
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "qinglong", "--settings", str(settings), "api"],
                                     env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, start_new_session=True)
        self.port = wait_until(self._port, "the API's http.listening line")

    def _port(self) -> int | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"qinglong api exited {self.proc.returncode}:\n{self.text()}")
        found = re.search(r"listening on [^ \"]+:(\d+)", self.text())
        return int(found.group(1)) if found else None

    def text(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


class WorkerHttp:
    """A raw client of ``/worker/v1`` holding one token (what an attacker's script would do)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=90)

    def call(self, name: str, body: dict[str, Any], *, token: str | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode()
        self.conn.request("POST", f"/worker/v1/{name}", body=data, headers={
            "Authorization": f"Bearer {token or self.token}", "Content-Type": "application/json"})
        response = self.conn.getresponse()
        raw = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=90)
        return response.status, (json.loads(raw) if raw else None)

    def close(self) -> None:
        self.conn.close()


def write_token_file(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def write_gateway_worker_settings(path: Path, *, url: str, token: str, worker_id: str, log_dir: Path,
                                  max_running: int = 2, level: str = "info", **worker: object) -> Path:
    """A worker's settings with ``[worker] url`` and its token in a 0600 file beside them."""
    token_file = write_token_file(path.with_suffix(".token"), token)
    values = dict(SHORT_TIMING, max_running=max_running, drain_timeout_ms=60_000, claim_wait_ms=5_000)
    values.update(worker)
    lines = ['profile = "cluster"', f'[diagnostics]\nlevel = "{level}"\nformat = "json"', "[worker]",
             f'worker_id = "{worker_id}"', f'log_dir = "{log_dir}"', f'url = "{url}"',
             f'token_file = "{token_file}"']
    lines += [f"{key} = {json.dumps(value) if isinstance(value, str) else value}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def start_gateway_worker(url: str, token: str, tmp_path: Path, name: str, **settings: object) -> WorkerProcess:
    path = write_gateway_worker_settings(tmp_path / f"{name}.toml", url=url, token=token, worker_id=name,
                                         log_dir=tmp_path / f"{name}-logs", **settings)
    return WorkerProcess(path, tmp_path / f"{name}.stderr")


class GatewayPlane:
    """A started ``qinglong api`` with the gateway on ``db``; its files under ``root``."""

    def __init__(self, db: ClusterDb, root: Path, **plane: Any) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.db = db
        self.root = root
        self.settings = plane_settings(db, root, **plane)
        self.api = ApiGateway(self.settings, root / "api.stderr")

    @property
    def url(self) -> str:
        return self.api.url

    def register(self, name: str, labels: tuple[str, ...] = (), projects: tuple[str, ...] = (),
                 capacity: int = 2) -> str:
        """Register worker ``name`` (the real CLI); its token."""
        return register(self.settings, name, labels=labels, projects=projects, capacity=capacity)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return cli(self.settings, *args, check=check)

    def start_worker(self, tmp_path: Path, name: str, *, labels: tuple[str, ...] = (),
                     projects: tuple[str, ...] = (), max_running: int = 2, token: str | None = None,
                     **settings: object) -> WorkerProcess:
        """A ``qinglong worker`` whose id is ``name``, registered first (labels, projects and
        capacity ``max_running``) unless ``token`` is given; settings, token file, log folder and
        stderr file under ``tmp_path``."""
        if token is None:
            token = self.register(name, labels, projects, max_running)
        return start_gateway_worker(self.url, token, tmp_path, name, max_running=max_running, **settings)

    def stop(self) -> None:
        self.api.stop()


@pytest.fixture
def worker_gateway(cluster, tmp_path):
    """A started gateway on the test's cluster database."""
    plane = GatewayPlane(cluster, tmp_path / "gateway-plane")
    try:
        yield plane
    finally:
        plane.stop()
