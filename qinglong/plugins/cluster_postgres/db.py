"""Connections: the runtime and admin pools, session settings, and error wrapping.

psycopg's errors can quote the conninfo (a malformed DSN is echoed back), so every database error
that leaves this plugin goes through :func:`describe_error`: it masks every DSN and password this
backend knows and then applies the contracts' :func:`redact`.
"""

from __future__ import annotations

from typing import Iterable

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


async def _configure(conn: psycopg.AsyncConnection) -> None:
    # Transactions opened with conn.transaction() are SERIALIZABLE (publishing); autocommit
    # statements are READ COMMITTED (the claim, the reader). Admission names its level in its
    # own single message (see admission.py).
    await conn.set_isolation_level(IsolationLevel.SERIALIZABLE)


def make_pool(dsn: str, *, name: str, min_size: int, max_size: int, timeout_ms: int,
              statement_timeout_ms: int, application_name: str) -> AsyncConnectionPool:
    """An unopened pool of autocommit connections that checks each connection before handing it
    out, so backends terminated while idle, or lost to a server restart, are replaced."""
    return AsyncConnectionPool(
        conninfo=dsn,
        kwargs={
            "autocommit": True,
            "options": session_options(statement_timeout_ms),
            "application_name": application_name[:63],
        },
        min_size=min_size,
        max_size=max_size,
        timeout=timeout_ms / 1000,
        name=name,
        open=False,
        configure=_configure,
        check=AsyncConnectionPool.check_connection,
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
        )
    except psycopg.Error as exc:
        raise BackendUnavailable(f"cannot connect to PostgreSQL: {describe_error(exc, secrets)}") from None
    await _configure(conn)
    return conn
