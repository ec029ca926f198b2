"""Connections: the runtime and admin pools, session settings, and error wrapping.

**Name resolution.** Every session this plugin opens (both pools, the migration connection) starts
with ``search_path = pg_catalog, pg_temp``, sent in the startup packet's ``options``
(:func:`session_options`), so it holds from the very first statement, including the pool's own
checks, and wins over any ``ALTER ROLE/DATABASE ... SET search_path`` (client settings rank above
role and database defaults). Our tables live in the ``qinglong`` schema, which is deliberately
*not* on the path: every SQL text of the plugin names them ``qinglong.<table>`` (see ``sql.py``),
so nothing the plugin writes resolves through a schema someone else can create objects in.
Functions and operators are resolved in ``pg_catalog`` only: ``pg_temp`` is never searched for
functions or operators, and listing it last keeps temporary tables behind the catalog. This is
the design PostgreSQL documents for SECURITY DEFINER functions, applied to whole sessions: an
operator planted in ``public`` (``*(numeric, integer)`` is an exact match where pg_catalog needs a
cast, so it would win resolution on a default path) is never even a candidate. Readiness
(``roles.py``) refuses to start when the pin does not hold or when a schema on the path, any other
schema, or the database grants creation to a role that is not its owner.

**Secrets.** psycopg's errors can quote the conninfo (a malformed DSN is echoed back, and libpq's
parse errors quote the token they stopped at, which may be part of a password), so:

* :func:`check_dsn` refuses a DSN libpq cannot parse, or one that parses into a host, port, user
  or database name containing ``@`` or whitespace (an unencoded ``@`` in a URI password), before
  libpq ever sees it to connect, with a message that quotes nothing of the value;
* every database error that leaves this plugin goes through :func:`describe_error`: it masks every
  DSN and password this backend knows and then applies the contracts' :func:`redact`;
* psycopg_pool's own log lines (logger ``psycopg.pool``) would bypass the diagnostic sink and reach
  stderr through Python's last-resort handler: the ``psycopg`` loggers are silenced here, and the
  pool keeps its last connection error so the error raised to the caller (masked) says why
  (:class:`Pool`).

A server that cannot be reached or refuses the login raises :class:`BackendUnavailable`, a
:class:`~qinglong.contracts.errors.StoreUnavailable` (exit 5) naming host, port, database and user,
never the password.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from contextlib import contextmanager
from typing import Iterable, Iterator

import psycopg
from psycopg import IsolationLevel
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from qinglong.contracts.diagnostics import redact
from qinglong.contracts.errors import (
    QinglongError, SettingsError, StoreAuthFailed, StoreUnavailable, StoreUnreachable)

#: The ``search_path`` of every session (see the module docstring).
PINNED_SEARCH_PATH = ("pg_catalog", "pg_temp")

# psycopg and psycopg_pool log through the ``psycopg`` logger tree; without a handler Python's
# last-resort handler prints their warnings (connection errors, with libpq's text) on stderr,
# bypassing the diagnostic sink. Errors reach the operator through the exceptions below instead.
_PSYCOPG_LOGGER = logging.getLogger("psycopg")
_PSYCOPG_LOGGER.addHandler(logging.NullHandler())
_PSYCOPG_LOGGER.propagate = False


class BackendUnavailable(StoreUnavailable):
    """The database could not be reached, refused the connection or the login (message is
    redacted: it names host, port, database and user, never the password)."""


class BackendUnreachable(BackendUnavailable, StoreUnreachable):
    """The server could not be reached, or dropped the connection (down, restarting, shutting
    down): an outage, waited out at start (redacted like :class:`BackendUnavailable`)."""


class BackendAuthFailed(BackendUnavailable, StoreAuthFailed):
    """The server refused the login (a wrong password, an unknown role, no access rule): never
    waited out (redacted like :class:`BackendUnavailable`)."""


#: SQLSTATEs of a refused login (invalid_password, invalid_authorization_specification), and the
#: words libpq reports when the SQLSTATE does not reach the client.
_AUTH_SQLSTATES = frozenset({"28P01", "28000"})
_AUTH_WORDS = ("password authentication failed", "no pg_hba.conf entry", "authentication failed",
               "no password supplied")


def auth_refused(exc: BaseException) -> bool:
    """Whether a failed connection is a refused login (not an unreachable or busy server)."""
    if getattr(exc, "sqlstate", None) in _AUTH_SQLSTATES:
        return True
    text = str(exc).lower()
    return any(words in text for words in _AUTH_WORDS) or re.search(r'role "[^"]*" does not exist', text) is not None


def unavailable(message: str, cause: BaseException | None) -> BackendUnavailable:
    """The error for a connection that failed with ``cause`` (``message`` already redacted): a
    refused login is :class:`BackendAuthFailed`, anything else :class:`BackendUnreachable`."""
    if cause is not None and auth_refused(cause):
        return BackendAuthFailed(message)
    return BackendUnreachable(message)


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


#: conninfo keys whose values are not secret and name where a connection goes.
_TARGET_KEYS = ("host", "hostaddr", "port", "dbname", "user")


def check_dsn(key: str, dsn: str) -> dict[str, str]:
    """The parsed DSN of settings key ``key``, or a :class:`SettingsError` that quotes nothing of
    the value (libpq's own parse error quotes the token it stopped at, which can be part of a
    password). Also refuses a DSN that parses into a host, port, user or database containing
    ``@`` or whitespace: an unencoded ``@`` in a URI password makes libpq take the rest of the
    password as the host name, which a connection error would then print."""
    hint = ("quote a value containing spaces or quotes in single quotes (password='a b'), or, in a "
            "postgresql:// URI, percent-encode it (%20 for a space, %40 for '@', %3A for ':')")
    try:
        parsed = conninfo_to_dict(dsn)
    except Exception:
        raise SettingsError(f"[backend] {key} is not a valid libpq connection string or URI; {hint}") from None
    for name in _TARGET_KEYS:
        value = parsed.get(name)
        if value is not None and any(ch == "@" or ch.isspace() for ch in str(value)):
            raise SettingsError(
                f"[backend] {key}: its {name} contains '@' or whitespace, which usually means a "
                f"password was not encoded; {hint}") from None
    return {k: str(v) for k, v in parsed.items() if v is not None}


def describe_target(dsn: str) -> str:
    """``host=... port=... dbname=... user=...`` of a DSN (libpq defaults where unset), never the
    password; empty when the DSN cannot be parsed."""
    try:
        parsed = conninfo_to_dict(dsn)
    except Exception:
        return ""
    host = parsed.get("host") or parsed.get("hostaddr") or os.environ.get("PGHOST") or "(local socket)"
    port = parsed.get("port") or os.environ.get("PGPORT") or "5432"
    user = parsed.get("user") or os.environ.get("PGUSER") or "(login user)"
    dbname = parsed.get("dbname") or os.environ.get("PGDATABASE") or user
    return f"host={host} port={port} dbname={dbname} user={user}"


def describe_error(exc: BaseException, secrets: Secrets | None = None) -> str:
    """A one-line, secret-free description of ``exc`` (type, SQLSTATE, first message line)."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    sqlstate = getattr(exc, "sqlstate", None)
    text = f"{type(exc).__name__}" + (f" [{sqlstate}]" if sqlstate else "") + (f": {message}" if message else "")
    return secrets.mask(text) if secrets else redact(text)


