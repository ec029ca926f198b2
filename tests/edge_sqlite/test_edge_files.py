"""The database file as a user meets it: damaged, someone else's, read-only, full, or already owned.

Each case runs the real ``qinglong`` command in a subprocess on a real file and checks what the
user sees: the exit code, one paragraph on stderr naming the file, never a traceback, and never a
hang (every subprocess has a timeout, so a hang fails the test instead of the suite).
"""

from __future__ import annotations

import base64
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_helpers import cron, make_context, open_backend, query, seed
from qinglong.contracts.errors import (
    NotOurDatabase,
    SchemaCorrupt,
    StoreFull,
    StoreMissing,
)
from qinglong.plugins.edge_sqlite import create_backend, migrations
from qinglong.plugins.edge_sqlite.store import OwnerLock, owner_lock_path, probe_owner_lock
from tests.support.aio import closing
from tests.support.cliserver import run_qinglong

#: Generous bound of one CLI command; a hang shows up as a failure after this, never as a stall.
CLI_TIMEOUT_S = 120  # only catches a hang: a loaded machine may take long to start Python

#: Commands that only read, and ones that start the scheduler; each must refuse a bad file.
READ_COMMANDS = (["runs"], ["schedules"], ["skips"], ["db", "status"], ["trigger", "list"])
RUN = ["run", "--for-seconds", "20"]

