"""The cluster's CLI refuses a name or text over its bound, on real PostgreSQL (both builds):
``project create``, ``task put`` and ``worker register`` name the field, the limit and the value
(cut to 80 characters with its length) or the count given, and write nothing."""

from __future__ import annotations

import pytest

from tests.gateway.helpers import cli, plane_settings

LONG = "w" * 5000
#: Every table a refused publish or registration could have written.
TABLES = ("projects", "tasks", "task_revisions", "execution_revisions", "audit_log", "worker_registrations",
          "worker_sessions")


def whole_dump(cluster) -> dict[str, list]:
    return {table: cluster.sql(f"SELECT * FROM qinglong.{table} ORDER BY 1") for table in TABLES}


@pytest.mark.parametrize("args, expected", [
    (("project", "create", "p2", "--name", "n" * 5000), "at most 200 characters"),
    (("task", "put", "ops", "x", "--executor", "e" * 5000, "--", "true"), "executor: expected the name"),
    (("task", "put", "ops", "x", "--env", "A" * 300 + "=v", "--", "true"), "at most 128 characters"),
], ids=["project-name", "executor", "env-name"])
def test_the_cluster_cli_refuses_an_overlong_name_and_publishes_nothing(cluster, tmp_path, args, expected):
    """The cluster's publisher stored a project name of any length and (through ``task put``) an
    executor name of any length, as the edge's did. Refused with exit code 3, naming the limit
    and the length given; no row of the store changes."""
    settings = plane_settings(cluster, tmp_path)
    cli(settings, "project", "create", "ops")
    before = whole_dump(cluster)
    done = cli(settings, *args, check=False)
    assert done.returncode == 3, (done.returncode, done.stderr[-600:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and len(lines[0]) < 500, done.stderr
    assert "characters)" in lines[0], lines[0]
    assert whole_dump(cluster) == before


@pytest.mark.parametrize("args, expected", [
    (("worker", "register", LONG), "worker id: expected 1-200 characters"),
    (("worker", "register", "w1", "--label", "l" * 300), "labels: expected at most 32"),
    (("worker", "register", "w1", *[a for n in range(300) for a in ("--project", f"p{n}")]),
     "projects: expected at most 256 projects, got 300"),
], ids=["worker-id", "label", "projects"])
def test_an_overlong_registration_is_refused_and_registers_nothing(cluster, tmp_path, args, expected):
    """A worker registration bound to 300 projects was stored (a row every gateway call reads),
    and a refused id or label was not quoted, so the operator could not see which value was
    wrong. Each is refused with exit code 3, in one line naming the limit and the value (cut to
    80 characters with its length) or the count given; no registration is written."""
    settings = plane_settings(cluster, tmp_path)
    before = whole_dump(cluster)
    done = cli(settings, *args, check=False)
    assert done.returncode == 3, (done.returncode, done.stderr[-600:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qinglong: "), done.stderr
    assert expected in lines[0] and len(lines[0]) < 500, lines[0]
    if args[2] == LONG:
        assert "(5000 characters)" in lines[0], lines[0]
    if "--label" in args:
        assert "(300 characters)" in lines[0], lines[0]
    assert whole_dump(cluster) == before
