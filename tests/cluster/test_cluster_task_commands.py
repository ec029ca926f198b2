"""`task list`, `task delete` and `project delete` on the cluster's PostgreSQL: the sequence of
tests/host/test_task_project_commands.py, through the CLI with the admin and runtime roles."""

from __future__ import annotations

from pathlib import Path

from tests.host.test_task_project_commands import cli_runner, exercise_task_and_project_commands


def test_task_list_and_deletes_on_the_cluster_store(cluster, tmp_path: Path):
    """The commands must behave alike on every profile: a delete that worked on edge but not on
    the cluster (or listed another shape) would make scripts and docs profile-specific."""
    settings = tmp_path / "cluster.toml"
    settings.write_text('profile = "cluster"\n[backend]\n'
                        f'runtime_dsn = "{cluster.dsn("qinglong_runtime")}"\n'
                        f'admin_dsn = "{cluster.dsn("qinglong_admin")}"\n')
    exercise_task_and_project_commands(cli_runner(tmp_path, settings))
