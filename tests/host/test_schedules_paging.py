"""``qinglong schedules`` pages through the store: every schedule exactly once, printed page by
page in bounded memory, ``--json`` one valid JSON array, ``--limit`` with a cursor to go on."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from host_helpers import REPO

MiB = 1024 * 1024


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _ok(result) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    return result.stdout


def _store(cli, count: int) -> Path:
    """A store of ``count`` schedules: one published through the CLI, cloned by bulk SQL (publishing
    200,000 one by one would dominate the test). The clones share a handful of fire times, so
    pages end between equal fire times too."""
    _ok(cli("project", "create", "ops"))
    _ok(cli("task", "put", "ops", "job", "--command", "true"))
    _ok(cli("trigger", "add", "ops", "seed", "--task", "job", "--cron", "0 * * * *"))
    path = cli.cwd / "qinglong.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for table in ("triggers", "trigger_schedules"):
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            select = ", ".join("printf('t%07d', n)" if c == "trigger_id" else
                               "1700000000000 + (n % 7) * 60000" if c == "next_fire_at_ms" else c
                               for c in columns)
            conn.execute(
                f"WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < ?) "
                f"INSERT INTO {table} ({', '.join(columns)}) "
                f"SELECT {select} FROM {table} CROSS JOIN seq WHERE trigger_id = 'seed'",
                (count - 1,))
        conn.execute("COMMIT")
        assert conn.execute("SELECT count(*) FROM trigger_schedules").fetchone()[0] == count
    finally:
        conn.close()
    return path


def _ids(stdout: str) -> list[str]:
    return [s["trigger_id"] for s in json.loads(stdout)]


def test_json_lists_every_schedule_exactly_once_across_pages_as_one_valid_array(cli):
    """Pages stitched at the wrong key would drop or repeat schedules where one 1,000-row page
    ends; an array written piecewise that is not valid JSON breaks every script reading it."""
    _store(cli, 2_345)
    out = _ok(cli("schedules", "--json"))
    listed = json.loads(out)
    assert isinstance(listed, list) and len(listed) == 2_345
    ids = [s["trigger_id"] for s in listed]
    assert len(set(ids)) == 2_345
    keys = [(s["next_fire_at_ms"] is not None, s["next_fire_at_ms"] or 0, s["project_id"],
             s["trigger_id"]) for s in listed]  # awaiting initialization (the seed) first
    assert keys == sorted(keys)
    assert json.loads(_ok(cli("schedules", "--json", "--limit", "3")))[0]["trigger_id"] == ids[0]


def test_an_empty_store_lists_an_empty_json_array(cli):
    """Streaming writes the brackets itself; an empty listing must still be valid JSON."""
    _ok(cli("project", "create", "ops"))
    assert json.loads(_ok(cli("schedules", "--json"))) == []


def test_a_limit_prints_the_cursor_and_after_continues_exactly_where_it_stopped(cli):
    """Without the cursor an operator cannot get past the first ``--limit`` rows of a large store;
    a cursor that restarted or overlapped would show schedules twice or never."""
    _store(cli, 2_500)
    whole = _ids(_ok(cli("schedules", "--json")))
    seen: list[str] = []
    args: list[str] = []
    for _ in range(10):
        result = cli("schedules", "--json", "--limit", "1100", *args)
        seen += _ids(_ok(result))
        more = [line for line in result.stderr.splitlines() if line.startswith("more: --after ")]
        if not more:
            break
        args = ["--after", more[-1].split()[-1]]
    assert seen == whole
    text = _ok(cli("schedules", "--limit", "2"))
    assert text.splitlines()[-1].startswith("more: --after ")
    token = text.splitlines()[-1].split()[-1]
    rest = _ok(cli("schedules", "--after", token, "--limit", "1"))
    assert whole[2] in rest and whole[1] not in rest
    assert "more: --after" not in _ok(cli("schedules", "--limit", "2500")).splitlines()[-1]


def test_a_malformed_cursor_is_refused_as_a_usage_error(cli):
    """A cursor read as 'from the start' would silently list the first page again."""
    _ok(cli("project", "create", "ops"))
    result = cli("schedules", "--after", "not-a-cursor")
    assert result.returncode == 2 and "is not a schedule cursor" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("keyset", [[2**63, "ops", "t"], [-(2**63) - 1, "ops", "t"], [1, "ops", "\udc80"],
                                    [1, "ops", "t" * 65], [True, "ops", "t"]])
def test_a_forged_cursor_out_of_the_stores_range_is_a_usage_error(cli, keyset):
    """A cursor is base64 anyone can write: a fire time past 64 bits or a name that is no
    identifier (an unpaired surrogate) reached SQLite and ended ``schedules`` in an OverflowError
    or UnicodeEncodeError traceback instead of a usage error."""
    import base64

    _ok(cli("project", "create", "ops"))
    token = base64.urlsafe_b64encode(json.dumps(keyset).encode()).decode().rstrip("=")
    result = cli("schedules", "--after", token)
    assert result.returncode == 2 and "is not a schedule cursor" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


_PEAK = textwrap.dedent("""
    import resource, subprocess, sys
    proc = subprocess.run([sys.executable, "-m", "qinglong", "schedules", "--json"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
""")


def _peak_rss(cwd: Path) -> int:
    """Peak RSS (bytes) of one ``schedules --json`` run, from getrusage in a fresh parent."""
    out = subprocess.run([sys.executable, "-c", _PEAK], cwd=cwd, env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1]) * 1024


def test_listing_200000_schedules_takes_about_the_memory_of_2000(tmp_path):
    """Reading the whole table before printing held every schedule, its dict and its JSON text at
    once (3.7 GiB at a million schedules): a listing of a large store would be killed by the OOM
    killer on a small host. Paging keeps it to one page."""
    from host_helpers import run_cli

    peaks = {}
    for count in (2_000, 200_000):
        workdir = tmp_path / str(count)
        workdir.mkdir()

        def cli(*args, _cwd=workdir):
            return run_cli(list(args), cwd=_cwd)

        cli.cwd = workdir
        _store(cli, count)
        peaks[count] = _peak_rss(workdir)
    assert peaks[200_000] <= peaks[2_000] + 12 * MiB, {k: v / MiB for k, v in peaks.items()}


def test_a_store_that_stays_locked_past_its_timeout_is_exit_5_without_a_traceback(cli):
    """A listing that outlived the store's timeout ended in a traceback (exit 1), which tells an
    operator nothing and a script that the command itself is broken; it must be the store's exit
    code with a message saying why."""
    _store(cli, 10)
    settings = cli.cwd / "locked.toml"
    settings.write_text('profile = "standalone"\n[backend]\npath = "qinglong.db"\n'
                        "busy_timeout_ms = 300\n")
    holder = sqlite3.connect(cli.cwd / "qinglong.db", isolation_level=None)
    try:
        # Exclusive locking mode keeps even WAL readers out until the holder lets go.
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("UPDATE projects SET name = name")
        for extra in ((), ("--json",)):
            result = cli("schedules", "--settings", str(settings), *extra)
            assert result.returncode == 5, (result.returncode, result.stderr)
            assert "Traceback" not in result.stderr and "busy" in result.stderr
    finally:
        holder.close()
    assert len(json.loads(_ok(cli("schedules", "--json", "--settings", str(settings))))) == 10
