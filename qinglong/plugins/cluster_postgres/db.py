"""Connections: the runtime and admin pools, session settings, and error wrapping.

psycopg's errors can quote the conninfo (a malformed DSN is echoed back), so every database error
that leaves this plugin goes through :func:`describe_error`: it masks every DSN and password this
backend knows and then applies the contracts' :func:`redact`.
"""

from __future__ import annotations

import asyncio
import os
import socket
from contextlib import contextmanager
from typing import Iterable, Iterator

import psycopg
from psycopg import IsolationLevel
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from qinglong.contracts.diagnostics import redact
from qinglong.contracts.errors import QinglongError


class BackendUnavailable(QinglongError):
    """The database could not be reached or refused the connection (message is redacted)."""


class AdmissionRefused(QinglongError):
    """Admission found the occurrence's inputs invalid (a digest that does not verify, an
    inconsistent decision): nothing was written, and retrying would not help."""


class Secrets:
    """The secret strings of the configured DSNs, to mask in any text that leaves the plugin."""

    def __init__(self, dsns: Iterable[str | None]) -> None:
        values: set[str] = set()
        for dsn in dsns:
            if not dsn:
                continue
            values.add(dsn)
            try:
                password = conninfo_to_dict(dsn).get("password")
            except Exception:  # a malformed DSN: the whole string is masked above
                password = None
            if password:
                values.add(str(password))
        # longest first, so a DSN is masked before the password inside it
        self._values = sorted(values, key=len, reverse=True)

    def mask(self, text: str) -> str:
        """``text`` with every known DSN and password replaced by ``***``, then redacted."""
        for value in self._values:
            if value:
                text = text.replace(value, "***")
        return redact(text)


def describe_error(exc: BaseException, secrets: Secrets | None = None) -> str:
    """A one-line, secret-free description of ``exc`` (type, SQLSTATE, first message line)."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    sqlstate = getattr(exc, "sqlstate", None)
    text = f"{type(exc).__name__}" + (f" [{sqlstate}]" if sqlstate else "") + (f": {message}" if message else "")
    return secrets.mask(text) if secrets else redact(text)


def session_options(statement_timeout_ms: int) -> str:
    """libpq ``options`` for every session: a statement timeout, and READ COMMITTED as the
    default so a single autocommit statement (the claim) never inherits a stricter level a DBA
    set on the role; admission asks for SERIALIZABLE explicitly (SET TRANSACTION in its message)."""
    return (
        f"-c statement_timeout={int(statement_timeout_ms)} "
        "-c default_transaction_isolation=read\\ committed"
    )


#: libpq settings that make a dead peer noticed by the kernel instead of never: keepalive probes
#: after 10 s idle, every 5 s, 3 lost probes; data unacknowledged for 15 s closes the connection.
#: Applied only where the DSN does not set them (the operator's DSN wins).
TCP_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}


def tcp_defaults(dsn: str) -> dict[str, str]:
    """The :data:`TCP_DEFAULTS` the DSN leaves unset (nothing if the DSN cannot be parsed here:
    the connection attempt reports that, redacted)."""
    try:
        given = conninfo_to_dict(dsn)
    except Exception:
        return {}
    return {key: value for key, value in TCP_DEFAULTS.items() if key not in given}


class Severance:
    """Whether :func:`sever_after` cut its connection (the block then ran past its bound)."""

    severed: bool = False


def sever(conn: psycopg.AsyncConnection) -> None:
    """Shut the connection's socket down under whatever is waiting on it.

    A wait on a connection whose peer went silent (a hung proxy, a kernel answering keepalives
    for a dead process) never ends by itself, and cancelling the waiting task makes psycopg try a
    cancel request and wait again. Shutting the socket down makes the pending read or write fail
    at once (the connection becomes BAD), so the waiting code gets an OperationalError and the
    pool discards the connection when it comes back.
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # already closed
    try:
        # a duplicate descriptor of the same socket: shutdown acts on the socket, and closing
        # the duplicate leaves libpq's descriptor for libpq to close
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


@contextmanager
def sever_after(conn: psycopg.AsyncConnection, seconds: float) -> Iterator[Severance]:
    """Run the block with ``conn`` severed (see :func:`sever`) if it is still running after
    ``seconds``; the yielded :class:`Severance` says whether that happened."""
    state = Severance()

    def fire() -> None:
        state.severed = True
        sever(conn)

    handle = asyncio.get_running_loop().call_later(max(0.0, seconds), fire)
    try:
        yield state
    finally:
        handle.cancel()


def bounded_check(timeout_s: float):
    """A pool ``check`` callback: the pool's own check, severing a connection that does not
    answer within ``timeout_s`` (a hung connection must fail its check, not hang the borrower)."""

    async def check(conn: psycopg.AsyncConnection) -> None:
        with sever_after(conn, timeout_s):
            await AsyncConnectionPool.check_connection(conn)

    return check


async def _configure(conn: psycopg.AsyncConnection) -> None:
    # Transactions opened with conn.transaction() are SERIALIZABLE (publishing); autocommit
    # statements are READ COMMITTED (the claim, the reader). Admission names its level in its
    # own single message (see admission.py).
    await conn.set_isolation_level(IsolationLevel.SERIALIZABLE)


def make_pool(dsn: str, *, name: str, min_size: int, max_size: int, timeout_ms: int,
              statement_timeout_ms: int, application_name: str) -> AsyncConnectionPool:
    """An unopened pool of autocommit connections that checks each connection before handing it
    out (within ``timeout_ms``), so backends terminated while idle, lost to a server restart or
    hung behind a silent peer are replaced. TCP keepalives and ``tcp_user_timeout`` default to
    :data:`TCP_DEFAULTS` where the DSN does not set them."""
    return AsyncConnectionPool(
        conninfo=dsn,
        kwargs={
            "autocommit": True,
            "options": session_options(statement_timeout_ms),
            "application_name": application_name[:63],
            **tcp_defaults(dsn),
        },
        min_size=min_size,
        max_size=max_size,
        timeout=timeout_ms / 1000,
        name=name,
        open=False,
        configure=_configure,
        check=bounded_check(timeout_ms / 1000),
        # keep trying to reconnect for a long outage; rounds fail fast meanwhile (timeout above)
        reconnect_timeout=24 * 3600,
    )


async def connect(dsn: str, *, statement_timeout_ms: int, application_name: str,
                  secrets: Secrets) -> psycopg.AsyncConnection:
    """One autocommit connection (migrations, one-off commands), errors redacted."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            options=session_options(statement_timeout_ms),
            application_name=application_name[:63],
            **tcp_defaults(dsn),
        )
    except psycopg.Error as exc:
        raise BackendUnavailable(f"cannot connect to PostgreSQL: {describe_error(exc, secrets)}") from None
    await _configure(conn)
    return conn
