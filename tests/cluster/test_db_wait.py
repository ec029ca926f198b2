"""``qinglong db wait``: the init container of the replicas waits, without exiting, until the
migration Job has applied the release's migrations, then lets the replica start; a schema that
never comes ends the wait at its bound with the readiness check's own exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _env(settings: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env["QINGLONG_SETTINGS"] = str(settings)
    return env


def _settings(tmp_path: Path, name: str, **dsns: str) -> Path:
    path = tmp_path / name
    lines = ['profile = "cluster"', "[backend]"] + [f'{key} = "{value}"' for key, value in dsns.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_db_wait_holds_until_the_migrations_are_applied_then_exits_0(fresh_db, tmp_path):
    """Without it the replicas, applied together with the migration Job, exit 4 on the pending
    schema and crash-loop (with a growing back-off that delays them long after the Job ended);
    a wait that returned early would start them into that same exit 4, and one that printed the
    DSN would leak the runtime role's password into the pod's log."""
    runtime = _settings(tmp_path, "runtime.toml", runtime_dsn=fresh_db.dsn("qinglong_runtime"))
    owner = _settings(tmp_path, "owner.toml", runtime_dsn=fresh_db.dsn("qinglong_runtime"),
                      owner_dsn=fresh_db.dsn("qinglong_owner"))
    waiter = subprocess.Popen([sys.executable, "-m", "qinglong", "db", "wait", "--timeout", "10m",
                               "--interval", "200ms"], cwd=tmp_path, env=_env(runtime),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the first line on stderr is written once the first check found the schema not ready
        first = waiter.stderr.readline()
        assert first.startswith("qinglong: waiting: "), first
        assert "not installed" in first or "pending" in first, first
        assert waiter.poll() is None, "db wait exited instead of waiting"
        migrated = subprocess.run([sys.executable, "-m", "qinglong", "db", "migrate"], cwd=tmp_path,
                                  env=_env(owner), capture_output=True, text=True, timeout=300)
        assert migrated.returncode == 0, migrated.stderr
        out, err = waiter.communicate(timeout=300)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 0, first + err
    assert out == "ready\n"
    assert "Traceback" not in first + err
    from tests.support.pg import ROLE_PASSWORDS

    assert ROLE_PASSWORDS["qinglong_runtime"] not in first + err


def test_db_wait_gives_up_at_its_bound_with_the_readiness_exit_code(fresh_db, tmp_path):
    """An init container that waited forever on a database nobody migrates would hide the
    missing Job behind a pod stuck in Init; at the bound it exits 4 (schema not ready), as the
    replica itself would, naming why."""
    runtime = _settings(tmp_path, "runtime.toml", runtime_dsn=fresh_db.dsn("qinglong_runtime"))
    result = subprocess.run([sys.executable, "-m", "qinglong", "db", "wait", "--timeout", "1s",
                             "--interval", "200ms"], cwd=tmp_path, env=_env(runtime), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 4, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines()[0].startswith("qinglong: waiting: ")
    assert result.stderr.splitlines()[-1].startswith("qinglong: not ready: ")
    assert "Traceback" not in result.stderr


def test_db_wait_ends_at_once_on_a_refused_login(fresh_db, tmp_path):
    """A wrong password does not change until the settings do: a wait that took it for an outage
    would hold the init container for its whole bound (here 10 minutes) before saying what is
    wrong. It exits 5 at once, by the rule ``qinglong run`` waits by at start, naming the user
    and never the password given."""
    from tests.support.pg import ROLE_PASSWORDS

    wrong = "not-the-password-51c9"
    dsn = fresh_db.dsn("qinglong_runtime").replace(ROLE_PASSWORDS["qinglong_runtime"], wrong)
    runtime = _settings(tmp_path, "runtime.toml", runtime_dsn=dsn)
    result = subprocess.run([sys.executable, "-m", "qinglong", "db", "wait", "--timeout", "10m",
                             "--interval", "200ms"], cwd=tmp_path, env=_env(runtime), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 5, result.stderr
    assert "qinglong: waiting: " not in result.stderr
    assert "qinglong_runtime" in result.stderr
    assert wrong not in result.stderr and "Traceback" not in result.stderr
