"""A loopback TCP proxy that injects network faults between a replica and PostgreSQL.

Standard library only (the chaos script uses it too). Each accepted client connection gets its
own upstream connection and two pump threads, one per direction. The test controls the proxy
from its own thread while the replicas run:

* :meth:`FaultProxy.set_latency`: every chunk waits ``ms`` (+ uniform jitter) before it is sent on;
  order is kept.
* :meth:`FaultProxy.partition` / :meth:`FaultProxy.heal`: bytes in the given direction(s) stop
  moving. They are not read, so they wait in the kernel's buffers exactly as TCP retransmissions
  wait for a cut link; after :meth:`heal` they are delivered late, which is the dangerous case (a
  stale COMMIT arriving after its lease). New connections made during a partition hang as well.
* :meth:`FaultProxy.cut_all`: every open connection is reset (RST), as a middlebox dropping state.
* :meth:`FaultProxy.refuse` : new connections are reset at once (the host is unreachable).
* :meth:`FaultProxy.arm`: a one-shot :class:`Rule` that fires on the first chunk in a direction
  containing a byte pattern (e.g. the admission statement's text):

  - ``cut_mid``: forward only the first half of that chunk, then reset both sides: the stream
    is cut in the middle of a protocol message;
  - ``hold``: stop that connection's direction from that chunk on, until :meth:`heal` (or
    :meth:`release`), so one statement of one replica hangs while everything else flows;
  - ``hold_mid``: forward the chunk up to the middle of the pattern, then hold the rest as
    ``hold`` does: the link dies in the middle of a protocol message and the server waits for
    the rest of it;
  - ``hold_replies``: forward the chunk, then stop the server's replies on that connection: the
    server executes (and commits) and the client hangs on an open connection;
  - ``cut_reply_mid``: forward the chunk, then cut the server's next reply in half and reset both
    sides: the server executed, the client sees half a message and a reset;
  - ``swallow_replies``: discard everything the server sends back on that connection from now on
    (a ``to_client`` rule discards its own chunk too; a ``to_server`` rule forwards its chunk):
    the server executes and commits, the client never learns it.

The pattern is matched per chunk (a statement's text arrives in one ``send`` from libpq in
practice); :attr:`Rule.fired` tells the test the rule met its chunk.
"""

from __future__ import annotations

import random
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

TO_SERVER = "to_server"
TO_CLIENT = "to_client"
BOTH = "both"
_DIRECTIONS = {TO_SERVER: (TO_SERVER,), TO_CLIENT: (TO_CLIENT,), BOTH: (TO_SERVER, TO_CLIENT)}

_POLL_S = 0.02

#: What an armed :class:`Rule` does to the connection whose chunk matched.
ACTIONS = ("cut_mid", "hold", "hold_mid", "hold_replies", "cut_reply_mid", "swallow_replies")


@dataclass
class Rule:
    """A one-shot fault triggered by the first chunk in ``direction`` that contains ``pattern``
    and every one of ``also`` (to pick one kind of message among those sharing ``pattern``)."""

    direction: str
    pattern: bytes
    action: str  # one of ACTIONS
    also: tuple[bytes, ...] = ()
    fired: threading.Event = field(default_factory=threading.Event)
    connection: "_Connection | None" = None
    fired_at: float | None = None
    chunk: bytes | None = None  # the chunk it fired on, for the test to read (e.g. which trigger)

    def __post_init__(self) -> None:
        if self.direction not in (TO_SERVER, TO_CLIENT):
            raise ValueError(f"direction must be {TO_SERVER!r} or {TO_CLIENT!r}")
        if self.action not in ACTIONS:
            raise ValueError(f"unknown rule action {self.action!r}")