def _env(db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env.update({"QINGLONG_BACKEND__PATH": str(db), "PYTHONUNBUFFERED": "1"})
    return env


def cli(db: Path, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m qinglong ARGS`` on the database ``db``."""
    return run_qinglong(list(args), cwd=db.parent, env=_env(db), timeout=timeout)


def assert_refused(proc: subprocess.CompletedProcess[str], code: int, db: Path, *words: str) -> None:
    """Exit ``code``, a traceback-free stderr naming the file and every one of ``words``."""
    context = f"exit {proc.returncode}, stderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, context
    assert proc.returncode == code, context
    assert str(db) in proc.stderr, context
    for word in words:
        assert word in proc.stderr, context


async def _populated(db: Path, clock, runs: int = 0) -> None:
    """A ready database with one project, task and trigger and ``runs`` finished Runs."""
    backend = await open_backend(db, clock)
    async with closing(backend):
        await seed(backend)
        await backend.publisher().put_trigger(cron("tr1"))
    if runs:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, "
            "task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state, idempotency_key) "
            "VALUES (?, 'p1', 'tr1', 1, 't1', 1, 'sha256:0', ?, ?, ?, 'succeeded', ?)",
            [(f"run-{i:08d}", i, i, i, f"key-{i:08d}") for i in range(runs)])
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()


# --------------------------------------------------------------------------- damaged files


async def test_random_bytes_after_the_header_page_are_refused_by_every_command(db_path, clock):
    """Random bytes over everything after page 1 must be a clear exit-4 "damaged" naming the file
    for every command; otherwise the user gets a traceback or a hung process."""
    await _populated(db_path, clock, runs=2000)
    data = bytearray(db_path.read_bytes())
    rng = random.Random(8)
    data[4096:] = bytes(rng.randrange(256) for _ in range(len(data) - 4096))
    db_path.write_bytes(bytes(data))
    for command in (*READ_COMMANDS, RUN):
        assert_refused(cli(db_path, *command), 4, db_path, "damaged")


@pytest.mark.parametrize("command", [*READ_COMMANDS, RUN], ids=lambda c: "-".join(c[:2]))
async def test_undecodable_schema_text_is_refused_and_the_process_exits(db_path, clock, command):
    """Non-UTF-8 bytes in the stored schema made SQLite's error message undecodable; the error
    escaped the store, its connection thread was never stopped and the process hung forever."""
    await _populated(db_path, clock)
    data = bytearray(db_path.read_bytes())
    at = data.find(b"CREATE TABLE runs")
    assert at > 0
    data[at + 7:at + 10] = b"\xff\xfe\xfd"
    db_path.write_bytes(bytes(data))
    assert_refused(cli(db_path, *command), 4, db_path, "damaged")


async def test_damaged_data_pages_are_found_at_start_and_by_db_status(db_path, clock):
    """Damaged b-tree pages deep in the Runs table must stop ``run`` at start and make
    ``db status`` fail; otherwise the scheduler starts on a file that throws at some later round
    and the status command says all is well."""
    await _populated(db_path, clock, runs=20_000)
    data = bytearray(db_path.read_bytes())
    pages = len(data) // 4096
    rng = random.Random(7)
    for page in range(pages - 150, pages - 140):
        offset = page * 4096
        data[offset + 8:offset + 4096] = bytes(rng.randrange(256) for _ in range(4088))
    db_path.write_bytes(bytes(data))
    assert_refused(cli(db_path, *RUN), 4, db_path, "quick_check")
    assert_refused(cli(db_path, "db", "status"), 4, db_path, "quick_check")


@pytest.mark.parametrize("drift, named", [
    ("DROP TABLE schedule_skips", "table 'schedule_skips' is missing"),
    ("DROP INDEX trigger_schedules_due", "index 'trigger_schedules_due' is missing"),
    ("ALTER TABLE runs ADD COLUMN note TEXT", "table 'runs'"),
    ("CREATE TRIGGER runs_audit AFTER INSERT ON runs BEGIN SELECT 1; END", "trigger 'runs_audit'"),
    ("CREATE TABLE scratch (x)", "table 'scratch'"),
], ids=["dropped-table", "dropped-index", "added-column", "added-trigger", "extra-table"])
async def test_schema_drift_is_refused_although_the_ledger_is_complete(db_path, clock, drift, named):
    """A ledger that lists every migration proves nothing about the tables: a dropped table passed
    readiness and then every round failed while ``run`` exited 0."""
    await _populated(db_path, clock)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute(drift)
    conn.close()
    backend = create_backend(make_context(db_path, clock))
    await backend.open()
    async with closing(backend):
        with pytest.raises(SchemaCorrupt, match=named) as refused:
            await backend.check_readiness()
        assert str(db_path) in str(refused.value)
    assert_refused(cli(db_path, *RUN), 4, db_path, named)


def test_expected_schema_is_what_the_shipped_migrations_make_on_a_file(tmp_path):
    """The reference schema is derived from the migration files, so a new migration moves it; if
    it drifted from what a real file gets, every database would be refused after an upgrade."""
    known = migrations.load_migrations()
    path = tmp_path / "fresh.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrations.apply_pending(conn, known, str(path), 1)
        assert migrations.schema_of(conn) == migrations.expected_schema(known)
        migrations.check_schema(conn, known, str(path))
    finally:
        conn.close()


# --------------------------------------------------------------------------- not our database


@pytest.mark.parametrize("command", [["run", "--for-seconds", "5"], ["db", "migrate"],
                                     ["project", "create", "p9"], ["runs"], ["db", "status"]],
                         ids=lambda c: "-".join(c[:2]))
def test_another_applications_database_is_refused_and_left_byte_for_byte(db_path, command):
    """An unrelated application's database used to get our tables and WAL mode; it must be refused,
    naming one of its tables, and stay exactly as it was."""
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT)")
    conn.execute("INSERT INTO accounts (owner) VALUES ('someone')")
    conn.commit()
    conn.close()
    before = db_path.read_bytes()
    assert_refused(cli(db_path, *command), 4, db_path, "another application", "'accounts'")
    assert db_path.read_bytes() == before
    assert query(db_path, "PRAGMA journal_mode") == [("delete",)]
    assert not db_path.with_name(db_path.name + "-wal").exists()


async def test_a_foreign_schema_migrations_table_is_not_taken_for_ours(db_path, clock):
    """Many frameworks keep a ``schema_migrations`` table; reading its rows as ours would either
    crash or start on a foreign database."""
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE schema_migrations (version TEXT PRIMARY KEY)")
    conn.execute("INSERT INTO schema_migrations VALUES ('20240101000000')")
    conn.commit()
    conn.close()
    before = db_path.read_bytes()
    backend = create_backend(make_context(db_path, clock))
    await backend.open()
    async with closing(backend):
        for step in (backend.migrate, backend.check_readiness, backend.migration_status):
            with pytest.raises(NotOurDatabase, match="schema_migrations"):
                await step()
    assert db_path.read_bytes() == before


async def test_a_backend_opened_to_read_never_creates_or_migrates(tmp_path, clock):
    """A read command on a mistyped path used to create and migrate a new database there, so the
    user saw an empty listing instead of their typo."""
    missing = tmp_path / "typo.db"
    backend = create_backend(make_context(missing, clock))
    with pytest.raises(StoreMissing, match="typo.db"):
        await backend.open(create=False)
    await backend.close()
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    backend = create_backend(make_context(empty, clock))
    await backend.open(create=False)
    async with closing(backend):
        states = await backend.migrate()
        assert {s.status for s in states} == {"pending"}
    assert empty.read_bytes() == b""
    assert query(empty, "SELECT count(*) FROM sqlite_master") == [(0,)]


@pytest.mark.parametrize("command", [*READ_COMMANDS, ["project", "list"]], ids=lambda c: "-".join(c))
def test_read_commands_on_a_missing_file_are_refused_and_create_nothing(tmp_path, command):
    """A mistyped [backend] path used to get a new, migrated database from a mere listing: the
    user saw an empty list instead of their typo, and a stray file was left behind."""
    missing = tmp_path / "typo.db"
    assert_refused(cli(missing, *command), 3, missing, "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


NOT_CREATING_COMMANDS = (
    ["task", "run", "ops", "backup"], ["task", "show", "ops", "backup"], ["task", "delete", "ops", "backup"],
    ["task", "list"], ["logs", "r1"], ["runs", "show", "r1"], ["runs", "cancel", "r1"], ["status", "--once"],
    ["trigger", "delete", "ops", "t"], ["trigger", "update", "ops", "t", "--disabled"],
    ["trigger", "enable", "ops", "t"], ["project", "delete", "ops"], ["export"], ["secrets", "rotate"])


@pytest.mark.parametrize("command", NOT_CREATING_COMMANDS, ids=lambda c: "-".join(c))
def test_only_run_migrate_and_publishing_create_a_missing_database(tmp_path, command):
    """``task run`` on a mistyped path created and migrated a new database before failing, and
    ``trigger delete`` did too: a stray database (and its lock file) was left behind, which a later
    ``run`` would have taken for the real one."""
    missing = tmp_path / "typo.db"
    assert_refused(cli(missing, *command), 3, missing, "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_read_commands_never_migrate_an_empty_file(tmp_path):
    """Reading must not write: an empty file stays empty (no tables, no WAL) and the user is told
    what is missing."""
    empty = tmp_path / "empty.db"
    empty.touch()
    assert_refused(cli(empty, "runs"), 4, empty, "not applied")
    assert empty.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


# --------------------------------------------------------------------------- read-only and full


@pytest.fixture
def restore_modes(db_path):
    """Give the test's directory and file their modes back, so the tmp directory can be removed."""
    yield db_path
    db_path.parent.chmod(0o755)
    if db_path.exists():
        db_path.chmod(0o644)


def _drop_root_override() -> None:
    """In the child, before exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding
    set, so a root process honours mode bits as any user does (an unprivileged user's read-only
    file is what this file's tests are about)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, cap_dac_override, cap_dac_read_search = 24, 1, 2
    for capability in (cap_dac_override, cap_dac_read_search):
        if libc.prctl(pr_capbset_drop, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def cli_as_user(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with the permissions of an ordinary user (root's override of mode bits dropped)."""
    preexec = _drop_root_override if os.geteuid() == 0 else None
    return subprocess.run([sys.executable, "-m", "qinglong", *args], cwd=db.parent.parent,
                          env=_env(db), capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          preexec_fn=preexec)


async def test_read_only_file_is_refused_at_start_naming_the_file(restore_modes, clock):
    """A read-only file used to start "healthy", fail every round and exit 0, and ``trigger add``
    ended in a traceback; both must say at once that the file is read-only."""
    db = restore_modes
    await _populated(db, clock)
    db.chmod(0o444)
    # A run that started on the file would go on for 600 s (and exit 0): the refusal must come at
    # start, so the only bound here is the CLI's timeout, which catches that hang as a failure.
    try:
        refused = cli_as_user(db, "run", "--for-seconds", "600")
    except subprocess.TimeoutExpired:
        pytest.fail("run kept running its rounds on a read-only file instead of refusing at start")
    assert_refused(refused, 5, db, "read-only")
    assert "scheduler started" not in refused.stderr, refused.stderr
    add = cli_as_user(db, "trigger", "add", "p1", "tr2", "--task", "t1", "--cron", "* * * * *")
    assert_refused(add, 5, db, "read-only")


async def test_read_only_directory_is_refused_naming_the_directory(restore_modes, clock):
    """SQLite must create its -wal and -shm files beside the database; a read-only directory must
    be named as the cause, not reported as some I/O failure mid-round."""
    db = restore_modes
    await _populated(db, clock)
    db.parent.chmod(0o555)
    assert_refused(cli_as_user(db, *RUN), 5, db, "read-only", str(db.parent))
    assert_refused(cli_as_user(db, "project", "create", "p2"), 5, db, "read-only")


def _fill(directory: Path) -> None:
    """Write a filler file until the file system has no space left."""
    with open(directory / "filler", "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass
    assert shutil.disk_usage(directory).free < 4096


async def test_full_disk_is_reported_as_full_naming_the_file(small_filesystem, clock):
    """On a full disk SQLite says "disk I/O error" (or the driver raised a traceback); the user must
    read that the disk is full, for publishing, migration and run alike, with nothing written."""
    db = small_filesystem / "q.db"
    await _populated(db, clock)
    before = query(db, "SELECT trigger_id FROM triggers")
    _fill(small_filesystem)
    for command in (["trigger", "add", "p1", "tr2", "--task", "t1", "--cron", "* * * * *"],
                    ["db", "migrate"], RUN):
        proc = cli(db, *command)
        assert_refused(proc, 5, db, "full")
        assert "I/O error" not in proc.stderr
    fresh = small_filesystem / "fresh.db"
    assert_refused(cli(fresh, "db", "migrate"), 5, fresh, "full")
    (small_filesystem / "filler").unlink()
    assert query(db, "SELECT trigger_id FROM triggers") == before


@pytest.mark.parametrize("command", [["db", "migrate"], ["project", "create", "p1"], RUN],
                         ids=lambda c: "-".join(c[:2]))
def test_a_create_refused_for_a_full_disk_leaves_no_database(small_filesystem, command):
    """A new database refused for a full disk was left behind empty: every later read said
    "migration not applied" (exit 4) instead of "does not exist", and the next publish on it
    had to be told apart from a damaged file. A new database appears under its name only once
    migrated; a refused create leaves nothing, and works once space is freed."""
    fresh = small_filesystem / "fresh.db"
    _fill(small_filesystem)
    try:
        assert_refused(cli(fresh, *command), 5, fresh, "full")
        assert sorted(p.name for p in small_filesystem.iterdir()) == ["filler"]
    finally:
        (small_filesystem / "filler").unlink()
    assert_refused(cli(fresh, "runs"), 3, fresh, "does not exist")
    made = cli(fresh, "project", "create", "p1")
    assert made.returncode == 0, made.stderr
    assert _projects(fresh) == ["p1"]
    assert query(fresh, "PRAGMA journal_mode") == [("wal",)]
    assert sorted(p.name for p in small_filesystem.iterdir() if not p.name.startswith("fresh.db")) == []


def test_a_create_through_a_dangling_symlink_refused_for_a_full_disk_leaves_no_database(small_filesystem,
                                                                                         tmp_path):
    """A database path that is a symlink to a file not made yet (a packaged default pointing
    into a data partition) was created in place: refused for a full disk, it left an empty file
    at the link's target that every later read took for an unmigrated database (exit 4). It is
    made under a private name beside the target like any new database; once space is freed the
    first publish makes it, and the link names it."""
    target = small_filesystem / "data.db"
    link = tmp_path / "q.db"
    link.symlink_to(target)
    _fill(small_filesystem)
    try:
        assert_refused(cli(link, "project", "create", "p1"), 5, link, "full")
        assert sorted(p.name for p in small_filesystem.iterdir()) == ["filler"]
        assert link.is_symlink() and os.readlink(link) == str(target)
    finally:
        (small_filesystem / "filler").unlink()
    assert_refused(cli(link, "runs"), 3, link, "does not exist")
    made = cli(link, "project", "create", "p1")
    assert made.returncode == 0, made.stderr
    assert link.is_symlink() and target.is_file() and _projects(target) == ["p1"]


def test_publishers_racing_to_create_a_database_all_land_in_one_file(tmp_path):
    """A new database takes its name only once migrated, and never over one that appeared there
    meanwhile: publishers starting at once on a missing path must each find the one database
    the first of them placed (none left with a database of its own under a private name, none
    refused), and no private file may stay behind."""
    db = tmp_path / "q.db"
    racers = [subprocess.Popen([sys.executable, "-m", "qinglong", "project", "create", f"p{i}"],
                               cwd=tmp_path, env=_env(db), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for i in range(4)]
    for racer in racers:
        out, err = racer.communicate(timeout=CLI_TIMEOUT_S)
        assert racer.returncode == 0, err
    assert _projects(db) == ["p0", "p1", "p2", "p3"]
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("q.db")] == []
    assert query(db, "PRAGMA integrity_check") == [("ok",)]


async def test_database_size_limit_is_reported_as_full_by_the_publisher(db_path, clock, backends):
    """SQLITE_FULL from a publishing transaction must reach the caller as StoreFull naming the
    file, and the refused write must leave nothing behind."""
    backend = backends.track(await open_backend(db_path, clock))
    await seed(backend)
    pages = await backend.store.call(lambda conn: conn.execute("PRAGMA page_count").fetchone()[0])
    await backend.store.call(lambda conn: conn.execute(f"PRAGMA max_page_count = {pages + 2}"))
    with pytest.raises(StoreFull, match="full") as refused:
        for i in range(64):
            await backend.publisher().put_task("p1", f"big{i}", {"blob": "x" * 20_000})
    assert str(db_path) in str(refused.value)


# --------------------------------------------------------------------------- the owner lock


def _spawn_run(db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "qinglong", "run"], cwd=db.parent, env=_env(db),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = CLI_TIMEOUT_S) -> None:
    """Read the child's stderr until a line contains ``needle``; fail on exit or timeout."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            pytest.fail(f"the child exited ({proc.wait()}) before {needle!r}:\n{''.join(seen)}")
        seen.append(line)
        if needle in line:
            return
    pytest.fail(f"no {needle!r} within {timeout} s:\n{''.join(seen)}")


def _wait_until(condition, timeout: float = CLI_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.02)


async def test_second_run_on_one_file_is_refused_naming_the_first_ones_pid(db_path, clock):
    """Two schedulers on one file were never what the user meant; the second must be refused with
    the holder's pid, while publishing and reading go on beside the first."""
    await _populated(db_path, clock)
    first = _spawn_run(db_path)
    try:
        _wait_for_line(first, "scheduler started")
        assert probe_owner_lock(str(db_path)) == first.pid
        second = cli(db_path, *RUN)
        assert_refused(second, 5, db_path, f"process {first.pid}")
        assert cli(db_path, "trigger", "add", "p1", "tr2", "--task", "t1", "--cron", "* * * * *"
                   ).returncode == 0
        assert cli(db_path, "runs").returncode == 0
        assert first.poll() is None, "the first scheduler stopped"
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=CLI_TIMEOUT_S)
    assert probe_owner_lock(str(db_path)) is None


def test_pending_migrations_are_never_applied_beneath_a_running_scheduler(db_path):
    """An upgraded binary must not change the schema under a scheduler that is running on the file
    (the running one would then write rows its schema does not know, or fail every round): while
    the owner lock is held, a second 'run' and a publish that would migrate are refused naming the
    holder, and the ledger is left exactly as it was."""
    known = migrations.load_migrations()
    with sqlite3.connect(db_path) as conn:
        migrations.apply_pending(conn, known[:1], str(db_path), 1)
    with sqlite3.connect(db_path) as conn:
        ledger_before = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    holder = OwnerLock(str(db_path))
    holder.acquire()
    try:
        for command in (RUN, ["project", "create", "p9"], ["db", "migrate"]):
            assert_refused(cli(db_path, *command), 5, db_path, f"process {os.getpid()}")
        with sqlite3.connect(db_path) as conn:
            assert conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall() \
                == ledger_before
    finally:
        holder.release()
    migrated = cli(db_path, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr


async def test_owner_lock_dies_with_a_killed_scheduler(db_path, clock):
    """A scheduler killed with SIGKILL cannot release anything itself; if its lock outlived it, the
    file could never be scheduled again without a manual cleanup."""
    await _populated(db_path, clock)
    first = _spawn_run(db_path)
    try:
        _wait_for_line(first, "scheduler started")
        assert probe_owner_lock(str(db_path)) == first.pid
    finally:
        first.kill()
        first.communicate(timeout=CLI_TIMEOUT_S)
    assert owner_lock_path(str(db_path)).exists()
    assert probe_owner_lock(str(db_path)) is None
    following = cli(db_path, "run", "--for-seconds", "1")
    assert following.returncode == 0, following.stderr
    assert "scheduler started" in following.stderr


def test_probe_does_not_create_the_lock_file_and_is_not_mistaken_for_a_scheduler(db_path):
    """A status probe must never block a scheduler from starting (it holds a shared lock for an
    instant) nor leave a lock file behind where there was none."""
    assert probe_owner_lock(str(db_path)) is None
    db_path.touch()  # the lock is the database file's own: it locks a file that exists
    assert probe_owner_lock(str(db_path)) is None
    assert not owner_lock_path(str(db_path)).exists()
    lock = OwnerLock(str(db_path))
    lock.acquire()
    try:
        assert probe_owner_lock(str(db_path)) == os.getpid()
    finally:
        lock.release()
    assert probe_owner_lock(str(db_path)) is None


def _live_schedulers(db: Path) -> int:
    status = cli(db, "status", "--once", "--json")
    assert status.returncode in (0, 10, 20), status.stderr
    import json

    return json.loads(status.stdout)["stats"]["live_schedulers"]


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
async def test_a_second_run_through_another_name_of_the_file_is_refused(db_path, clock, link):
    """The lock was keyed on the path as written: a second ``run`` through a symlink or a hard
    link started beside the first (two schedulers admitting into one file, and through a hard
    link SQLite keeps a second WAL: a documented corruption cause), and ``status`` through the
    link said nothing ran. The lock is the file's own, whatever name reaches it."""
    await _populated(db_path, clock)
    other = db_path.parent / "other-name.db"
    first = _spawn_run(db_path)
    try:
        _wait_for_line(first, "scheduler started")
        # made once the first runs: a file with two names is refused to any writer at start
        (other.symlink_to if link == "symlink" else other.hardlink_to)(db_path)
        second = cli(other, *RUN)
        assert_refused(second, 5 if link == "symlink" else 3, other, f"process {first.pid}", "owned by")
        assert "scheduler started" not in second.stderr
        assert _live_schedulers(other) == 1
        assert first.poll() is None, "the first scheduler stopped"
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=CLI_TIMEOUT_S)
    assert _live_schedulers(other) == 0
    assert not (db_path.parent / "other-name.db.lock").exists() or link == "hardlink"


@pytest.mark.parametrize("kind", ["symlink", "dangling", "hardlink", "foreign", "fifo", "directory"])
async def test_a_lock_file_that_is_not_ours_is_refused_and_left_untouched(db_path, clock, kind):
    """The lock file was opened following links and truncated: a ``<db>.lock`` linked to another
    file emptied that file. A link, another file's name, a file holding other data, a FIFO or a
    directory is refused by name as the user's to remove (a directory was reported as the store
    being unavailable, to be retried later), and its bytes stay as they were."""
    await _populated(db_path, clock)
    precious = db_path.parent / "precious.txt"
    precious.write_text("do not truncate me\n")
    lock = owner_lock_path(str(db_path))
    lock.unlink(missing_ok=True)  # the one the migration left
    if kind == "symlink":
        lock.symlink_to(precious)
        words = ("is a symbolic link",)
    elif kind == "dangling":
        lock.symlink_to(db_path.parent / "nowhere")
        words = ("is a symbolic link",)
    elif kind == "fifo":
        os.mkfifo(lock)
        words = ("is not a regular file",)
    elif kind == "directory":
        lock.mkdir()
        words = ("is not a regular file",)
    elif kind == "hardlink":
        lock.hardlink_to(precious)
        words = ("has 2 names",)
    else:
        lock.write_text("do not truncate me\n")
        words = ("holds something other than a pid",)
    refused = cli(db_path, *RUN)
    assert_refused(refused, 3, db_path, str(lock), *words)
    assert "scheduler started" not in refused.stderr
    assert precious.read_text() == "do not truncate me\n"
    assert not (db_path.parent / "nowhere").exists()
    if kind == "foreign":
        assert lock.read_text() == "do not truncate me\n"



# --------------------------------------------------------------------------- reading a file that cannot be written


async def _with_a_finished_run(db: Path, clock, through: Path | None = None) -> str:
    """A ready database whose Run of ``p1/t1`` ran ``echo hello`` to its end, log kept; its id.
    Admitted and run through the name ``through`` when given."""
    import json

    await _populated(db, clock)
    name = through or db
    admitted = cli(name, "task", "run", "p1", "t1", "--json")
    assert admitted.returncode == 0, admitted.stderr
    run_id = json.loads(admitted.stdout)["run_id"]
    scheduler = _spawn_run(name)
    try:
        def ended() -> bool:
            shown = cli(name, "runs", "show", run_id, "--json")
            return shown.returncode == 0 and json.loads(shown.stdout)["state"] == "succeeded"
        _wait_until(ended)
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.communicate(timeout=CLI_TIMEOUT_S)
    return run_id


def _reads(db: Path, run_id: str, run_cli=cli) -> dict[str, subprocess.CompletedProcess[str]]:
    return {"runs": run_cli(db, "runs"), "runs show": run_cli(db, "runs", "show", run_id),
            "logs": run_cli(db, "logs", run_id), "status": run_cli(db, "status", "--once"),
            "task show": run_cli(db, "task", "show", "p1", "t1")}


def _assert_read(results: dict[str, subprocess.CompletedProcess[str]], run_id: str) -> None:
    for name, result in results.items():
        context = f"{name}: exit {result.returncode}, stderr:\n{result.stderr}"
        assert "Traceback" not in result.stderr, context
        assert result.returncode in ((0, 10, 20) if name == "status" else (0,)), context
    assert run_id in results["runs"].stdout
    assert results["logs"].stdout == "hello\n"
    assert "echo" in results["task show"].stdout


@pytest.mark.parametrize("what", ["directory", "file and directory"])
async def test_read_commands_work_on_a_read_only_store(restore_modes, clock, what):
    """A router whose flash went read-only could not show what its jobs did: every read command
    exited 5. Reading opens the store read-only and shows the Runs, the log, the status and the
    task, writing nothing."""
    db = restore_modes
    run_id = await _with_a_finished_run(db, clock)
    before = db.read_bytes()
    if what == "file and directory":  # as on a flash that went read-only
        db.chmod(0o444)
    db.parent.chmod(0o555)
    _assert_read(_reads(db, run_id, cli_as_user), run_id)
    assert db.read_bytes() == before


async def test_read_commands_work_on_a_full_disk(small_filesystem, clock):
    """On a full disk even ``runs`` exited 5: the moment an operator most needs to read what ran
    is when the disk filled up."""
    db = small_filesystem / "q.db"
    run_id = await _with_a_finished_run(db, clock)
    _fill(small_filesystem)
    try:
        _assert_read(_reads(db, run_id), run_id)
    finally:
        (small_filesystem / "filler").unlink()


#: Read commands beside those above: each lists or checks, and none may need to write.
MORE_READS = (["notifications"], ["db", "status"], ["db", "wait", "--timeout", "1s"])


@pytest.mark.parametrize("command", MORE_READS, ids=lambda c: "-".join(c[:2]))
async def test_every_read_command_works_on_a_read_only_directory(restore_modes, clock, command):
    """``notifications``, ``db status`` and ``db wait`` still opened the store for writing: on a
    read-only flash they exited 5, hiding the deliveries and the schema state the operator came
    to read."""
    db = restore_modes
    await _populated(db, clock)
    before = db.read_bytes()
    db.chmod(0o444)
    db.parent.chmod(0o555)
    result = cli_as_user(db, *command)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert db.read_bytes() == before


@pytest.mark.parametrize("command", MORE_READS, ids=lambda c: "-".join(c[:2]))
async def test_every_read_command_works_on_a_full_disk(small_filesystem, clock, command):
    """The same read commands exited 5 "the disk is full" on a full disk, when reading is all the
    operator can do before freeing space."""
    db = small_filesystem / "q.db"
    await _populated(db, clock)
    _fill(small_filesystem)
    try:
        result = cli(db, *command)
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 0, f"exit {result.returncode}, stderr:\n{result.stderr}"
    finally:
        (small_filesystem / "filler").unlink()


async def test_status_answers_while_the_running_schedulers_lock_file_is_swapped_for_a_fifo(db_path, clock):
    """The probe opened the lock file to read the holder's pid without O_NONBLOCK: a FIFO put in
    its place (by anyone who may write the directory) held every ``status`` forever while a
    scheduler ran, so the operator could see nothing."""
    await _populated(db_path, clock)
    first = _spawn_run(db_path)
    try:
        _wait_for_line(first, "scheduler started")
        lock = owner_lock_path(str(db_path))
        lock.unlink()
        os.mkfifo(lock)
        try:
            running = _live_schedulers(db_path)
        except subprocess.TimeoutExpired:
            pytest.fail("status hung opening the FIFO in place of the lock file")
        assert running == 1
        assert probe_owner_lock(str(db_path)) == first.pid  # named from /proc/locks instead
        assert first.poll() is None, "the first scheduler stopped"
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=CLI_TIMEOUT_S)


