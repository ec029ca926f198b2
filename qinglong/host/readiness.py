"""Readiness of ``qinglong run``: one line saying why it is (not) ready, and systemd's notify
protocol (``Type=notify``), which hears ``READY=1`` at the same moment ``/readyz`` turns 200 and
``STOPPING=1`` at the first moment of a stop, whether or not the HTTP surface is on."""

from __future__ import annotations

import os
import socket

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"


def sd_notify(state: str) -> bool:
    """Send ``state`` to ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace).
    False when there is no socket or the send failed: systemd readiness is best effort."""
    address = os.environ.get(NOTIFY_SOCKET_ENV)
    if not address or address[0] not in "/@":
        return False
    target = "\0" + address[1:] if address[0] == "@" else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), target)
        return True
    except OSError:
        return False


class Readiness:
    """Where the lifecycle is, as one line. ``ready`` only between the admission phase opening and
    the first moment of a stop."""

    def __init__(self) -> None:
        self.reason = "starting: opening the database"
        self.ready = False
        self.stopping = False

    def starting(self, reason: str) -> None:
        """A start step is under way (``reason`` says which one is awaited)."""
        if not self.stopping:
            self.reason = f"starting: {reason}"

    def mark_ready(self) -> None:
        """Every start step ran: ready from now on, and systemd is told."""
        if self.stopping:
            return
        self.ready = True
        self.reason = "ready"
        sd_notify("READY=1")

    def mark_stopping(self) -> None:
        """The stop began: not ready from this moment on (once; systemd is told)."""
        if self.stopping:
            return
        self.stopping = True
        self.ready = False
        self.reason = "stopping: the process is shutting down"
        sd_notify("STOPPING=1")
