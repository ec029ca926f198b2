"""The SQLite connection: one aiosqlite connection whose worker thread runs whole transactions.

aiosqlite runs every call on its own thread and each awaited call is a queue hop (FACTS: one await
per statement costs ~10x). So this store exposes :meth:`SqliteStore.call`, which runs a plain
function against the underlying ``sqlite3`` connection on that thread: a whole transaction, or a
whole scheduler page, costs one hop. The connection is in autocommit mode (``isolation_level=None``)
so every transaction is an explicit ``BEGIN IMMEDIATE ... COMMIT`` that the code can see.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import aiosqlite

from qinglong.contracts.errors import UserError

from .settings import EdgeSqliteSettings

T = TypeVar("T")


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: ``BEGIN IMMEDIATE`` takes the write lock up front (no upgrade
    deadlock), ``COMMIT`` on success, ``ROLLBACK`` on any exception, which is re-raised."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class SqliteStore:
    """Owns the connection to the database file named by the settings."""

    def __init__(self, settings: EdgeSqliteSettings) -> None:
        self.settings = settings
        self.path = settings.path
        self._connection: aiosqlite.Connection | None = None

    @property
    def is_open(self) -> bool:
        """True between a successful :meth:`open` and :meth:`close`."""
        return self._connection is not None

    def _check_path(self) -> Path:
        path = Path(self.path)
        if path.is_dir():
            raise UserError(f"database path {self.path!r} is a directory; name a file in it instead")
        parent = path.absolute().parent
        if not parent.is_dir():
            raise UserError(
                f"the directory of the database path {self.path!r} ({str(parent)!r}) does not exist; "
                "create it or change [backend] path"
            )
        return path

    async def open(self) -> None:
        """Connect and set the per-connection pragmas. Writes nothing to an existing file."""
        if self._connection is not None:
            return
        path = self._check_path()
        try:
            connection = await aiosqlite.connect(str(path), isolation_level=None)
        except sqlite3.Error as exc:
            raise UserError(f"cannot open the database {self.path!r}: {exc}") from None
        if not hasattr(connection, "_execute") or not hasattr(connection, "_conn"):
            await connection.close()
            raise RuntimeError("this aiosqlite version does not expose its worker-thread executor")
        self._connection = connection
        try:
            await self.call(self._configure)
        except sqlite3.Error as exc:
            await self.close()
            raise UserError(f"cannot use the database {self.path!r}: {exc}") from None

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA busy_timeout = {int(self.settings.busy_timeout_ms)}")
        # NORMAL in WAL mode loses at most the last commits on power loss, never consistency.
        conn.execute(f"PRAGMA synchronous = {self.settings.synchronous.upper()}")
        # A negative cache_size is in KiB: the page cache is most of what a round's memory grows by.
        conn.execute(f"PRAGMA cache_size = -{int(self.settings.cache_kib)}")
        # Reading the schema now surfaces "file is not a database" at open, not mid-round.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the connection's thread: one hop, however many statements."""
        connection = self._connection
        if connection is None:
            raise RuntimeError("the SQLite store is not open")
        # aiosqlite's executor is private API; it is the only way to run a whole transaction on
        # the thread that owns the connection, which is what makes one hop per transaction possible.
        return await connection._execute(fn, connection._conn, *args)

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