async def test_secrets_key_beside_a_symlinked_database_is_the_files_own(db_path, clock):
    """The default secrets key was found beside the name as written: the first env value
    published through a symlink to the database created ``<link>.key`` and was sealed under it,
    and ``run`` on the file's own name then refused to start (exit 6) for want of that key. The key
    belongs to the file the name resolves to, like its lock."""
    await _populated(db_path, clock)
    other = db_path.parent / "other-name.db"
    other.symlink_to(db_path)
    put = cli(other, "task", "put", "p1", "t2", "--env", "TOKEN=s3cret", "--", "true")
    assert put.returncode == 0, put.stderr
    assert not (db_path.parent / "other-name.db.key").exists()
    assert (db_path.parent / (db_path.name + ".key")).exists()
    started = cli(db_path, "run", "--for-seconds", "1")
    assert started.returncode == 0, started.stderr
    assert "scheduler started" in started.stderr
    shown = cli(other, "task", "show", "p1", "t2")
    assert shown.returncode == 0, shown.stderr
    assert "s3cret" not in shown.stdout + shown.stderr


def test_a_key_left_beside_a_symlink_is_named_not_replaced(db_path):
    """A store whose values were sealed under ``<link>.key`` (before the key followed the file)
    must not get a second, new key beside the file's own name, under which later values would be
    sealed: both keys would then be needed and neither name could open every value. The user is
    told where the key is and where it belongs."""
    other = db_path.parent / "other-name.db"
    made = cli(db_path, "project", "create", "p1")
    assert made.returncode == 0, made.stderr
    other.symlink_to(db_path)
    stray = db_path.parent / "other-name.db.key"
    stray.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    put = cli(other, "task", "put", "p1", "t2", "--env", "TOKEN=s3cret", "--", "true")
    assert put.returncode == 6, put.stderr
    assert "Traceback" not in put.stderr, put.stderr
    assert str(stray) in put.stderr and str(db_path) + ".key" in put.stderr, put.stderr
    assert not (db_path.parent / (db_path.name + ".key")).exists()
    assert query(db_path, "SELECT count(*) FROM tasks") == [(0,)]


