"""A real ``qinglong run`` serving the management API over TCP, tokens made with the real CLI, and a
plain HTTP client (the standard library's)."""

from __future__ import annotations

import http.client
import json
import sqlite3
from pathlib import Path
from typing import Any

from http_helpers import Plane, child_env, cli, write_settings

API_HTTP = 'listen = "127.0.0.1:0"\nrequest_timeout_ms = 60000'


def api_settings(root: Path, *, extra: str = "", http: str = API_HTTP) -> Path:
    return write_settings(root, http=http, extra="[api]\nenabled = true\n" + extra)


def make_token(settings: Path, name: str, scope: str, *projects: str) -> str:
    args = ["token", "create", name, "--scope", scope]
    for project in projects:
        args += ["--project", project]
    return cli(settings, *args).strip()


class Client:
    """One keep-alive connection speaking JSON with a bearer token."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.port = port
        self.token = token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                token: str | None = None) -> tuple[int, Any, http.client.HTTPResponse]:
        sent = dict(headers or {})
        bearer = token if token is not None else self.token
        if bearer is not None and "Authorization" not in sent:
            sent["Authorization"] = f"Bearer {bearer}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        self.conn.request(method, path, body=data, headers=sent)
        response = self.conn.getresponse()
        raw = response.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        return response.status, parsed, response

    def close(self) -> None:
        self.conn.close()


def store_dump(db: Path) -> list[tuple]:
    """Every row of every table of the SQLite file (the audit log too), for before/after checks."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        rows: list[tuple] = []
        for table in tables:
            rows += [(table, *r) for r in conn.execute(f"SELECT * FROM \"{table}\" ORDER BY 1")]
        return rows
    finally:
        conn.close()


__all__ = ["API_HTTP", "Client", "Plane", "api_settings", "child_env", "cli", "make_token", "store_dump"]


class ApiProcessPlane:
    """``qinglong api`` until stopped; ``port`` read from its ``http.listening`` line."""

    def __init__(self, settings: Path, *, env: dict[str, str] | None = None) -> None:
        import re
        import subprocess
        import sys

        from host_helpers import StderrLines

        self.process = subprocess.Popen(
            [sys.executable, "-m", "qinglong", "--settings", str(settings), "api"], cwd=settings.parent,
            env=env or child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr = StderrLines(self.process.stderr)
        line = self.stderr.wait_for("http.listening", timeout=60)
        self.port = int(re.search(r"listening on [^ ]+:(\d+)", line).group(1))

    def stop(self) -> int:
        import signal

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.stderr.finish(timeout=60)
            self.process.stderr.close()
