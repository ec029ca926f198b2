"""``qinglong token`` and ``qinglong audit`` on a real SQLite file through the real command line."""

from __future__ import annotations

import json
import sqlite3

from host_helpers import run_cli
from http_helpers import child_env, write_settings


def _cli(settings, *args):
    return run_cli(["--settings", str(settings), *args], cwd=settings.parent, env=child_env())


def test_a_token_secret_is_printed_once_and_only_its_hash_is_stored(tmp_path):
    """A secret kept in the database file (or shown again by `token list`) is stolen with any copy of
    the file or any terminal log; a token made or revoked without an audit entry cannot be traced."""
    settings = write_settings(tmp_path, http="")
    assert _cli(settings, "project", "create", "ops").returncode == 0
    made = _cli(settings, "token", "create", "deploy-bot", "--scope", "write", "--project", "ops",
                "--expires", "30d")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("qlt_") and len(secret) >= 40 and secret not in made.stderr
    raw = (tmp_path / "q.db").read_bytes()
    wal = tmp_path / "q.db-wal"
    assert secret.encode() not in raw + (wal.read_bytes() if wal.exists() else b"")
    listed = _cli(settings, "token", "list", "--json")
    assert listed.returncode == 0 and secret not in listed.stdout
    (token,) = json.loads(listed.stdout)
    assert (token["name"], token["scope"], token["projects"], token["state"]) == ("deploy-bot", "write", ["ops"], "active")
    twice = _cli(settings, "token", "create", "deploy-bot", "--scope", "read")
    assert twice.returncode == 3 and "exists already" in twice.stderr
    bad = _cli(settings, "token", "create", "x", "--scope", "read", "--expires", "soon")
    assert bad.returncode == 3 and "--expires" in bad.stderr
    assert _cli(settings, "token", "revoke", "deploy-bot").returncode == 0
    assert _cli(settings, "token", "revoke", "deploy-bot").returncode == 3
    audit = _cli(settings, "audit", "--json")
    entries = json.loads(audit.stdout)
    assert [(e["action"], e["object"], e["actor"], e["result"]) for e in entries] == [
        ("token.revoke", "deploy-bot", "cli", "ok"), ("token.create", "deploy-bot", "cli", "ok")]
    assert secret not in audit.stdout
    with sqlite3.connect(tmp_path / "q.db") as conn:
        assert conn.execute("SELECT count(*) FROM api_tokens WHERE revoked_at_ms IS NOT NULL").fetchone() == (1,)