def _projects(db: Path) -> list[str]:
    return [row[0] for row in query(db, "SELECT project_id FROM projects ORDER BY project_id")]


async def test_no_write_goes_through_a_hard_link_to_the_database(db_path, clock):
    """SQLite keeps its write-ahead log beside the name it opens: ``project create`` through a
    hard link while ``run`` ran on the first name exited 0, its project was lost when the scheduler
    checkpointed, and the link's own WAL then made the file read "malformed" through that name.
    Every writer (publishing, ``run``) refuses a file with two names, naming the count and the
    running owner; reading through it still works and changes nothing."""
    await _populated(db_path, clock)
    other = db_path.parent / "other-name.db"
    first = _spawn_run(db_path)
    try:
        _wait_for_line(first, "scheduler started")
        other.hardlink_to(db_path)
        refused = cli(other, "project", "create", "p9")
        assert_refused(refused, 3, other, "2 names", "hard link", f"process {first.pid}")
        assert not Path(f"{other}-wal").exists()
        assert cli(other, "runs").returncode == 0
        assert first.poll() is None, "the first scheduler stopped"
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=CLI_TIMEOUT_S)
    assert_refused(cli(db_path, "run", "--for-seconds", "1"), 3, db_path, "2 names", "hard link")
    assert_refused(cli(db_path, "project", "create", "p8"), 3, db_path, "2 names")
    other.unlink()
    assert _projects(db_path) == ["p1"]
    assert query(db_path, "PRAGMA integrity_check") == [("ok",)]
    made = cli(db_path, "project", "create", "p8")
    assert made.returncode == 0, made.stderr
    assert _projects(db_path) == ["p1", "p8"]


