"""``qinglong run`` with its HTTP surface in a subprocess, a systemd-style notify socket, and a
plain HTTP client (the standard library's, as an operator's curl would speak it)."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from host_helpers import REPO, StderrLines, run_cli

LISTENING = re.compile(r"HTTP surface listening on ([0-9.]+|\[[0-9a-f:]+\]):(\d+)")


class NotifySocket:
    """A datagram socket in the abstract namespace, as systemd's ``$NOTIFY_SOCKET`` is."""

    def __init__(self) -> None:
        self.name = f"@qinglong-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])

    def receive(self, timeout: float = 60) -> str:
        self.sock.settimeout(timeout)
        return self.sock.recv(4096).decode()

    def close(self) -> None:
        self.sock.close()


def fetch(port: int, path: str) -> tuple[int, bytes]:
    """``GET path`` on the loopback port: the status and the body's bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def surface_port(lifecycle: Any) -> int:
    """The port the HTTP surface of an in-process lifecycle listens on."""
    (surface,) = [c for c in lifecycle._started if c.name == "http"]
    return surface.port


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_") and k != "NOTIFY_SOCKET"}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def write_settings(root: Path, *, profile: str = "edge", http: str = 'listen = "127.0.0.1:0"',
                   extra: str = "") -> Path:
    settings = root / "settings.toml"
    settings.write_text(
        f'profile = "{profile}"\n[backend]\npath = "{root / "q.db"}"\n'
        "[execution]\npoll_ms = 100\ndefault_timeout_ms = 60000\nkill_grace_ms = 1000\n"
        + extra + (f"[http]\n{http}\n" if http else ""))
    return settings


def cli(settings: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = run_cli(["--settings", str(settings), *args], cwd=settings.parent, env=env or child_env())
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


class Plane:
    """``qinglong run`` until stopped; ``port`` read from its ``http.listening`` line, ``READY=1``
    awaited on the notify socket."""

    def __init__(self, settings: Path, *, env: dict[str, str] | None = None, http: bool = True) -> None:
        self.notify = NotifySocket()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "qinglong", "--settings", str(settings), "run"], cwd=settings.parent,
            env=dict(env or child_env(), NOTIFY_SOCKET=self.notify.name), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        self.stderr = StderrLines(self.process.stderr)
        self.ready_message = self.notify.receive()
        self.port = 0
        if http:
            match = LISTENING.search(self.stderr.wait_for("http.listening", timeout=60))
            assert match, self.stderr.text()
            self.port = int(match.group(2))

    def connection(self, timeout: float = 60) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
        conn = self.connection()
        try:
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read().decode("utf-8", "replace"), response
        finally:
            conn.close()

    def stop(self) -> int:
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
            self.notify.close()
