"""The cluster profile through the operator's CLI: the same commands as edge, on PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cli(settings: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env["QINGLONG_SETTINGS"] = str(settings)
    return subprocess.run([sys.executable, "-m", "qinglong", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _settings(tmp_path: Path, db, **dsns: str) -> Path:
    path = tmp_path / "cluster.toml"
    lines = ['profile = "cluster"', "[scheduler]", "lease_ms = 5000", "[backend]"]
    lines += [f'{key} = "{value}"' for key, value in dsns.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_operator_migrates_publishes_runs_and_reads_on_postgres(fresh_db, tmp_path):
    """The runtime role alone cannot migrate or publish; each step uses its own role and the
    lifecycle refuses to start on an unmigrated schema rather than admitting into it."""
    settings = _settings(tmp_path, fresh_db, runtime_dsn=fresh_db.dsn("qinglong_runtime"),
                         admin_dsn=fresh_db.dsn("qinglong_admin"), owner_dsn=fresh_db.dsn("qinglong_owner"))

    status = _cli(settings, "db", "status", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert {m["status"] for m in json.loads(status.stdout)} == {"pending"}

    refused = _cli(settings, "run", "--for-seconds", "1", cwd=tmp_path)
    assert refused.returncode == 4
    assert "qinglong: not ready:" in refused.stderr
    assert "lifecycle.scheduler_started" not in refused.stderr
    assert "admission" not in refused.stderr

    assert _cli(settings, "db", "migrate", cwd=tmp_path).returncode == 0
    assert {m["status"] for m in json.loads(_cli(settings, "db", "status", "--json", cwd=tmp_path).stdout)} == {"applied"}

    for args in (("project", "create", "ops"), ("task", "put", "ops", "backup", "--command", "true"),
                 ("trigger", "add", "ops", "tick", "--task", "backup", "--cron", "* * * * * *")):
        result = _cli(settings, *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr

    bad = _cli(settings, "trigger", "add", "ops", "bad", "--task", "backup", "--cron", "* * *", cwd=tmp_path)
    assert bad.returncode == 3 and "has 3 fields" in bad.stderr

    run = _cli(settings, "run", "--for-seconds", "3.3", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    runs = json.loads(_cli(settings, "runs", "--json", cwd=tmp_path).stdout)
    assert len(runs) >= 2
    assert len({r["idempotency_key"] for r in runs}) == len(runs)
    assert all(0 <= r["lag_ms"] < 1500 for r in runs)
    assert fresh_db.count("run_events") == 2 * len(runs)
    assert fresh_db.count("attempts") == len(runs)
    assert [t["trigger_id"] for t in json.loads(_cli(settings, "trigger", "list", "--json", cwd=tmp_path).stdout)] == ["tick", ]

    shown = _cli(settings, "config", "show", cwd=tmp_path)
    for role in ("owner", "admin", "runtime"):
        assert f"{role}-secret" not in shown.stdout + shown.stderr + run.stderr + refused.stderr


def test_missing_admin_dsn_is_named_when_publishing(fresh_db, tmp_path):
    settings = _settings(tmp_path, fresh_db, runtime_dsn=fresh_db.dsn("qinglong_runtime"),
                         owner_dsn=fresh_db.dsn("qinglong_owner"))
    assert _cli(settings, "db", "migrate", cwd=tmp_path).returncode == 0
    result = _cli(settings, "project", "create", "ops", cwd=tmp_path)
    assert result.returncode == 3
    assert "admin_dsn" in result.stderr
    assert "Traceback" not in result.stderr
