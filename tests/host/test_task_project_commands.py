"""`task list`, `task delete`, `project delete` and the `task put` warning, through the CLI on
a real store (edge here; the cluster's PostgreSQL in tests/cluster/test_cluster_task_commands.py,
which runs the same sequence), and the files a demo leaves in a checkout being ignored by git."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.cliserver import run_qinglong

REPO = Path(__file__).resolve().parents[2]


def cli_runner(cwd: Path, settings: Path | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    if settings is not None:
        env["QINGLONG_SETTINGS"] = str(settings)

    def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
        result = run_qinglong(list(args), cwd=cwd, env=env, timeout=120)
        assert result.returncode == code, (args, result.returncode, result.stderr)
        assert "Traceback" not in result.stderr
        return result

    return cli


def exercise_task_and_project_commands(cli) -> None:
    """The same sequence on every profile's store: what each command shows and refuses."""
    cli("project", "create", "ops")
    cli("project", "create", "web")
    put = cli("task", "put", "ops", "backup", "--env", "TOKEN=s3cret", "--", "/bin/sh", "-c", "echo hi")
    assert put.stderr == ""  # /bin/sh exists: no warning
    cli("task", "put", "ops", "report", "--", "true")
    cli("task", "put", "web", "deploy", "--", "true")
    listed = json.loads(cli("task", "list", "--json").stdout)
    assert [(t["project_id"], t["task_id"]) for t in listed] == [("ops", "backup"), ("ops", "report"),
                                                                  ("web", "deploy")]
    assert listed[0]["command"] == ["/bin/sh", "-c", "echo hi"]
    assert listed[0]["task_revision"] == 1 and listed[0]["content_digest"].startswith("sha256:")
    assert set(listed[0]) == {"project_id", "task_id", "task_revision", "content_digest", "command"}
    table = cli("task", "list", "ops").stdout
    assert "backup" in table and "deploy" not in table and "s3cret" not in table
    assert cli("task", "list", "missing", code=3).stderr.startswith("qinglong: error: project 'missing' does not exist")

    cli("trigger", "add", "ops", "nightly", "--task", "report", "--cron", "0 3 * * *")
    refused = cli("task", "delete", "ops", "report", code=3)
    assert "'nightly'" in refused.stderr
    assert cli("task", "delete", "ops", "backup").stdout == "deleted task ops/backup (its Runs stay)\n"
    assert [t["task_id"] for t in json.loads(cli("task", "list", "ops", "--json").stdout)] == ["report"]
    cli("task", "show", "ops", "backup", code=3)
    cli("task", "delete", "ops", "backup", code=3)

    dry = json.loads(cli("project", "delete", "ops", "--dry-run", "--json").stdout)
    assert [(c["kind"], c["id"]) for c in dry["deleted"]] == [("trigger", "nightly"), ("task", "report"),
                                                              ("project", "ops")]
    assert [t["task_id"] for t in json.loads(cli("task", "list", "ops", "--json").stdout)] == ["report"]
    assert "deleted project ops and trigger nightly, task report" in cli("project", "delete", "ops").stdout
    assert [p["project_id"] for p in json.loads(cli("project", "list", "--json").stdout)] == ["web"]
    assert json.loads(cli("trigger", "list", "--json").stdout) == []
    cli("project", "delete", "ops", code=3)
    cli("project", "create", "ops")  # created again: empty
    assert [t["task_id"] for t in json.loads(cli("task", "list", "--json").stdout)] == ["deploy"]


def test_task_list_and_deletes_on_the_edge_store(tmp_path):
    """Without them a new user can publish but never see or remove what was published except by
    editing the database; a delete that ignored a trigger still running the task would leave
    the trigger admitting Runs of nothing."""
    exercise_task_and_project_commands(cli_runner(tmp_path))


def test_task_put_warns_on_stderr_about_a_program_missing_here_and_still_publishes(tmp_path):
    """A misspelled program published without a word fails only at its first Run, hours later;
    refusing it would break publishing a task that runs on another machine (a cluster worker).
    The warning goes to stderr, so scripts reading stdout and the exit code see no change."""
    cli = cli_runner(tmp_path)
    cli("project", "create", "ops")
    put = cli("task", "put", "ops", "backup", "--", "/usr/local/bin/no-such-backup.sh", "--verbose")
    assert put.stdout.startswith("task ops/backup at revision 1 ")
    assert put.stderr.startswith("qinglong: warning: the program '/usr/local/bin/no-such-backup.sh' does not "
                                 "exist"), put.stderr
    named = cli("task", "put", "ops", "other", "--", "no-such-program-anywhere")
    assert "'no-such-program-anywhere' is not on the job's PATH" in named.stderr
    quiet = cli("task", "put", "ops", "fine", "--", "sh", "-c", "true")
    assert quiet.stderr == ""
    assert [t["task_id"] for t in json.loads(cli("task", "list", "--json").stdout)] == ["backup", "fine", "other"]


def test_the_files_a_demo_leaves_in_a_checkout_are_ignored_by_git(tmp_path):
    """`qinglong demo` in a checkout leaves qinglong.db, its lock and its logs directory: unless
    ignored, `git status` shows them and a careless `git add -A` commits a database and job
    output."""
    names = ["qinglong.db", "qinglong.db-wal", "qinglong.db.lock", "qinglong.db.logs/a/log",
             "qinglong-worker-logs/a/log", "deploy/kubernetes/secrets/runtime_dsn"]
    result = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", *names], capture_output=True,
                            text=True, timeout=60)
    assert sorted(result.stdout.split()) == sorted(names), result.stdout + result.stderr
    kept = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index",
                           "deploy/kubernetes/secrets/README.md"], capture_output=True, text=True, timeout=60)
    assert kept.returncode == 1, "the Secrets' README must not be ignored"
