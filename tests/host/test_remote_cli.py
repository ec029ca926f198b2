"""``qinglong --api URL``: the read and write commands through a real ``qinglong api`` over TCP,
with the same output and exit codes as against the store."""

from __future__ import annotations

import json
import os

from api_helpers import ApiProcessPlane, make_token
from host_helpers import run_cli, wait_until
from http_helpers import Plane, child_env, cli, write_settings


def test_the_remote_cli_prints_what_the_local_cli_prints_with_the_same_exit_codes(tmp_path):
    """An operator managing from a laptop who gets other shapes or other exit codes than on the
    host breaks every script that moves; a token read from the command line would sit in the
    shell history and in `ps` for everyone on the laptop."""
    settings = write_settings(tmp_path, http='listen = "127.0.0.1:0"\nrequest_timeout_ms = 60000')
    cli(settings, "project", "create", "ops")
    write = make_token(settings, "laptop", "write")
    api = ApiProcessPlane(settings)
    runner = Plane(write_settings(tmp_path, http=""), http=False)  # executes the Runs on the host
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    token_file = laptop / "token"
    token_file.write_text(write + "\n")
    env = child_env(QINGLONG_API_URL=f"http://127.0.0.1:{api.port}")

    def remote(*args: str, token: bool = True):
        extra = ["--token-file", str(token_file)] if token else []
        return run_cli([*extra, *args], cwd=laptop, env=env)

    def local(*args: str):
        return run_cli(["--settings", str(settings), *args], cwd=tmp_path, env=child_env())

    try:
        done = remote("task", "put", "ops", "hello", "--env", "TOKEN=s3cret", "--", "sh", "-c", "echo hi from $TOKEN")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("task ops/hello at revision 1")
        done = remote("trigger", "add", "ops", "nightly", "--task", "hello", "--cron", "30 2 * * *")
        assert done.returncode == 0, done.stderr
        for args in (("project", "list", "--json"), ("task", "list", "ops", "--json"),
                     ("task", "show", "ops", "hello", "--json"), ("trigger", "list", "ops", "--json"),
                     ("task", "show", "ops", "hello"), ("trigger", "list", "ops")):
            there, here = remote(*args), local(*args)
            assert (there.returncode, there.stdout) == (here.returncode, here.stdout), args
        assert "s3cret" not in remote("task", "show", "ops", "hello", "--json").stdout
        made = remote("task", "run", "ops", "hello", "--idempotency-key", "laptop-1", "--json")
        assert made.returncode == 0, made.stderr
        run_id = json.loads(made.stdout)["run_id"]
        again = remote("task", "run", "ops", "hello", "--idempotency-key", "laptop-1", "--json")
        assert json.loads(again.stdout) == {"run_id": run_id, "created": False, "idempotency_key": "laptop-1"}
        wait_until(lambda: json.loads(remote("runs", "show", run_id, "--json").stdout)["state"] == "succeeded",
                   "the Run to end", timeout=60, every=0.2)
        for args in (("runs", "show", run_id, "--json"), ("runs", "--json"), ("runs",), ("logs", run_id)):
            there, here = remote(*args), local(*args)
            assert (there.returncode, there.stdout) == (here.returncode, here.stdout), args
        assert remote("logs", run_id).stdout == "hi from s3cret\n"
        for args in (("task", "show", "ops", "nope"), ("runs", "show", "no-such-run"),
                     ("project", "create", "ops"), ("task", "put", "ops", "bad", "--timeout", "0s", "--", "x")):
            there, here = remote(*args), local(*args)
            assert there.returncode == here.returncode and there.returncode in (3, 4), (args, there.stderr)
        unauthorized = remote("project", "list", token=False)
        assert unauthorized.returncode == 3 and "QINGLONG_API_TOKEN" in unauthorized.stderr
        token_file.write_text("qlt_not-a-token\n")
        refused = remote("project", "list")
        assert refused.returncode == 3 and "401" in refused.stderr and "qlt_not-a-token" not in refused.stderr
        gone = run_cli(["project", "list", "--token-file", str(token_file)], cwd=laptop,
                       env=child_env(QINGLONG_API_URL="http://127.0.0.1:9"))
        assert gone.returncode == 5 and "cannot reach the API" in gone.stderr
        assert not os.path.exists(laptop / "qinglong.db")  # nothing local was made
    finally:
        runner.stop()
        api.stop()


def test_a_trigger_added_through_the_api_keeps_its_jitter(tmp_path):
    """`trigger add --jitter 5m` through `--api` that dropped the jitter would start every
    machine's job on the same second, the stampede the option exists to spread, while the
    command said nothing was lost."""
    from api_helpers import api_settings

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "job", "--", "true")
    plane = Plane(settings)
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    (laptop / "token").write_text(make_token(settings, "laptop", "write") + "\n")
    env = child_env(QINGLONG_API_URL=f"http://127.0.0.1:{plane.port}")
    try:
        done = run_cli(["--token-file", str(laptop / "token"), "trigger", "add", "ops", "spread", "--task", "job",
                        "--cron", "0 * * * *", "--jitter", "5m"], cwd=laptop, env=env)
        assert done.returncode == 0, done.stderr
        # an update that leaves the jitter out keeps it, as on the host
        done = run_cli(["--token-file", str(laptop / "token"), "trigger", "update", "ops", "spread",
                        "--cron", "30 * * * *"], cwd=laptop, env=env)
        assert done.returncode == 0, done.stderr
    finally:
        plane.stop()
    (listed,) = json.loads(cli(settings, "trigger", "list", "ops", "--json"))
    assert (listed["spec"]["expression"], listed["jitter_ms"]) == ("30 * * * *", 300_000), listed
