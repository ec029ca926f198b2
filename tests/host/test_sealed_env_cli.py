"""Secrets at rest on the edge profile, through the real commands: a local job still gets its env
value in clear, the SQLite file never holds it, ``qinglong secrets rotate`` re-seals under a new
key (once), and a missing or wrong key stops ``qinglong run`` with exit code 6, naming the
setting, before anything is changed."""

from __future__ import annotations

import base64
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

from qinglong.contracts.errors import ExitCode

from test_cli_execution import ControlPlane, Workspace, ws  # noqa: F401 (the fixture)

SECRET = "hunter2-5ea1ed-" + "c0ffee"
JOB = ["--", "sh", "-c", 'printf "%s" "$TOKEN"']


def file_bytes(ws: Workspace) -> bytes:
    """The SQLite file and its write-ahead log, byte for byte (what a copy of the disk holds)."""
    data = b""
    for suffix in ("", "-wal", "-journal"):
        path = Path(str(ws.db) + suffix)
        if path.exists():
            data += path.read_bytes()
    return data


def start_run(ws: Workspace, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``qinglong run`` expected to refuse to start: its exit code and stderr."""
    return subprocess.run([sys.executable, "-m", "qinglong", "--settings", str(ws.settings), "run"],
                          cwd=ws.root, env={**ws.env(), **(env or {})}, capture_output=True, text=True,
                          timeout=120)


def run_log(ws: Workspace, task: str) -> bytes:
    """A Run of ``task`` through a started ``qinglong run``, which must succeed: its log."""
    plane = ControlPlane(ws)
    try:
        run_id = ws.admit(task)
        assert ws.wait_ended(run_id, plane.process)["state"] == "succeeded"
        return ws.call("logs", run_id)[1]
    finally:
        plane.stop()


def new_key(path: Path) -> Path:
    path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    return path


def test_a_local_job_gets_its_sealed_env_value_and_the_file_never_holds_it(ws):
    ws.ok("task", "put", "ops", "job", "--env", f"TOKEN={SECRET}", *JOB)
    key = Path(str(ws.db) + ".key")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # made on first use, beside the database
    assert run_log(ws, "job") == SECRET.encode()
    assert SECRET.encode() not in file_bytes(ws)
    assert SECRET not in ws.ok("task", "show", "ops", "job") + ws.ok("task", "show", "ops", "job", "--json")


def test_a_missing_key_stops_run_and_publishing_with_exit_6_and_changes_nothing(ws):
    ws.ok("task", "put", "ops", "job", "--env", f"TOKEN={SECRET}", *JOB)
    key = Path(str(ws.db) + ".key")
    key.rename(ws.root / "elsewhere.key")
    before = ws.dump()
    done = start_run(ws)
    assert done.returncode == ExitCode.SECRETS == 6, done.stderr
    assert "[secrets] key_file" in done.stderr and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr
    code, _, err = ws.call("task", "put", "ops", "other", "--env", "A=b", *JOB)
    assert code == 6 and "[secrets] key_file" in err
    assert ws.dump() == before and not key.exists()


def test_a_wrong_key_stops_run_with_exit_6_naming_the_setting(ws):
    ws.ok("task", "put", "ops", "job", "--env", f"TOKEN={SECRET}", *JOB)
    before = ws.dump()
    wrong = base64.b64encode(os.urandom(32)).decode()
    done = start_run(ws, {"QINGLONG_SECRETS_KEY": wrong})
    assert done.returncode == 6, done.stderr
    assert "[secrets] key_file" in done.stderr and "key_env" in done.stderr
    assert wrong not in done.stderr and SECRET not in done.stderr
    done = start_run(ws, {"QINGLONG_SECRETS_KEY": "not base64 of 32 bytes"})
    assert done.returncode == 6 and "QINGLONG_SECRETS_KEY" in done.stderr, done.stderr
    assert ws.dump() == before


def test_rotate_reseals_under_the_new_key_once_and_needs_the_old_one(ws):
    ws.ok("task", "put", "ops", "job", "--env", f"TOKEN={SECRET}", *JOB)
    ws.ok("task", "put", "ops", "job", "--env", f"TOKEN={SECRET}-2", *JOB)
    old = Path(str(ws.db) + ".key")
    new = new_key(ws.root / "new.key")
    ws.settings.write_text(ws.settings.read_text() + f'[secrets]\nkey_file = "{new}"\n')
    before = ws.dump()
    code, _, err = ws.call("secrets", "rotate")
    assert code == 6 and "--old-key-file" in err and "nothing was changed" in err
    assert ws.dump() == before
    first = ws.json("secrets", "rotate", "--old-key-file", str(old))
    assert first["rewritten"] == 3  # two revisions and the head
    assert ws.json("secrets", "rotate", "--old-key-file", str(old))["rewritten"] == 0
    old.unlink()  # the old key is no longer needed by anything
    assert run_log(ws, "job") == f"{SECRET}-2".encode()
    assert SECRET.encode() not in file_bytes(ws)


def test_values_in_clear_of_an_older_store_are_sealed_when_run_starts(ws):
    ws.ok("task", "put", "ops", "job", "--env", "TOKEN=placeholder", *JOB)
    conn = sqlite3.connect(ws.db)
    with conn:  # as a store written before values were sealed holds them
        for table in ("tasks", "task_revisions"):
            conn.execute(f"UPDATE {table} SET payload_json = json_set(payload_json, '$.env.TOKEN', ?)", (SECRET,))
    conn.close()
    assert SECRET.encode() in file_bytes(ws)
    plane = ControlPlane(ws)
    try:
        run_id = ws.admit("job")
        assert ws.wait_ended(run_id, plane.process)["state"] == "succeeded"
        assert ws.call("logs", run_id)[1] == SECRET.encode()
        rows = ws.sql("SELECT payload_json FROM tasks UNION ALL SELECT payload_json FROM task_revisions")
        assert rows and all(SECRET not in text and "ql-sealed:v1:" in text for (text,) in rows)
    finally:
        plane.stop()
    assert SECRET.encode() not in file_bytes(ws)  # nor in a freed page


def test_previous_key_files_open_old_values_while_new_ones_are_sealed_under_the_new_key(ws):
    ws.ok("task", "put", "ops", "old", "--env", f"TOKEN={SECRET}", *JOB)
    old = Path(str(ws.db) + ".key")
    new = new_key(ws.root / "new.key")
    plain = ws.settings.read_text()
    ws.settings.write_text(plain + f'[secrets]\nkey_file = "{new}"\n')
    code, _, err = ws.call("task", "put", "ops", "new", "--env", "A=b", *JOB)
    assert code == 6 and "[secrets] key_file" in err  # the old values' key is not loaded
    ws.settings.write_text(plain + f'[secrets]\nkey_file = "{new}"\nprevious_key_files = ["{old}"]\n')
    ws.ok("task", "put", "ops", "new", "--env", "A=b", *JOB)
    ids = {text.split("ql-sealed:v1:")[1].split(":")[0]: task
           for task, text in ws.sql("SELECT task_id, payload_json FROM tasks")}
    assert len(ids) == 2 and sorted(ids.values()) == ["new", "old"]  # one value under each key
    assert run_log(ws, "old") == SECRET.encode()
