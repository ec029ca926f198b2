"""A real HTTP receiver on the loopback for the notification tests: records every POST (path,
headers, body); it can answer with a chosen status, or hold each request until released."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, status: int = 200) -> None:
        self.received: list[tuple[str, dict, bytes]] = []
        self.status = status
        self.arrived = threading.Condition()
        #: While set, every request waits (after it was recorded) until it is cleared.
        self.hold = threading.Event()
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = dict(self.headers)
                headers["X-Bench-Arrival"] = repr(time.time())
                with outer.arrived:
                    outer.received.append((self.path, headers, body))
                    outer.arrived.notify_all()
                if outer.hold.is_set():
                    outer.released.wait(120)
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 90.0) -> list[tuple[str, dict, bytes]]:
        """Until at least ``count`` requests arrived; all of them."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.received) >= count, timeout):
                raise AssertionError(f"{len(self.received)} of {count} requests arrived")
            return list(self.received)

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
