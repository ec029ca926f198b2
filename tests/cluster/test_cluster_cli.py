"""The cluster profile through the operator's CLI: the same commands as edge, on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.cliserver import run_qinglong

REPO = Path(__file__).resolve().parents[2]


def _cli(settings: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env["QINGLONG_SETTINGS"] = str(settings)
    return run_qinglong(list(args), cwd=cwd, env=env, timeout=120)


def _run_until_two_runs(settings: Path, db, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``qinglong run`` until the database holds two Runs, then SIGTERM: a stop on a condition, not
    after a fixed time, so a loaded machine that starts slowly still gets its two Runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env["QINGLONG_SETTINGS"] = str(settings)
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "qinglong", "run", "--for-seconds", "600"], cwd=cwd,
                                env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            deadline = time.monotonic() + timeout
            while db.count("runs") < 2:
                assert proc.poll() is None, f"run exited ({proc.returncode}) before two Runs"
                assert time.monotonic() < deadline, f"no two Runs within {timeout:.0f} s"
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            proc.kill() if proc.poll() is None else None
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, "", err.read())


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

    run = _run_until_two_runs(settings, fresh_db, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    # every Run the store holds (a loaded machine admits many more than two before the stop
    # lands; `runs` shows 20 unless told)
    stored = fresh_db.count("runs")
    runs = json.loads(_cli(settings, "runs", "--json", "--limit", str(stored), cwd=tmp_path).stdout)
    assert len(runs) == stored >= 2, (len(runs), stored)
    keys = [r["idempotency_key"] for r in runs]
    assert len(set(keys)) == len(keys), keys
    assert all(k == f"ql3:cron:v1:tick:1:{r['scheduled_for_ms']}" for k, r in zip(keys, runs)), keys
    slots = sorted(r["scheduled_for_ms"] for r in runs)
    assert slots == list(range(slots[0], slots[-1] + 1, 1000)), slots  # no occurrence lost, none twice
    # never early, never older than the misfire grace (60 s default); how late within it is the machine's
    assert all(0 <= r["lag_ms"] <= 60_000 for r in runs), [r["lag_ms"] for r in runs]
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
