"""The SQLite connection: one aiosqlite connection whose worker thread runs whole transactions.

aiosqlite runs every call on its own thread and each awaited call is a queue hop (awaiting each
statement costs about ten times as much as running the same statements in one call). So this
store exposes :meth:`SqliteStore.call`, which runs a plain function against the underlying
``sqlite3`` connection on that thread: a whole transaction, or a whole scheduler page, costs one
hop. The connection is in autocommit mode (``isolation_level=None``)
so every transaction is an explicit ``BEGIN IMMEDIATE ... COMMIT`` that the code can see.

The file, not only the connection, is this module's concern:

* :func:`translate_sqlite_error` turns what SQLite says about the file (full, read-only, corrupt,
  not a database, busy) into the contract's error types, naming the file; :meth:`SqliteStore.call`
  applies it to everything raised on the connection's thread, so no caller sees a bare
  ``sqlite3.Error`` for a problem of the file;
* :class:`OwnerLock` is the scheduler's exclusive claim on the file (an ``flock`` of the
  database file itself, so keyed on its identity whatever name reached it, with the holder's pid
  in a sidecar ``<resolved path>.lock``), and :meth:`SqliteStore.owner_pid` tells whether some
  process holds it now;
* :meth:`SqliteStore.open` with ``create=False`` never creates a file (read commands), and with
  ``create=True`` proves at once that the file can be written; a new database is made under a
  private name and takes its own only once migrated (:meth:`SqliteStore.place`).
"""

from __future__ import annotations

import contextvars
import errno
import fcntl
import os
import sqlite3
import stat
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import quote

import aiosqlite

from qinglong.contracts.errors import (
    NotOurDatabase,
    QinglongError,
    SchemaCorrupt,
    StoreFull,
    StoreLocked,
    StoreMissing,
    StoreReadOnly,
    StoreUnavailable,
    UserError,
)

from .settings import EdgeSqliteSettings

T = TypeVar("T")

#: Prepared statements kept per connection. A scheduler repeats a few dozen (a round's page read
#: and writes, the dispatcher's, the outbox's); sqlite3's default of 128 kept every statement a
#: start or a command ever ran, about 0.5 MiB more of SQLite's memory for no faster round.
CACHED_STATEMENTS = 32

#: The bytes SQLite's unix VFS locks in the database file: the pending byte through the shared
#: range (``PENDING_BYTE`` at 1 GiB, then the reserved byte and 510 shared bytes).
_SQLITE_LOCK_BYTES = (0x40000000, 512)

#: The owner lock lives beside the database: ``qinglong.db`` is owned through ``qinglong.db.lock``.
LOCK_SUFFIX = ".lock"

#: How long :meth:`OwnerLock.acquire` retries a lock that is busy, so that a reader's momentary
#: :func:`probe_owner_lock` is not mistaken for a running scheduler.
_ACQUIRE_PATIENCE_S = 0.5

#: Below this much free space in the file's directory an I/O error is reported as a full disk:
#: SQLite reports ENOSPC on the ``-shm`` or ``-wal`` file as "disk I/O error", which misleads.
_FULL_DISK_FREE_BYTES = 1 << 20

# Primary result codes (sqlite3.h): the low byte of ``sqlite_errorcode``.
_SQLITE_ERROR, _SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED = 1, 3, 5, 6
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT = 8, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 13, 14, 26

#: sqlite3 errors that are our own misuse of the driver (a bug), never a property of the file.
_BUG_ERRORS = (sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.IntegrityError,
               sqlite3.NotSupportedError)


