"""`task list`, `task delete` and `project delete` on the cluster's PostgreSQL: the sequence of
tests/host/test_task_project_commands.py, through the CLI with the admin and runtime roles. One
server build is enough here (the publisher's SQL is covered on both by the conformance suite);
the sequence is many CLI processes, so it runs once."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from tests.host.test_task_project_commands import cli_runner, exercise_task_and_project_commands
from tests.support.pg import ROLE_PASSWORDS, create_database, create_roles, start_server


def test_task_list_and_deletes_on_the_cluster_store(tmp_path: Path):
    """The commands must behave alike on every profile: a delete that worked on edge but not on
    the cluster (or listed another shape) would make scripts and docs profile-specific."""
    server = start_server("pg18")
    try:
        create_roles(server)
        create_database(server, "qinglong")

        def dsn(role: str) -> str:
            return server.dsn(role, ROLE_PASSWORDS[role], "qinglong")

        settings = tmp_path / "cluster.toml"
        key = tmp_path / "secrets.key"  # a cluster has no default key: env values need one
        key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
        settings.write_text('profile = "cluster"\n[backend]\n'
                            f'runtime_dsn = "{dsn("qinglong_runtime")}"\n'
                            f'admin_dsn = "{dsn("qinglong_admin")}"\n'
                            f'owner_dsn = "{dsn("qinglong_owner")}"\n'
                            f'[secrets]\nkey_file = "{key}"\n')
        cli = cli_runner(tmp_path, settings)
        cli("db", "migrate")
        exercise_task_and_project_commands(cli)
    finally:
        server.destroy()
