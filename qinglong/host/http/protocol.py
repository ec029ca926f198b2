"""uvicorn's h11 connection, bounded: a deadline to receive each request, a 431 for an oversized
head, a 400 for a target that is not ASCII, and a connection cap that evicts the oldest idle
connection rather than refusing a new one, so the probes are answered whatever other clients hold.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

_order = itertools.count()


class BoundedH11Protocol(H11Protocol):
    """One connection. Set as ``Config(http=...)``; the bounds come from ``config.qinglong_bounds``
    (``max_connections``, ``request_timeout_s``, ``max_header_bytes``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bounds = self.config.qinglong_bounds  # type: ignore[attr-defined]
        self._max_connections: int = bounds["max_connections"]
        self._request_timeout_s: float = bounds["request_timeout_s"]
        self._max_header_bytes: int = bounds["max_header_bytes"]
        self._deadline: asyncio.TimerHandle | None = None
        self._received = False  # bytes of the next request arrived (not idle)
        self.opened = next(_order)

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets this only on sockets made with proto IPPROTO_TCP; without it each
            # answer written in parts waits out the client's delayed ACK (40 ms a request)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm()
        if len(self.connections) > self._max_connections:
            self._evict_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    @property
    def idle(self) -> bool:
        """No request is being served on it (waiting for one, or half-received)."""
        return self.cycle is None or self.cycle.response_complete

    def _evict_idle(self) -> None:
        """Close the oldest idle connections until the cap holds again: an idle or slow client
        never keeps a new one (a probe) out. Busy connections are never cut."""
        idle = sorted((c for c in self.connections if c is not self and getattr(c, "idle", False)),
                      key=lambda c: c.opened)
        excess = len(self.connections) - self._max_connections
        for conn in idle[:excess]:
            conn.transport.close()
            self.connections.discard(conn)

    # ------------------------------------------------------------------ the request deadline

    def _arm(self) -> None:
        self._disarm()
        self._received = False
        self._deadline = self.loop.call_later(self._request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.idle:
            if self._received:
                self._reject(408, "request not received in time")
            else:
                self.transport.close()  # idle past its bound
        elif self.cycle.more_body:
            self.cycle.disconnected = True  # a body too slow: the handler sees a disconnect
            self.cycle.message_event.set()
            self.transport.close()
        # else: the whole request arrived and its handler runs (a log follow may be long)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.idle:
            self._arm()  # the first bytes of a request after the keep-alive timer
        self._received = True
        try:
            super().data_received(data)
        except UnicodeDecodeError:
            self._reject(400, "the request target is not ASCII")
            return
        if self.cycle is not None and not self.cycle.response_complete and not self.cycle.more_body:
            self._disarm()  # the whole request arrived: the handler's own time is not bounded here

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.idle:
            self._arm()

    def timeout_keep_alive_handler(self) -> None:
        self._disarm()
        super().timeout_keep_alive_handler()

    # ------------------------------------------------------------------ refusals

    def send_400_response(self, msg: str) -> None:
        buffered = len(self.conn.trailing_data[0])
        if buffered > self._max_header_bytes:
            self._reject(431, f"request line and headers over {self._max_header_bytes} bytes")
        else:
            self._reject(400, "bad request")

    def _reject(self, status: int, message: str) -> None:
        self._disarm()
        body = (message + "\n").encode()
        head = (f"HTTP/1.1 {status} {h11_reason(status)}\r\ncontent-type: text/plain; charset=utf-8\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\ncache-control: no-store\r\n\r\n")
        if not self.transport.is_closing():
            self.transport.write(head.encode("latin-1") + body)
            self.transport.close()


def h11_reason(status: int) -> str:
    from http import HTTPStatus

    return HTTPStatus(status).phrase