_COMMIT_AND_DIE = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")
conn.execute("UPDATE projects SET name = 'renamed' WHERE project_id = 'p1'")
os._exit(0)  # as on a power loss: the commit is in the WAL only, never checkpointed
"""


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
async def test_a_read_through_another_name_never_skips_the_files_wal(restore_modes, clock, link):
    """Reading a read-only directory falls back to the file alone only when its WAL holds
    nothing; the WAL was looked for beside the name as written, so through a symlink or a hard
    link a WAL full of committed changes went unseen and the listing silently showed the file as
    it was before them, where the file's own name refused. Both names must give the same answer
    (a hard link's other WAL cannot be found, so the file alone is never trusted through one)."""
    db = restore_modes
    await _populated(db, clock)
    died = subprocess.run([sys.executable, "-c", _COMMIT_AND_DIE, str(db)], timeout=CLI_TIMEOUT_S)
    assert died.returncode == 0
    assert Path(f"{db}-wal").stat().st_size > 0
    Path(f"{db}-shm").unlink()  # the WAL alone, as a copy of the two files leaves it
    other = db.parent / "other-name.db"
    (other.symlink_to if link == "symlink" else other.hardlink_to)(db)
    db.parent.chmod(0o555)
    direct, linked = cli_as_user(db, "project", "list"), cli_as_user(other, "project", "list")
    assert "Traceback" not in direct.stderr + linked.stderr
    assert linked.returncode == direct.returncode, (direct, linked)
    assert linked.stdout == direct.stdout, (direct, linked)


async def test_a_secrets_key_that_cannot_be_written_is_not_left_empty(small_filesystem, clock):
    """The first env value published on a full disk created the default key file, failed to
    write it with a traceback (exit 1) and left it empty: once space was freed every publish of
    an env value still failed (exit 6, "expected the base64 of 32 bytes") until the user found and
    deleted the empty key. The refusal must name the key file and leave nothing behind."""
    db = small_filesystem / "q.db"
    await _populated(db, clock)
    key = small_filesystem / "q.db.key"
    assert not key.exists()
    holder = sqlite3.connect(db)  # a running scheduler's connection: -wal and -shm stay allocated
    try:
        holder.execute("SELECT count(*) FROM projects").fetchone()
        _fill(small_filesystem)
        put = cli(db, "task", "put", "p1", "t2", "--env", "TOKEN=s3cret", "--", "true")
        assert_refused(put, 6, db, str(key), "No space left")
        assert not key.exists()
        (small_filesystem / "filler").unlink()
        again = cli(db, "task", "put", "p1", "t2", "--env", "TOKEN=s3cret", "--", "true")
        assert again.returncode == 0, again.stderr
        assert len(key.read_text().strip()) == 44
    finally:
        holder.close()
        (small_filesystem / "filler").unlink(missing_ok=True)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
async def test_a_secrets_key_that_is_not_a_file_is_refused_at_once(db_path, clock, kind):
    """The key file was opened blocking: a FIFO at ``<db>.key`` held ``task put --env`` and
    ``run`` forever, ``run`` deaf to SIGTERM (only SIGKILL ended it), so a router's service never
    started nor stopped. Anything but a regular file is refused naming it, exit 6."""
    await _populated(db_path, clock)
    sealed = cli(db_path, "task", "put", "p1", "t2", "--env", "TOKEN=s3cret", "--", "true")
    assert sealed.returncode == 0, sealed.stderr
    key = db_path.parent / (db_path.name + ".key")
    key.unlink()
    os.mkfifo(key) if kind == "fifo" else key.mkdir()
    for command in (["task", "put", "p1", "t3", "--env", "TOKEN=s3cret", "--", "true"],
                    ["run", "--for-seconds", "1"]):
        try:
            refused = cli(db_path, *command)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command[0]} hung opening the {kind} in place of the key file")
        assert_refused(refused, 6, db_path, str(key), "not a regular file")


