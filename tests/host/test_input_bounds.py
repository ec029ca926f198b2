"""Every name or free text a user can store has an upper bound, checked in the contracts and
refused the same way by the CLI, an ``apply`` file and the management API (over real HTTP, and
the remote CLI through it): exit code 3 or ``422``, one message naming the field, the limit and
the length given, and the store (every row of every table) unchanged."""

from __future__ import annotations

import re

import pytest

from api_helpers import Client, Plane, api_settings, child_env, cli, make_token, store_dump
from host_helpers import run_cli

LONG = 5000

#: ``task put`` / ``project create`` arguments over a bound, and what the refusal must say.
CLI_OVERLONG = [
    (("project", "create", "p2", "--name", "n" * LONG), "invalid project name", "at most 200 characters"),
    (("task", "put", "ops", "x", "--executor", "e" * LONG, "--", "true"), "executor:", "1-64 ASCII letters"),
    (("task", "put", "ops", "x", "--env", "A" * 300 + "=v", "--", "true"), "env: variable name",
     "at most 128 characters"),
    (("task", "put", "ops", "x", "--payload", '{"description": "%s"}' % ("d" * LONG), "--", "true"),
     "description:", "at most 4096 characters"),
    (("task", "run", "ops", "backup", "--idempotency-key", "k" * LONG), "--idempotency-key:",
     "at most 200 characters"),
]


def _length_given(message: str) -> int:
    cut = re.search(r"'\.\.\. \((\d+) characters\)|got (\d+)", message)
    assert cut is not None, message
    return int(cut.group(1) or cut.group(2))


@pytest.fixture
def edge_store(tmp_path):
    workdir = tmp_path / "edge"
    workdir.mkdir()
    for args in (("project", "create", "ops"), ("task", "put", "ops", "backup", "--", "true")):
        assert run_cli(list(args), cwd=workdir).returncode == 0, args
    return workdir


@pytest.mark.parametrize("args, field, limit", CLI_OVERLONG, ids=["project-name", "executor", "env-name",
                                                                  "description", "idempotency-key"])
