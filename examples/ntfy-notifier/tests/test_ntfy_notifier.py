"""The example ntfy notifier against a real HTTP receiver on the loopback, built through the
host's plugin machinery exactly as ``qinglong run`` builds a channel."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import qinglong_ntfy
from qinglong.contracts.events import DeliveryFailed, Message, OutboxEvent
from qinglong.host.plugins import PluginHost


class Receiver:
    def __init__(self, status: int = 200) -> None:
        received = self.received = []
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, dict(self.headers), body.decode()))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


EVENT = OutboxEvent("0f" * 16, 1, "run.failed", "ops/backup", "ops", "backup", "nightly",
                    "run-1", "failed", 3, 1500, "exit status 3", 1_800_000_000_000)


def spec():
    host = PluginHost()
    host.register(qinglong_ntfy, "ntfy")
    return host.notifier_specs()["ntfy"]


def test_a_failed_run_is_pushed_to_the_topic_with_high_priority_and_its_event_id(monkeypatch):
    """A push that lost its topic, its priority or its event id would reach nobody, wake nobody,
    or be shown twice on a redelivery."""
    receiver = Receiver()
    monkeypatch.setenv("NTFY_TOKEN", "tk_abcdef123456")
    try:
        notifier = spec().create("phone", {"kind": "ntfy", "server": receiver.url,
                                           "topic": "backups", "token_env": "NTFY_TOKEN"})
        asyncio.run(notifier.send(Message(EVENT, ("last line",))))
        [(path, headers, body)] = receiver.received
        assert path == "/backups"
        assert headers["Priority"] == "high" and headers["X-Qinglong-Event"] == EVENT.event_id
        assert headers["Authorization"] == "Bearer tk_abcdef123456"
        assert "state: failed" in body and "exit code: 3" in body and "last line" in body
        assert "tk_abcdef123456" not in repr(notifier)
    finally:
        receiver.close()


def test_a_refusing_server_is_a_failed_try_and_bad_options_are_refused():
    receiver = Receiver(status=503)
    try:
        notifier = spec().create("phone", {"kind": "ntfy", "server": receiver.url, "topic": "t"})
        with pytest.raises(DeliveryFailed, match="HTTP 503"):
            asyncio.run(notifier.send(Message(EVENT)))
    finally:
        receiver.close()
    with pytest.raises(ValueError, match="topic"):
        spec().create("phone", {"kind": "ntfy", "server": "http://x", "topic": "a/b"})