@pytest.mark.parametrize("kind", ["fifo", "character-device"])
@pytest.mark.parametrize("command", [["runs"], ["project", "create", "p1"], ["run", "--for-seconds", "1"]],
                         ids=lambda c: c[0])
def test_a_database_path_that_is_not_a_file_is_refused_at_once(tmp_path, kind, command):
    """Only a directory was refused as the database path: ``runs`` on a FIFO waited for a writer
    forever, and publishing or ``run`` on a FIFO or a device went on until SQLite's "disk I/O
    error" (exit 5, as if the disk had failed), SQLite opening for writing whatever device a
    mistyped path named. Anything but a regular file is refused naming the path, exit 3."""
    if kind == "fifo":
        target = tmp_path / "q.db"
        os.mkfifo(target)
    else:
        target = Path("/dev/null")
    try:
        refused = cli(tmp_path / "q.db" if kind == "fifo" else target, *command)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command[0]} hung opening a {kind} as its database")
    assert_refused(refused, 3, target, "not a regular file")


@pytest.mark.parametrize("kind", ["symlink", "fifo", "foreign"])
def test_a_publish_refused_for_its_lock_file_leaves_no_database(tmp_path, kind):
    """A publish on a new path whose ``<db>.lock`` is not a lock file was refused only after
    SQLite had created the database: an empty file was left, and every later read said
    "migration not applied" instead of "does not exist". The lock file is checked first."""
    db = tmp_path / "q.db"
    lock = owner_lock_path(str(db))
    precious = tmp_path / "precious.txt"
    precious.write_text("do not truncate me\n")
    if kind == "symlink":
        lock.symlink_to(precious)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.write_text("do not truncate me\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    for command in (["project", "create", "p1"], ["db", "migrate"], ["run", "--for-seconds", "1"]):
        assert_refused(cli(db, *command), 3, db, str(lock))
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert precious.read_text() == "do not truncate me\n"


async def test_a_read_that_needs_the_wal_says_so_not_that_it_wanted_to_write(restore_modes, clock):
    """A read-only directory whose WAL holds committed changes (and no -shm) cannot be read; the
    refusal of ``runs`` said the database "cannot be opened for writing", which the operator who
    only asked to read could not act on. It must name the WAL and the -shm SQLite needs."""
    db = restore_modes
    await _populated(db, clock)
    died = subprocess.run([sys.executable, "-c", _COMMIT_AND_DIE, str(db)], timeout=CLI_TIMEOUT_S)
    assert died.returncode == 0
    Path(f"{db}-shm").unlink()
    db.parent.chmod(0o555)
    refused = cli_as_user(db, "runs")
    assert_refused(refused, 5, db, f"{db}-wal", f"{db}-shm", str(db.parent))
    assert "for writing" not in refused.stderr, refused.stderr


# --------------------------------------------------------------------------- another database's files


#: Commands that each open the database path in their own way: reading, publishing (with a
#: secret, which makes the key file), migrating and scheduling.
SIDECAR_COMMANDS = (["runs"], ["db", "status"], ["logs", "r1"], ["project", "create", "p9"],
                    ["task", "put", "p1", "t9", "--env", "TOKEN=s3cret", "--", "true"],
                    ["db", "migrate"], ["run", "--for-seconds", "5"])


def _tree(directory: Path) -> list[str]:
    """The names in ``directory``, but for the log directory a running scheduler writes."""
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".logs"))