def test_an_overlong_name_or_text_is_refused_by_the_cli_and_writes_nothing(edge_store, args, field, limit):
    """A 5,000-character executor name was stored and printed whole by ``task show``, a
    5,000-character project name was accepted (an ``apply`` file refused it over 200): text of
    any length filled the store, every listing and every log line naming it. Each is refused
    with its field, its limit and the length given, and nothing is written."""
    before = store_dump(edge_store / "qinglong.db")
    result = run_cli(list(args), cwd=edge_store)
    assert result.returncode == 3, (result.returncode, result.stderr[-600:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qinglong: "), result.stderr
    message = lines[0]
    assert len(message) < 500, message
    assert field in message and limit in message, message
    assert _length_given(message) >= 300, message
    assert store_dump(edge_store / "qinglong.db") == before


def test_a_token_limited_to_more_projects_than_the_bound_is_refused(edge_store):
    """A token could be limited to any number of projects (one ``--project`` per argument), each
    kept in its row and read at every request. Over 256 it is refused with the count given, and
    no token is made."""
    before = store_dump(edge_store / "qinglong.db")
    args = ["token", "create", "wide", "--scope", "read"]
    for n in range(300):
        args += ["--project", f"p{n}"]
    result = run_cli(args, cwd=edge_store)
    assert result.returncode == 3, (result.returncode, result.stderr[-600:])
    assert "token projects: expected at most 256 projects, got 300" in result.stderr, result.stderr
    assert store_dump(edge_store / "qinglong.db") == before


@pytest.mark.parametrize("executor", ["a b", "-x", "gpu\tpool", "ex/ec"])
def test_an_executor_name_must_be_shaped_like_an_identifier(edge_store, executor):
    """An executor name of any printable text was stored (spaces, a leading dash, a slash): no
    executor plugin can carry such a name, so the task could never run anywhere. Refused, and
    nothing is written."""
    before = store_dump(edge_store / "qinglong.db")
    result = run_cli(["task", "put", "ops", "x", f"--executor={executor}", "--", "true"], cwd=edge_store)
    assert result.returncode == 3, result.stderr
    assert "executor: expected the name of an executor" in result.stderr, result.stderr
    assert store_dump(edge_store / "qinglong.db") == before


def test_an_executor_that_does_not_exist_here_is_still_published(edge_store):
    """An executor is checked for its shape, never for its existence: a task may name an
    executor that only the machine where it runs offers (a cluster worker's plugin); refusing
    it would make such a task impossible to publish."""
    result = run_cli(["task", "put", "ops", "x", "--executor", "acme_gpu-pool.v2", "--", "true"], cwd=edge_store)
    assert result.returncode == 0, result.stderr
    shown = run_cli(["task", "show", "ops", "x", "--json"], cwd=edge_store)
    assert '"acme_gpu-pool.v2"' in shown.stdout, shown.stdout


def test_an_apply_file_with_an_overlong_value_names_its_line_and_writes_nothing(edge_store):
    """The same bounds hold in an ``apply`` file: each over-long value is refused naming its
    file, line and key, before anything is written."""
    cases = {
        "name": ('name = "%s"\n' % ("n" * LONG), "at most 200 characters"),
        "executor": ('[projects.ops.tasks.x]\ncommand = ["true"]\nexecutor = "%s"\n' % ("e" * LONG),
                     "1-64 ASCII letters"),
        "env": ('[projects.ops.tasks.x]\ncommand = ["true"]\nenv = { %s = "env:HOME" }\n' % ("A" * 300),
                "at most 128 characters"),
        "description": ('[projects.ops.tasks.x]\ncommand = ["true"]\ndescription = "%s"\n' % ("d" * LONG),
                        "at most 4096 characters"),
    }
    before = store_dump(edge_store / "qinglong.db")
    for key, (body, limit) in cases.items():
        path = edge_store / f"{key}.toml"
        path.write_text("version = 1\n[projects.ops]\n" + body)
        result = run_cli(["apply", str(path)], cwd=edge_store)
        assert result.returncode == 3, (key, result.returncode, result.stderr[-600:])
        assert "Traceback" not in result.stderr
        message = result.stderr.strip().splitlines()[-1]
        assert f"{key}.toml" in message and limit in message, (key, message)
        assert re.search(r"line \d", message) or ":3" in message or ":4" in message or ":5" in message, message
        assert len(message) < 600, message
        assert store_dump(edge_store / "qinglong.db") == before, key


def test_the_api_and_the_remote_cli_refuse_an_overlong_value_and_change_nothing(tmp_path):
    """Over real HTTP the API stored what the CLI refuses: a 5,000-character project name, and
    (through ``PUT .../tasks/T``) an executor name or an env variable name of any length. Each
    is ``422 invalid`` with the field, the limit and the length given; the remote CLI exits 3
    with the same words; no row changes, the audit log included."""
    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "job", "--", "true")
    token = make_token(settings, "writer", "admin")
    plane = Plane(settings)
    client = Client(plane.port, token)
    try:
        db = tmp_path / "q.db"
        before = store_dump(db)
        requests = [
            ("POST", "/api/v1/projects", {"project_id": "p2", "name": "n" * LONG}, "at most 200 characters"),
            ("PUT", "/api/v1/projects/ops/tasks/job",
             {"payload": {"command": ["true"], "executor": "e" * LONG}}, "1-64 ASCII letters"),
            ("PUT", "/api/v1/projects/ops/tasks/job",
             {"payload": {"command": ["true"], "executor": "a b"}}, "1-64 ASCII letters"),
            ("PUT", "/api/v1/projects/ops/tasks/job",
             {"payload": {"command": ["true"], "env": {"A" * 300: "v"}}}, "at most 128 characters"),
            ("PUT", "/api/v1/projects/ops/tasks/job",
             {"payload": {"command": ["true"], "description": "d" * LONG}}, "at most 4096 characters"),
        ]
        requests.append(("POST", "/api/v1/tokens", {"name": "wide", "scope": "read",
                                                    "projects": [f"p{n}" for n in range(300)]},
                         "at most 256 projects, got 300"))
        requests.append(("POST", "/api/v1/projects/ops/tasks/job/runs", None, "at most 200 characters"))
        for method, path, body, limit in requests:
            headers = {"Idempotency-Key": "k" * LONG} if path.endswith("/runs") else None
            status, answer, _ = client.request(method, path, body, headers=headers)
            assert status == 422, (path, status, answer)
            assert answer["error"]["code"] == "invalid", answer
            message = answer["error"]["message"]
            if headers is not None:
                assert answer["error"]["field"] == "Idempotency-Key", answer
            assert limit in message and len(message) < 500, message
            if "a b" not in str(body) and "tokens" not in path:
                assert _length_given(message) >= 300, message
        assert store_dump(db) == before

        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        remote = run_cli(["--api", f"http://127.0.0.1:{plane.port}", "--token-file", str(token_file),
                          "project", "create", "p2", "--name", "n" * LONG], cwd=tmp_path, env=child_env())
        assert remote.returncode == 3, (remote.returncode, remote.stderr[-600:])
        assert "at most 200 characters" in remote.stderr and "(5000 characters)" in remote.stderr, remote.stderr
        assert store_dump(db) == before
    finally:
        client.close()
        plane.stop()