def named_cursor(conn: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor whose rows are :class:`sqlite3.Row`, read by column name. The row factory is set
    on this cursor only: the connection is shared by the scheduler, the publisher and the reader."""
    cur = conn.cursor()
    cur.row_factory = sqlite3.Row
    return cur


def named_rows(conn: sqlite3.Connection, sql: str, params: Any = (),
               limit: int | None = None) -> list[sqlite3.Row]:
    """The rows of ``sql`` (at most ``limit``), read by column name."""
    cur = named_cursor(conn)
    try:
        cur.execute(sql, params)
        return cur.fetchall() if limit is None else cur.fetchmany(limit)
    finally:
        cur.close()


def named_one(conn: sqlite3.Connection, sql: str, params: Any = ()) -> sqlite3.Row | None:
    """The first row of ``sql``, read by column name, or None."""
    cur = named_cursor(conn)
    try:
        return cur.execute(sql, params).fetchone()
    finally:
        cur.close()


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: ``BEGIN IMMEDIATE`` takes the write lock up front (no upgrade
    deadlock), ``COMMIT`` on success, ``ROLLBACK`` on any exception, which is re-raised. The audit
    entry of an API change under way (:data:`~qinglong.contracts.tokens.CURRENT_AUDIT`) is
    inserted before the commit, so it is durable exactly when the change is."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        # no audit scope exists unless the tokens contract was imported (an API change under way)
        tokens = sys.modules.get("qinglong.contracts.tokens")
        scope = tokens.pending_audit() if tokens is not None else None
        if scope is not None:
            from .tokens import insert_audit

            insert_audit(conn, scope.entry)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    if scope is not None:
        scope.written = True


# --------------------------------------------------------------------------- errors of the file


def _sqlite_message(exc: BaseException) -> str:
    """SQLite's own words, without any column text it quotes (which could be a payload value)."""
    message = str(exc)
    cut = message.find(" with text ")
    if cut >= 0:
        message = message[:cut]
    return message


def _free_bytes(directory: Path) -> int | None:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def _read_only_part(path: Path) -> str | None:
    """What of the database cannot be written: the file, its directory, the file system, or None."""
    directory = path.absolute().parent
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f"the file system holding {str(directory)!r} is mounted read-only"
    except OSError:
        pass
    if path.exists() and not os.access(path, os.W_OK):
        return f"the file {str(path)!r} is read-only"
    if not os.access(directory, os.W_OK | os.X_OK):
        return (f"its directory {str(directory)!r} is read-only (SQLite must create its -wal, "
                "-shm and journal files there)")
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists() and not os.access(side, os.W_OK):
            return f"the file {str(side)!r} is read-only"
    return None


def translate_sqlite_error(exc: BaseException, path: str) -> QinglongError:
    """The contract error for what SQLite (or the driver decoding its message) said about ``path``.

    * disk or database full -> :class:`StoreFull` (also an I/O error while the disk is full);
    * a read-only file, directory or file system -> :class:`StoreReadOnly`, naming which;
    * damaged pages or schema, undecodable text -> :class:`SchemaCorrupt`;
    * a file that is not SQLite -> :class:`NotOurDatabase`;
    * busy past ``busy_timeout_ms`` -> :class:`StoreLocked`;
    * a file that vanished -> :class:`StoreMissing`;
    * anything else about the file -> :class:`StoreUnavailable` with SQLite's message.

    Every message names the file. An error that is already a :class:`QinglongError` is returned
    as it is.
    """
    if isinstance(exc, QinglongError):
        return exc
    where = f"database {path!r}"
    file = Path(path)
    if isinstance(exc, UnicodeDecodeError):
        return SchemaCorrupt(
            f"{where} is damaged: SQLite returned bytes that are not UTF-8 text where it keeps "
            "text (its schema or pages were overwritten); restore it from a backup or move it "
            "aside and start with a new file"
        )
    message = _sqlite_message(exc)
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    lowered = message.lower()
    if primary == _SQLITE_FULL or "database or disk is full" in lowered:
        free = _free_bytes(file.absolute().parent)
        room = f" ({free} bytes free)" if free is not None else ""
        return StoreFull(
            f"{where}: the disk or the database is full{room}; nothing was written by the failed "
            "statement. Free space on that file system (or raise the database's size limit) and "
            "retry"
        )
    if primary in (_SQLITE_READONLY, _SQLITE_PERM) or "readonly database" in lowered:
        part = _read_only_part(file) or "SQLite opened it read-only"
        return StoreReadOnly(f"{where} cannot be written: {part}; make it writable for this user "
                             "or point [backend] path at a writable file")
    if primary == _SQLITE_NOTADB or "file is not a database" in lowered:
        return NotOurDatabase(
            f"{where} is not a SQLite database (some other file is at that path); qinglong leaves "
            "it alone: point [backend] path at a new file"
        )
    if primary == _SQLITE_CORRUPT or "malformed" in lowered:
        return SchemaCorrupt(
            f"{where} is damaged ({message}); restore it from a backup, or move it aside and "
            "start with a new file"
        )
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or "database is locked" in lowered:
        return StoreLocked(
            f"{where} is busy: another process held its write lock longer than busy_timeout_ms "
            f"({message})"
        )
    if primary == _SQLITE_IOERR or "disk i/o error" in lowered:
        free = _free_bytes(file.absolute().parent)
        if free is not None and free < _FULL_DISK_FREE_BYTES:
            return StoreFull(
                f"{where}: the disk is full ({free} bytes free on the file system of "
                f"{str(file.absolute().parent)!r}); nothing was written by the failed statement. "
                "Free space on that file system and retry"
            )
        part = _read_only_part(file)
        if part is not None:
            return StoreReadOnly(f"{where} cannot be written: {part}")
        return StoreUnavailable(f"{where}: I/O error from the operating system ({message}); "
                                "check the disk and the file system")
    if primary == _SQLITE_CANTOPEN or "unable to open database" in lowered:
        if not file.exists():
            return StoreMissing(f"{where} does not exist (it was removed or never created)")
        part = _read_only_part(file)
        if part is not None:
            return StoreReadOnly(f"{where} cannot be opened for writing: {part}")
        return StoreUnavailable(f"{where} cannot be opened ({message})")
    if primary == _SQLITE_ERROR and ("no such table" in lowered or "no such column" in lowered
                                     or "no such index" in lowered):
        return SchemaCorrupt(
            f"{where}: its schema is not the one this version made ({message}); "
            "restore it from a backup"
        )
    return StoreUnavailable(f"{where}: SQLite error: {message}")


def _translatable(exc: BaseException) -> bool:
    if isinstance(exc, UnicodeDecodeError):
        return True
    return isinstance(exc, sqlite3.Error) and not isinstance(exc, _BUG_ERRORS)


# --------------------------------------------------------------------------- the owner lock

#: The holder's pid in the lock file: a fixed-width record, written over in place and never
#: truncated, so the file is never shortened whatever it is.
_PID_RECORD = 16


def owner_lock_path(path: str) -> Path:
    """The sidecar lock file of the database at ``path``: beside the file the path resolves to,
    so every symlink to one database names one lock file."""
    return Path(os.path.realpath(path) + LOCK_SUFFIX)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _flock_busy(fd: int, how: int) -> bool:
    """Try ``flock(fd, how | LOCK_NB)``: False when taken, True when another holder has it."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return True
    return False


def _pid_from_proc_locks(fd: int) -> int | None:
    """The pid ``/proc/locks`` names for an exclusive ``flock`` on the file of ``fd`` (Linux), or
    None: how the holder is named when it was reached through another name of the file."""
    return _flock_holder(os.fstat(fd))


def _flock_holder(st: os.stat_result) -> int | None:
    """The pid ``/proc/locks`` names for an exclusive ``flock`` on the file ``st`` describes;
    found without opening the file, so no lock of this process is dropped."""
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                if "FLOCK" in fields and "WRITE" in fields and device in fields:
                    pid = fields[fields.index(device) - 1]
                    return int(pid) if pid.isdigit() else None
    except OSError:
        return None
    return None


def probe_file_owner(db_fd: int, path: str) -> int | None:
    """The pid of the ``qinglong run`` owning the database open as ``db_fd`` (named ``path``), or
    None. The database file's own ``flock`` is what counts: it is the file's identity (device and
    inode), whatever name, symlink or hard link, reached it. Releases nothing held by SQLite:
    ``db_fd`` stays open. A holder whose pid cannot be read is reported as pid 0."""
    if not _flock_busy(db_fd, fcntl.LOCK_SH):
        fcntl.flock(db_fd, fcntl.LOCK_UN)
        return None
    try:
        # O_NONBLOCK: a FIFO put in the lock file's place must not hold the probe forever
        fd = os.open(owner_lock_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        fd = None
    pid = None
    if fd is not None:
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                pid = _read_pid(fd)
        finally:
            os.close(fd)
    return pid or _pid_from_proc_locks(db_fd) or 0


def probe_owner_lock(path: str) -> int | None:
    """The pid of the process holding the owner lock of the database at ``path`` now, or None.

    Non-blocking and side-effect free: a missing database means nobody holds it (nothing is
    created); otherwise a shared ``flock`` of the file is tried and released at once. Opens and
    closes a descriptor of the database, so not for a process with the database open in SQLite
    (closing it would drop SQLite's own locks there): a store uses :meth:`SqliteStore.owner_pid`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return probe_file_owner(fd, path)
    finally:
        os.close(fd)


class OwnerLock:
    """The exclusive owner lock of one database file, held by ``qinglong run``.

    An exclusive ``flock`` of the database file itself: keyed on the file's identity (device and
    inode), so a symlink or a hard link to the file cannot start a second scheduler on it. SQLite
    locks with ``fcntl``, which ``flock`` does not touch. The kernel releases it when the process
    exits, however it exits (``kill -9`` included), so a stale lock cannot outlive its holder.

    The holder's pid goes into the sidecar ``<resolved path>.lock`` (also locked, as older
    versions did) for the refusal message and :func:`probe_owner_lock`. The sidecar is never
    followed if it is a symlink and never truncated: a link there, or a file that is not a lock
    file, is refused naming it. Only a scheduler takes the lock (and a migration, for its
    duration); publishing and read commands do not (SQLite orders their writes).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock_path = owner_lock_path(path)
        self._fd: int | None = None
        self._db_fd: int | None = None
        self._db_fd_lent = False
        #: the store-clock time of this holder's first scheduler round (the scheduler records it
        #: in the store too, for other processes' figures)
        self.first_round_ms: int | None = None

    def attach(self, db_fd: int) -> None:
        """Lock through ``db_fd``, a descriptor of the database its owner keeps open for as long
        as SQLite has the file open: closing any descriptor of the file drops every ``fcntl``
        lock SQLite holds on it in this process, so this lock never closes a lent one."""
        self._db_fd, self._db_fd_lent = db_fd, True

    @property
    def held(self) -> bool:
        """True while this process holds the lock."""
        return self._fd is not None

    def _refuse(self, held_by: int | None) -> StoreLocked:
        who = f"process {held_by}" if held_by else "another process"
        return StoreLocked(
            f"database {self.path!r} is owned by {who}, a running 'qinglong run' "
            f"(owner lock {str(self.lock_path)!r}); stop it first, or point this one "
            "at another file")

    def _link_refusal(self) -> UserError:
        return UserError(
            f"database {self.path!r}: its owner lock {str(self.lock_path)!r} is a symbolic link; a "
            "lock file is never followed (it would write over the link's target): remove the link")

    def _open_sidecar(self) -> int:
        try:
            return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                           | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._link_refusal() from None
            if exc.errno == errno.EISDIR:
                raise UserError(f"database {self.path!r}: its owner lock {str(self.lock_path)!r} "
                                "is not a regular file (a directory); it is written by "
                                "'qinglong run': remove it") from None
            part = _read_only_part(Path(self.path))
            if part is not None or exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise StoreReadOnly(
                    f"database {self.path!r}: cannot create its owner lock {str(self.lock_path)!r}: "
                    f"{part or exc.strerror}"
                ) from None
            raise StoreUnavailable(
                f"database {self.path!r}: cannot open its owner lock {str(self.lock_path)!r}: "
                f"{exc.strerror}"
            ) from None

    def _check_sidecar(self, fd: int) -> None:
        """Refuse a lock file that is not one: another file's name (a hard link), not a regular
        file, or holding more than a pid. Writing the pid would change that file."""
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif st.st_nlink != 1:
            problem = f"has {st.st_nlink} names (hard links)"
        elif st.st_size > _PID_RECORD or os.pread(fd, _PID_RECORD, 0).strip(b" \n").strip(
                b"0123456789"):
            problem = "holds something other than a pid"
        if problem:
            raise UserError(f"database {self.path!r}: its owner lock {str(self.lock_path)!r} "
                            f"{problem}; it is written by 'qinglong run': remove it")

    def check_before_create(self) -> None:
        """Refuse, as :meth:`acquire` would, a lock file that is not one, without opening or
        creating anything: called before a new database is created beside it, so a refusal leaves
        no empty database behind."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._link_refusal() from None
            return  # anything else is for acquire to report
        try:
            self._check_sidecar(fd)
        finally:
            os.close(fd)

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreLocked` naming the holder's pid."""
        if self._fd is not None:
            return
        if self._db_fd is None:
            try:
                self._db_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise StoreUnavailable(f"database {self.path!r} cannot be opened to lock it: "
                                       f"{exc.strerror}") from None
        fd = self._open_sidecar()
        try:
            self._check_sidecar(fd)
            deadline = time.monotonic() + _ACQUIRE_PATIENCE_S
            # A reader's probe holds a shared lock for microseconds: wait that out. A scheduler
            # holds it for as long as it runs.
            while _flock_busy(self._db_fd, fcntl.LOCK_EX):
                if time.monotonic() >= deadline:
                    raise self._refuse(_read_pid(fd) or _pid_from_proc_locks(self._db_fd))
                time.sleep(0.01)
            while _flock_busy(fd, fcntl.LOCK_EX):  # an older version's scheduler locks only this
                if time.monotonic() >= deadline:
                    fcntl.flock(self._db_fd, fcntl.LOCK_UN)
                    raise self._refuse(_read_pid(fd))
                time.sleep(0.01)
        except BaseException:
            os.close(fd)
            self._close_db_fd()
            raise
        try:
            os.pwrite(fd, f"{os.getpid():<{_PID_RECORD - 1}}\n".encode("ascii"), 0)
        except OSError:
            pass  # the lock is what counts; the pid only names the holder
        self._fd = fd

    def _close_db_fd(self) -> None:
        if self._db_fd is not None and not self._db_fd_lent:
            os.close(self._db_fd)
            self._db_fd = None

    def release(self) -> None:
        """Release the lock (idempotent). The pid is cleared first so no probe names a stale one."""
        fd, self._fd = self._fd, None
        self.first_round_ms = None
        if fd is None:
            return
        try:
            os.pwrite(fd, b" " * (_PID_RECORD - 1) + b"\n", 0)
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
            if self._db_fd is not None:
                fcntl.flock(self._db_fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._close_db_fd()


# --------------------------------------------------------------------------- the store


def _rename_no_replace(source: str, target: str) -> None:
    """Rename ``source`` to ``target`` unless ``target`` exists (:class:`FileExistsError`):
    ``renameat2(RENAME_NOREPLACE)``, else a hard link and an unlink where the file system lacks
    it (the file then has two names for an instant)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, rename_noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(source), at_fdcwd, os.fsencode(target), rename_noreplace) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), target)
    os.link(source, target)
    os.unlink(source)


def _discard(new: Path) -> None:
    """Remove a new database's private file and SQLite's files beside it, all of them ours."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(f"{new}{suffix}")
        except OSError:
            pass


def _sync_directory(directory: Path) -> None:
    """fsync a directory, so a file's new name survives a power loss."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in a user's words."""
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


#: The files SQLite keeps beside every database under its name plus these endings; a database
#: path with one of them would be another database's file (or become one, once that exists).
_SQLITE_SIDECARS = {"-wal": "write-ahead log", "-shm": "shared-memory index",
                    "-journal": "rollback journal"}

#: What qinglong keeps beside a database's resolved name: the owner lock, the default secrets key
#: (the host's ``<database>.key``) and the default log directory (``<database>.logs``).
_OWN_SIDECARS = {LOCK_SUFFIX: "owner lock", ".key": "secrets key", ".logs": "log directory"}

_SQLITE_HEADER = b"SQLite format 3\0"


def _is_database(path: str) -> bool:
    """True for a regular file that is an SQLite database or an empty one (a database to be)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.pread(fd, len(_SQLITE_HEADER), 0)
    except OSError:
        return False
    finally:
        os.close(fd)
    return head in (b"", _SQLITE_HEADER)


def sidecar_of(path: str) -> tuple[str, str] | None:
    """``(what, database)`` when ``path``, as written or as it resolves, names a file kept beside
    another database: SQLite's ``-wal``, ``-shm`` or ``-journal`` whether or not that database
    exists yet, or qinglong's ``.lock``, ``.key`` or ``.logs`` of a database that exists. None
    for a name of a database's own."""
    for name in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        for suffix, what in _SQLITE_SIDECARS.items():
            if name.endswith(suffix) and len(name) > len(suffix) and not name[:-len(suffix)].endswith("/"):
                return what, name[:-len(suffix)]
        for suffix, what in _OWN_SIDECARS.items():
            if name.endswith(suffix) and _is_database(name[:-len(suffix)]):
                return what, name[:-len(suffix)]
    return None


class SqliteStore:
    """Owns the connection to the database file named by the settings."""

    def __init__(self, settings: EdgeSqliteSettings) -> None:
        self.settings = settings
        self.path = settings.path
        self._connection: aiosqlite.Connection | None = None
        self.owner_lock = OwnerLock(self.path)
        # A descriptor of the database kept open as long as the connection is: the owner lock
        # and its probe work through it, since closing any descriptor of the file would drop
        # SQLite's own fcntl locks in this process.
        self._db_fd: int | None = None
        #: the private name of a new database until it is migrated and placed (see :meth:`place`)
        self._new: Path | None = None
        #: the name it then takes: the path, or the target of a symlink to a file not made yet
        self._final: Path | None = None

    def _check_path(self) -> Path:
        path = Path(self.path)
        sidecar = sidecar_of(self.path)
        if sidecar is not None:
            what, database = sidecar
            raise UserError(
                f"database path {self.path!r} names the {what} of database {database!r}, a file "
                "kept beside that database under its name: opened as a database of its own it "
                "would be read as one, and get files of its own that write over the other's. Point "
                "[backend] path at the database file itself, or at a name without that ending")
        if path.is_dir():
            raise UserError(f"database path {self.path!r} is a directory; name a file in it instead")
        try:
            mode = path.stat().st_mode
        except OSError:
            mode = None  # missing (or unreachable): SQLite creates it or says why not
        if mode is not None and not stat.S_ISREG(mode):
            # SQLite would block on a FIFO, or write its pages to a device
            raise UserError(f"database path {self.path!r} is not a regular file (a "
                            f"{_file_kind(mode)}); point [backend] path at a database file")
        parent = path.absolute().parent
        if not parent.is_dir():
            raise UserError(
                f"the directory of the database path {self.path!r} ({str(parent)!r}) does not exist; "
                "create it or change [backend] path"
            )
        return path

    async def open(self, *, create: bool = True, read_only: bool = False) -> None:
        """Connect and set the per-connection pragmas. Writes nothing to an existing file.

        ``read_only`` (commands that only read: ``runs``, ``logs``, ``status``, ``task show``, ...)
        opens the file read-only, so it reads a read-only file, a read-only directory and a full
        disk: when SQLite cannot create the ``-shm`` it needs beside a file that no process has
        open in WAL mode (no ``-shm``, no unapplied ``-wal``), the file alone is the whole
        database and is read as immutable.

        ``create=False`` (read commands) refuses a missing file with :class:`StoreMissing` and
        never creates one. ``create=True`` (the scheduler, migration, publishing) may create the
        file and proves it can be written: a read-only file, directory or file system is
        :class:`StoreReadOnly` here, at start, not at the first write. A missing file is made
        under a private name beside it, which :meth:`place` renames into place once migrated;
        :meth:`close` removes it if that never happened.

        Whatever fails, the connection and its thread are closed before the error is raised.
        """
        if self._connection is not None:
            return
        path = self._check_path()
        if not create and not path.exists():
            raise StoreMissing(
                f"database {self.path!r} does not exist; only 'qinglong run', 'qinglong db migrate' "
                "and publishing commands create one (check [backend] path)"
            )
        if not read_only:
            self._refuse_other_names(path)
        if create and not path.exists():
            self.owner_lock.check_before_create()
        if create:
            part = _read_only_part(path)
            if part is not None:
                raise StoreReadOnly(f"database {self.path!r} cannot be written: {part}; make it "
                                    "writable for this user or point [backend] path elsewhere")
        if read_only and not create:
            try:
                await self._connect(path, "ro", False)
            except (StoreReadOnly, StoreFull, StoreUnavailable) as exc:
                if not self._alone(path):
                    raise self._unreadable(path, exc) from None
                await self._connect(path, "ro&immutable=1", False)
            return
        if create and not os.path.exists(path):
            # A new database is made under a private name and appears under its own only once
            # migrated (:meth:`place`): a create refused midway (a full disk) leaves no empty
            # file that every later read would take for an unmigrated database. Through a
            # symlink to a file not made yet, the name to take is the link's target.
            final = Path(os.path.realpath(path)) if os.path.islink(path) else path.absolute()
            self._final = final
            self._new = final.parent / f".{final.name}.new-{os.getpid()}-{os.urandom(4).hex()}"
            await self._connect(self._new, "rwc", True)
            return
        await self._connect(path, "rwc" if create else "rw", create)

    @property
    def placing(self) -> bool:
        """True while the connection is to a new database not yet under its name (see
        :meth:`place`): nobody else can open it, so migrating it needs no owner lock."""
        return self._new is not None and self._connection is not None

    async def place(self) -> None:
        """Give the new, migrated database its name: its WAL is checkpointed into the file, the
        connection closed, the file renamed into place (never over a file another process made
        there meanwhile: that one is used instead, ours discarded) and opened under its name."""
        new = self._new
        if new is None or self._connection is None:
            return

        def settle(conn: sqlite3.Connection) -> None:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy:
                raise StoreUnavailable(f"database {self.path!r}: the new database could not be "
                                       "checkpointed before taking its name")

        await self.call(settle)
        await self._disconnect()
        final = self._final or Path(self.path).absolute()
        try:
            if any(os.path.getsize(f"{new}{suffix}") for suffix in ("-wal", "-journal")
                   if os.path.exists(f"{new}{suffix}")):
                raise StoreUnavailable(f"database {self.path!r}: the new database kept a journal "
                                       "after its last connection closed; nothing was made")
            _rename_no_replace(str(new), str(final))
        except FileExistsError:
            pass  # another process made the database first: it is the one to use
        except OSError as exc:
            _discard(new)
            self._new = None
            kind = StoreFull if exc.errno == errno.ENOSPC else StoreUnavailable
            raise kind(f"database {self.path!r}: the new database could not take its name "
                       f"({exc.strerror}); nothing was made") from None
        except BaseException:
            _discard(new)
            self._new = None
            raise
        _discard(new)
        self._new = None
        _sync_directory(final.parent)
        await self._connect(Path(self.path).absolute(), "rw", True)

    def _refuse_other_names(self, path: Path) -> None:
        """Refuse to write a file with more than one name (hard links): SQLite keeps the WAL
        beside the name it opens, so writers through two names each commit to a WAL the other
        never reads, and the file is damaged when both are checkpointed."""
        try:
            st = os.stat(path)
        except OSError:
            return  # missing: SQLite creates it (or says why not)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink <= 1:
            return
        holder = _flock_holder(st)
        owner = (f"; it is owned by process {holder}, a running 'qinglong run', through another "
                 "name" if holder else "")
        raise UserError(
            f"database {self.path!r} has {st.st_nlink} names (hard links){owner}. SQLite keeps its "
            "write-ahead log beside the name a process opens, so what is written through one name "
            "is lost through the other and the file is damaged: nothing is written through it. "
            f"Keep one name and remove the others (find them with: find / -xdev -samefile "
            f"{str(path)!r}); reading commands still work through any name")

    def _unreadable(self, path: Path, exc: QinglongError) -> QinglongError:
        """What keeps a read from a file whose WAL holds changes: the ``-shm`` SQLite needs to
        read them cannot be made (the read-only or full part is named), never "for writing"."""
        resolved = os.path.realpath(path)
        wal = f"{resolved}-wal"
        try:
            pending = os.path.getsize(wal) > 0
        except OSError:
            pending = False
        if not pending:
            return exc
        part = _read_only_part(path)
        why = part or str(exc)
        kind = StoreReadOnly if part is not None else type(exc)
        return kind(
            f"database {self.path!r} cannot be read: its write-ahead log {wal!r} holds changes not "
            f"yet in the file, and SQLite must create {resolved + '-shm'!r} beside it to read them, "
            f"but {why}. Make that directory writable (or copy the database with its -wal to a "
            "writable place) to read it")

    @staticmethod
    def _alone(path: Path) -> bool:
        """True when no process has the database open (none holds an SQLite lock on it: in WAL
        mode every connection keeps one for as long as it is open) and nothing waits in its WAL,
        so the file alone is the whole database. Asks with ``F_GETLK``, which takes nothing. A
        file with other names (hard links) is never alone: a WAL beside another name cannot be
        found."""
        import struct

        wal = Path(f"{os.path.realpath(path)}-wal")  # SQLite keeps it beside the resolved file
        try:
            if wal.exists() and wal.stat().st_size > 0:
                return False
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if os.fstat(fd).st_nlink > 1:
                    return False
                # struct flock: l_type, l_whence, l_start, l_len, l_pid (native layout, room to spare)
                query = struct.pack("@hhqqi", fcntl.F_WRLCK, os.SEEK_SET, _SQLITE_LOCK_BYTES[0],
                                    _SQLITE_LOCK_BYTES[1], 0).ljust(64, b"\0")
                answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
            finally:
                os.close(fd)  # no connection of this process is open: no SQLite lock is dropped
            return struct.unpack_from("@h", answer)[0] == fcntl.F_UNLCK
        except (OSError, struct.error):
            return False

    async def _connect(self, path: Path, mode: str, writable: bool) -> None:
        uri = f"file:{quote(str(path.absolute()))}?mode={mode}"
        connection = aiosqlite.connect(uri, uri=True, isolation_level=None,
                                       cached_statements=CACHED_STATEMENTS)
        if not hasattr(connection, "_execute") or not hasattr(connection, "_thread"):
            raise RuntimeError("this aiosqlite version does not expose its worker-thread executor")
        # A daemon thread: should any path ever forget to close, the process still exits.
        connection._thread.daemon = True
        try:
            await connection
        except BaseException as exc:
            if _translatable(exc):
                raise translate_sqlite_error(exc, self.path) from None
            raise
        self._connection = connection
        try:
            self._db_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self.owner_lock.attach(self._db_fd)
            await self.call(self._configure, writable)
        except BaseException:
            try:
                await self.close()
            except Exception:
                pass  # the error that made open fail is the one to report
            raise

    def _configure(self, conn: sqlite3.Connection, writable: bool) -> None:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA busy_timeout = {int(self.settings.busy_timeout_ms)}")
        # NORMAL in WAL mode loses at most the last commits on power loss, never consistency.
        conn.execute(f"PRAGMA synchronous = {self.settings.synchronous.upper()}")
        # A negative cache_size is in KiB: the page cache is most of what a round's memory grows by.
        conn.execute(f"PRAGMA cache_size = -{int(self.settings.cache_kib)}")
        # Reading the schema now surfaces "file is not a database" at open, not mid-round.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if writable:
            # Taking the write lock (and giving it back) proves the file can be written now,
            # without writing anything: a read-only file fails here, at start.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the connection's thread: one hop, however many statements.

        A ``sqlite3`` error about the file (and an undecodable SQLite message) is raised as the
        contract error :func:`translate_sqlite_error` gives; driver misuse (a bug) is re-raised as
        it is.
        """
        connection = self._connection
        if connection is None:
            raise RuntimeError("the SQLite store is not open")
        # aiosqlite's executor is private API; it is the only way to run a whole transaction on
        # the thread that owns the connection, which is what makes one hop per transaction possible.
        try:
            # the caller's context (an API change's pending audit entry) travels to the thread
            return await connection._execute(contextvars.copy_context().run, fn, connection._conn, *args)
        except BaseException as exc:
            if _translatable(exc):
                raise translate_sqlite_error(exc, self.path) from exc
            raise

    async def _disconnect(self, *, release: bool = False) -> None:
        """Close the connection and stop its thread, then (``release``) release the owner lock,
        then close the descriptor lent to it; the thread is stopped even when closing fails."""
        connection, self._connection = self._connection, None
        try:
            if connection is not None:
                try:
                    await connection.close()
                except BaseException:
                    # aiosqlite stops its thread in a finally; if close itself failed before that,
                    # stop it here so the process can exit.
                    connection.stop()
                    raise
        finally:
            try:
                if release:
                    self.owner_lock.release()
            finally:
                db_fd, self._db_fd = self._db_fd, None
                if db_fd is not None:
                    os.close(db_fd)
                self.owner_lock = OwnerLock(self.path)

    async def close(self) -> None:
        """Close the connection and stop its thread, then release the owner lock. Idempotent. A
        new database that never took its name (its migration failed or never ran) is removed:
        it was this process's own."""
        try:
            await self._disconnect(release=True)
        finally:
            new, self._new = self._new, None
            if new is not None:
                _discard(new)

    def owner_pid(self) -> int | None:
        """The pid of the ``qinglong run`` owning this database now (this process included), or
        None; 0 for a holder whose pid cannot be read. Keyed on the file, whatever its name."""
        if self.owner_lock.held:
            return os.getpid()
        if self._db_fd is None:
            return probe_owner_lock(self.path)
        return probe_file_owner(self._db_fd, self.path)