async def test_a_path_naming_a_running_databases_own_files_is_refused_and_changes_nothing(db_path, clock):
    """``--db q.db-wal`` was opened as a database of its own: reading it while ``run`` wrote to
    ``q.db`` read the live write-ahead log as a database, publishing created ``q.db-wal-wal`` and
    ``q.db-wal.lock`` beside it and could write over the real database's log, and ``q.db.key``
    became a database that every later sealed value of ``q.db`` failed on. Every command refuses
    such a path at once, naming it and whose file it is, and creates nothing."""
    await _populated(db_path, clock)
    first = _spawn_run(db_path)
    try:
        _wait_for_line(first, "scheduler started")
        assert Path(f"{db_path}-wal").exists() and Path(f"{db_path}-shm").exists()
        before = _tree(db_path.parent)
        sidecars = {"-wal": "write-ahead log", "-shm": "shared-memory index",
                    "-journal": "rollback journal", ".lock": "owner lock", ".key": "secrets key"}
        for suffix, what in sidecars.items():
            named = Path(f"{db_path}{suffix}")
            commands = SIDECAR_COMMANDS if suffix == "-wal" else (["runs"], ["project", "create", "p9"], RUN)
            for command in commands:
                refused = cli(named, *command)
                assert_refused(refused, 3, named, what, str(db_path))
                assert "scheduler started" not in refused.stderr
                assert _tree(db_path.parent) == before, (suffix, command)
        assert first.poll() is None, "the running scheduler stopped"
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=CLI_TIMEOUT_S)
    assert query(db_path, "PRAGMA integrity_check") == [("ok",)]
    assert _projects(db_path) == ["p1"]


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_path_named_like_sqlites_own_files_is_refused_before_the_database_exists(tmp_path, suffix):
    """A database made at ``q.db-wal`` before ``q.db`` existed was taken by SQLite for the
    write-ahead log of the ``q.db`` made later beside it (and its pages for log frames). Such a
    name is refused even alone, and nothing is created."""
    named = tmp_path / f"q.db{suffix}"
    for command in (["project", "create", "p1"], ["db", "migrate"], ["runs"]):
        assert_refused(cli(named, *command), 3, named, str(tmp_path / "q.db"))
        assert _tree(tmp_path) == []