def session_options(statement_timeout_ms: int) -> str:
    """libpq ``options`` for every session: the pinned ``search_path`` (module docstring), a
    statement timeout, and READ COMMITTED as the
    default so a single autocommit statement (the claim) never inherits a stricter level a DBA
    set on the role; admission asks for SERIALIZABLE explicitly (SET TRANSACTION in its message).
    ``synchronous_commit = on`` and ``default_transaction_read_only = off`` whatever the role,
    the database or the server says: a committed admission or completion is durable, and a
    write is never refused by a default. (``session_replication_role`` only a superuser may set:
    readiness checks it instead.)"""
    return (
        f"-c search_path={','.join(PINNED_SEARCH_PATH)} "
        f"-c statement_timeout={int(statement_timeout_ms)} "
        "-c default_transaction_isolation=read\\ committed "
        "-c synchronous_commit=on -c default_transaction_read_only=off"
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
    # The path is already pinned by the startup options; set it again in case something between
    # us and the server (a connection pooler) dropped them. Readiness verifies it either way.
    await conn.execute("SET search_path = " + ", ".join(PINNED_SEARCH_PATH))


class Pool(AsyncConnectionPool):
    """An :class:`AsyncConnectionPool` that remembers why its last connection attempt failed.

    The pool retries connecting in the background and, when a caller's wait ends, raises a bare
    :class:`PoolTimeout` ("couldn't get a connection after 3.00 sec"): the reason (a refused
    connection, a wrong password, a missing database) was only in its log lines, which are
    silenced here. This pool adds it, masked, to the timeout's message, with where it connects.
    """

    def __init__(self, conninfo: str, **kwargs) -> None:
        super().__init__(conninfo, **kwargs)
        self.last_error: BaseException | None = None
        self._secrets = Secrets([conninfo])
        self._target = describe_target(conninfo)
        #: set when a connection attempt's login was refused: a wait for the pool ends at once
        self._refused: asyncio.Event | None = None

    async def _connect(self, timeout: float | None = None):
        try:
            conn = await super()._connect(timeout)
        except psycopg.Error as exc:
            self.last_error = exc
            if auth_refused(exc) and self._refused is not None:
                self._refused.set()
            raise
        self.last_error = None
        return conn

    async def open_or_refused(self, timeout: float) -> None:
        """Open the pool and wait for its first connections, up to ``timeout`` seconds; a refused
        login ends the wait at once (the :class:`PoolTimeout` then names it): waiting would
        not change it, and a wrong password must not hold a start for the whole bound."""
        self._refused = asyncio.Event()
        await self.open(wait=False)
        waiting = asyncio.ensure_future(self.wait(timeout))
        refused = asyncio.ensure_future(self._refused.wait())
        try:
            await asyncio.wait((waiting, refused), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, refused):
                task.cancel()
            await asyncio.gather(waiting, refused, return_exceptions=True)
        if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
            return
        if self._refused.is_set():
            raise self._explained(PoolTimeout("the login was refused"))
        waiting.result()  # the wait's own PoolTimeout, explained

    def _explained(self, exc: PoolTimeout) -> PoolTimeout:
        if self.last_error is None:
            return exc
        return PoolTimeout(f"{exc}; last connection attempt ({self._target}): "
                           f"{describe_error(self.last_error, self._secrets)}")

    async def wait(self, timeout: float = 30.0) -> None:
        try:
            await super().wait(timeout)
        except PoolTimeout as exc:
            raise self._explained(exc) from None

    async def getconn(self, timeout: float | None = None):
        try:
            return await super().getconn(timeout)
        except PoolTimeout as exc:
            raise self._explained(exc) from None


def make_pool(dsn: str, *, name: str, min_size: int, max_size: int, timeout_ms: int,
              statement_timeout_ms: int, application_name: str) -> Pool:
    """An unopened pool of autocommit connections that checks each connection before handing it
    out (within ``timeout_ms``), so backends terminated while idle, lost to a server restart or
    hung behind a silent peer are replaced. TCP keepalives and ``tcp_user_timeout`` default to
    :data:`TCP_DEFAULTS` where the DSN does not set them. The DSN is checked first
    (:func:`check_dsn`): libpq never sees one it cannot parse."""
    check_dsn(f"{name}_dsn", dsn)
    return Pool(
        dsn,
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
                  secrets: Secrets, key: str = "owner_dsn") -> psycopg.AsyncConnection:
    """One autocommit connection (migrations, one-off commands), errors redacted and naming
    where it connects (:func:`describe_target`)."""
    check_dsn(key, dsn)
    try:
        conn = await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            options=session_options(statement_timeout_ms),
            application_name=application_name[:63],
            **tcp_defaults(dsn),
        )
    except psycopg.Error as exc:
        raise unavailable(
            f"cannot connect to PostgreSQL ({describe_target(dsn)}): {describe_error(exc, secrets)}", exc
        ) from None
    await _configure(conn)
    return conn