def _reset(sock: socket.socket) -> None:
    """Close with RST (linger 0), not FIN: the peer sees 'connection reset'."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Connection:
    """One proxied client connection: the client socket, its upstream socket, two pumps."""

    def __init__(self, proxy: "FaultProxy", client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.held = {TO_SERVER: False, TO_CLIENT: False}
        self.pending = {TO_SERVER: b"", TO_CLIENT: b""}
        self.swallow_to_client = False
        self.cut_next_reply = False
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        for direction, src, dst in ((TO_SERVER, self.client, self.upstream),
                                    (TO_CLIENT, self.upstream, self.client)):
            threading.Thread(target=self._pump, args=(direction, src, dst), daemon=True,
                             name=f"{self.proxy.name}-{direction}").start()

    def close(self, rst: bool = False) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        for sock in (self.client, self.upstream):
            if rst:
                _reset(sock)
            else:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    sock.close()
                except OSError:
                    pass
        self.proxy._forget(self)

    def _stopped(self, direction: str) -> bool:
        return self.held[direction] or direction in self.proxy._partitioned

    def _pump(self, direction: str, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                if self._stopped(direction):
                    time.sleep(_POLL_S)  # nothing is read: the bytes wait in the kernel
                    continue
                if self.pending[direction]:
                    data, self.pending[direction] = self.pending[direction], b""
                else:
                    try:
                        ready, _, _ = select.select([src], [], [], _POLL_S)
                        if not ready:
                            continue
                        data = src.recv(65536)
                    except (OSError, ValueError):
                        break
                    if not data:
                        break
                    if self._stopped(direction):  # stopped while we waited: keep it for later
                        self.pending[direction] += data
                        continue
                    if self._apply_rules(direction, data):
                        continue
                if direction == TO_CLIENT and self.swallow_to_client:
                    self.proxy.swallowed_bytes += len(data)
                    continue
                if direction == TO_CLIENT and self.cut_next_reply:
                    try:
                        dst.sendall(data[:max(1, len(data) // 2)])
                    except OSError:
                        pass
                    self.close(rst=True)
                    break
                delay = self.proxy._delay()
                if delay:
                    time.sleep(delay)
                if self.closed.is_set():
                    break
                try:
                    dst.sendall(data)
                except OSError:
                    break
                self.proxy.bytes[direction] += len(data)
        finally:
            # EOF or error on one side ends the whole connection, like a dead TCP peer would.
            self.close(rst=False)

    def _apply_rules(self, direction: str, data: bytes) -> bool:
        """Apply the first armed rule this chunk triggers; True when the chunk was consumed."""
        rule = self.proxy._take_rule(direction, data)
        if rule is None:
            return False
        rule.connection = self
        rule.fired_at = time.monotonic()
        rule.chunk = data
        if rule.action == "cut_mid":
            dst = self.upstream if direction == TO_SERVER else self.client
            at = data.find(rule.pattern) + len(rule.pattern) // 2
            try:
                dst.sendall(data[:at])
            except OSError:
                pass
            rule.fired.set()
            self.close(rst=True)
            return True
        if rule.action in ("hold", "hold_mid"):
            if rule.action == "hold_mid":
                at = data.find(rule.pattern) + len(rule.pattern) // 2
                dst = self.upstream if direction == TO_SERVER else self.client
                try:
                    dst.sendall(data[:at])
                except OSError:
                    pass
                self.proxy.bytes[direction] += at
                data = data[at:]
            self.pending[direction] = data
            self.held[direction] = True
            rule.fired.set()
            return True
        if rule.action == "hold_replies":
            self.held[TO_CLIENT] = True
        elif rule.action == "cut_reply_mid":
            self.cut_next_reply = True
        else:  # swallow_replies
            self.swallow_to_client = True
        rule.fired.set()
        return False  # the chunk itself goes on


class FaultProxy:
    """A TCP proxy on ``listen_host`` (an ephemeral port) forwarding to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], *, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, name: str = "proxy") -> None:
        self.upstream = upstream
        self.name = name
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((listen_host, listen_port))
        self._listener.listen(128)
        self._listener.settimeout(_POLL_S * 5)
        self.host, self.port = self._listener.getsockname()[:2]
        self._connections: set[_Connection] = set()
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._partitioned: frozenset[str] = frozenset()
        self._refusing = False
        self._latency = (0.0, 0.0)
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.accepted = 0
        self.refused = 0
        self.swallowed_bytes = 0
        self.bytes = {TO_SERVER: 0, TO_CLIENT: 0}

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name=f"{self.name}-accept")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting and reset every open connection."""
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        self.cut_all()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- controls ----------------------------------------------------------------------------
    def set_latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every chunk by ``ms`` plus up to ``jitter_ms`` (both directions)."""
        self._latency = (ms / 1000, jitter_ms / 1000)

    def partition(self, direction: str = BOTH) -> None:
        """Stop every byte in ``direction`` (``to_server``, ``to_client`` or ``both``)."""
        self._partitioned = frozenset(_DIRECTIONS[direction])

    def heal(self) -> None:
        """End the partition and every held connection; held bytes are delivered now."""
        self._partitioned = frozenset()
        self._refusing = False
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.held = {TO_SERVER: False, TO_CLIENT: False}

    def refuse(self, flag: bool = True) -> None:
        """Reset new connections at once while ``flag`` (cleared by :meth:`heal` too)."""
        self._refusing = flag

    def cut_all(self) -> int:
        """Reset every open connection; returns how many there were."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.close(rst=True)
        return len(connections)

    def arm(self, direction: str, pattern: bytes, action: str, also: tuple[bytes, ...] = ()) -> Rule:
        """Arm a one-shot :class:`Rule`; returns it (``rule.fired`` is set when it fires)."""
        rule = Rule(direction, pattern, action, also=tuple(also))
        with self._lock:
            self._rules.append(rule)
        return rule

    def disarm(self) -> None:
        with self._lock:
            self._rules.clear()

    def retarget(self, upstream: tuple[str, int]) -> None:
        """New connections go to ``upstream`` (a moved virtual address); open ones stay."""
        self.upstream = upstream

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    # ---- internals ---------------------------------------------------------------------------
    def _delay(self) -> float:
        base, jitter = self._latency
        if not base and not jitter:
            return 0.0
        return base + (random.uniform(0, jitter) if jitter else 0.0)

    def _take_rule(self, direction: str, data: bytes) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if (rule.direction == direction and rule.pattern in data
                        and all(extra in data for extra in rule.also)):
                    self._rules.remove(rule)
                    return rule
        return None

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self._refusing:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                self.refused += 1
                _reset(client)
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, client, upstream)
            with self._lock:
                self._connections.add(conn)
            self.accepted += 1
            conn.start()