async def test_a_symlink_to_a_databases_write_ahead_log_is_refused(db_path, clock):
    """A name is checked as it resolves too: a link ``other.db`` to ``q.db-wal`` opened the log
    as a database exactly as the name itself did."""
    await _populated(db_path, clock)
    holder = sqlite3.connect(db_path)  # an open connection keeps the -wal in place
    try:
        holder.execute("SELECT count(*) FROM projects").fetchone()
        other = db_path.parent / "other.db"
        other.symlink_to(Path(f"{db_path}-wal"))
        before = _tree(db_path.parent)
        assert_refused(cli(other, "project", "create", "p9"), 3, other, "write-ahead log")
        assert _tree(db_path.parent) == before
    finally:
        holder.close()
    assert query(db_path, "PRAGMA integrity_check") == [("ok",)]


def _fill_leaving(directory: Path, leave_free: int) -> None:
    """Write a filler file until the file system has at most ``leave_free`` bytes free."""
    with open(directory / "filler", "wb", buffering=0) as filler:
        while shutil.disk_usage(directory).free > leave_free:
            filler.write(b"\0" * 4096)


async def test_logs_of_a_job_run_through_a_symlink_are_the_files_own(small_filesystem, clock):
    """The default log directory was keyed on the name as written: a job run through a symlink
    to the database logged into ``<link>.logs``, which the free-space floor of ``run`` on the
    file's own name never looked at (its logs stayed while the disk filled up), and which was
    left behind, or lost with the link. The log directory is the resolved file's, like its lock
    and its secrets key: the log reads through either name and the real name's retention
    sweeps it."""
    db = small_filesystem / "q.db"
    link = small_filesystem / "link.db"
    link.symlink_to(db)
    run_id = await _with_a_finished_run(db, clock, through=link)
    assert not (small_filesystem / "link.db.logs").exists()
    (attempt_dir,) = query(db, "SELECT a.attempt_dir FROM attempts a WHERE a.run_id = ?", (run_id,))[0]
    assert Path(attempt_dir).parent == small_filesystem / "q.db.logs"
    for name in (db, link):
        shown = cli(name, "logs", run_id)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == "hello\n"
    # under the free-space floor (a tenth of the 4 MiB file system), with no log kept per task
    _fill_leaving(small_filesystem, 256 * 1024)
    env = _env(db) | {"QINGLONG_EXECUTION__KEEP_LOGS_PER_TASK": "0"}
    scheduler = subprocess.Popen([sys.executable, "-m", "qinglong", "run"], cwd=db.parent, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_line(scheduler, "scheduler started")
        _wait_until(lambda: query(db, "SELECT log_deleted_at_ms FROM attempts WHERE run_id = ?",
                                  (run_id,))[0][0] is not None)
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.communicate(timeout=CLI_TIMEOUT_S)
        (small_filesystem / "filler").unlink(missing_ok=True)
    assert not Path(attempt_dir).exists()
