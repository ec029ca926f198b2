"""The execution commands: ``task put`` / ``task show`` / ``task run``, ``runs`` (list, ``show``,
``cancel``) and ``logs``, on real SQLite files.

Most commands run in-process through ``main`` (as a shell would call them, one after another, each
opening the store anew); the jobs are run by a real ``qinglong run`` subprocess, the dispatcher and
executor of the edge profile, so what ``runs`` and ``logs`` show is what a job really did.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from qinglong.contracts.execution import EXECUTION_KEYS
from qinglong.host.cli.main import main

from host_helpers import REPO, StderrLines, wait_until
from tests.support.aio import closing

#: Must appear in no output of any command (it is an env value of a task).
SECRET = "hunter2-d41d8cd98f00b204"

TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "lost"}


class Workspace:
    """A settings file naming a SQLite file in a temporary directory, and the CLI on it."""

    def __init__(self, root: Path, capsys: Any) -> None:
        self.root = root
        self.db = root / "q.db"
        self.settings = root / "settings.toml"
        self.settings.write_text(
            f'[backend]\npath = "{self.db}"\n'
            "[execution]\npoll_ms = 100\ndefault_timeout_ms = 60000\nkill_grace_ms = 1000\n")
        self._capsys = capsys
        self.outputs: list[str] = []  # everything any command printed, for the secret check

    def call(self, *args: str) -> tuple[int, bytes, str]:
        """``qinglong ARGS --settings S`` in-process: exit code, stdout bytes, stderr text."""
        self._capsys.readouterr()
        argv = [*args, "--settings", str(self.settings)] if "--" not in args else [
            "--settings", str(self.settings), *args]
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors, as the real command exits
            code = exc.code
        captured = self._capsys.readouterr()
        out, err = captured.out, captured.err.decode("utf-8", "replace")
        self.outputs.append(out.decode("utf-8", "replace") + err)
        return code, out, err

    def ok(self, *args: str) -> str:
        code, out, err = self.call(*args)
        assert code == 0, (args, code, out, err)
        assert "Traceback" not in err
        return out.decode("utf-8", "replace")

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def dump(self) -> str:
        """Every row of the database, to prove a refused command wrote nothing."""
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return "\n".join(conn.iterdump())
        finally:
            conn.close()

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return conn.execute(query, params).fetchall()
        finally:
            conn.close()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = str(REPO)
        return env

    def subprocess(self, *args: str, **kw: Any) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "qinglong", "--settings", str(self.settings), *args],
                                cwd=self.root, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                **kw)

    def run_state(self, run_id: str) -> str:
        return self.json("runs", "show", run_id)["state"]

    def wait_ended(self, run_id: str, alive: subprocess.Popen | None = None) -> dict:
        wait_until(lambda: self.run_state(run_id) in TERMINAL, f"run {run_id} to end", timeout=60,
                   every=0.1, alive=alive)
        return self.json("runs", "show", run_id)

    def admit(self, task: str, key: str | None = None) -> str:
        args = ["task", "run", "ops", task] + (["--idempotency-key", key] if key else [])
        return self.json(*args)["run_id"]


@pytest.fixture
def ws(tmp_path: Path, capsysbinary: Any) -> Workspace:
    w = Workspace(tmp_path, capsysbinary)
    w.ok("project", "create", "ops")
    return w


class ControlPlane:
    """``qinglong run`` in a subprocess, stopped by SIGTERM at the end."""

    def __init__(self, ws: Workspace) -> None:
        self.process = ws.subprocess("run", text=True)
        self.stderr = StderrLines(self.process.stderr)
        self.stderr.wait_for("lifecycle.admission_open", timeout=60)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@pytest.fixture
def plane(ws: Workspace):
    cp = ControlPlane(ws)
    try:
        yield cp
    finally:
        cp.stop()


def assert_no_secret(ws: Workspace) -> None:
    assert ws.outputs, "no command ran"
    for text in ws.outputs:
        assert SECRET not in text, text


# --------------------------------------------------------------------------- task put / show


def test_task_put_states_every_execution_value_and_show_prints_them_with_env_values_masked(ws):
    """A spec stored without its values would run with whatever default a later profile has (the
    timeout `task show` printed would not be the one in force), and an env value printed by any
    command leaks a secret into terminals, CI logs and support tickets."""
    out = ws.ok("task", "put", "ops", "backup", "--env", f"TOKEN={SECRET}", "--env", "MODE=full",
                "--timeout", "30m", "--concurrency", "forbid", "--retries", "2", "--retry-exit-code", "3",
                "--retry-exit-code", "75", "--idempotent", "--workdir", "/tmp", "--log-limit", "1MiB",
                "--executor", "local_process", "--payload", '{"owner": "ops-team"}',
                "--", "sh", "-c", 'echo "$TOKEN" >/dev/null; echo done')
    digest_prefix = out.split("(")[1].rstrip(")\n")
    (stored,) = ws.sql("SELECT payload_json FROM tasks WHERE task_id = 'backup'")
    payload = json.loads(stored[0])
    assert set(EXECUTION_KEYS) <= set(payload) and payload["owner"] == "ops-team"
    # stored sealed for the job, never shown
    assert set(payload["env"]) == {"TOKEN", "MODE"} and SECRET not in stored[0]
    assert all(value.startswith("ql-sealed:v1:") for value in payload["env"].values())

    shown = ws.json("task", "show", "ops", "backup")
    assert shown["task_revision"] == 1 and shown["content_digest"].startswith(digest_prefix)
    spec = shown["execution"]
    assert spec["command"] == ["sh", "-c", 'echo "$TOKEN" >/dev/null; echo done']
    assert spec["env"] == {"TOKEN": "(set)", "MODE": "(set)"}
    assert shown["payload"]["env"] == {"TOKEN": "(set)", "MODE": "(set)"}
    assert spec["timeout_ms"] == 30 * 60_000 and spec["concurrency"] == {"mode": "forbid"}
    assert spec["retry"]["max_attempts"] == 3 and spec["retry"]["exit_codes"] == [3, 75]
    assert spec["idempotent"] is True and spec["working_dir"] == "/tmp"
    assert spec["log_limit_bytes"] == 1024 * 1024 and spec["executor"] == "local_process"
    text = ws.ok("task", "show", "ops", "backup")
    for expected in ("TOKEN=(set)", "30m (1800000 ms)", "forbid", "up to 3 attempts", "exit codes 3, 75",
                     "1MiB (1048576 bytes)", '"owner": "ops-team"'):
        assert expected in text, text

    # Without options the settings' defaults are stated: [execution] default_timeout_ms = 60000 here.
    ws.ok("task", "put", "ops", "plain", "--", "true")
    plain = ws.json("task", "show", "ops", "plain")["execution"]
    assert plain["timeout_ms"] == 60_000 and plain["log_limit_bytes"] == 4 * 1024 * 1024
    assert plain["retry"]["max_attempts"] == 1 and plain["concurrency"] == {"mode": "allow"}

    # The same spec again is the same revision; every listing that shows payload-like data stays masked.
    ws.ok("task", "put", "ops", "backup", "--env", f"TOKEN={SECRET}", "--env", "MODE=full",
          "--timeout", "30m", "--concurrency", "forbid", "--retries", "2", "--retry-exit-code", "3",
          "--retry-exit-code", "75", "--idempotent", "--workdir", "/tmp", "--log-limit", "1MiB",
          "--executor", "local_process", "--payload", '{"owner": "ops-team"}',
          "--", "sh", "-c", 'echo "$TOKEN" >/dev/null; echo done')
    assert ws.json("task", "show", "ops", "backup")["task_revision"] == 1
    run_id = ws.admit("backup")
    for args in (("runs",), ("runs", "--json"), ("runs", "show", run_id), ("runs", "show", run_id, "--json"),
                 ("logs", run_id), ("trigger", "list", "--json"), ("schedules", "--json")):
        ws.call(*args)
    assert_no_secret(ws)


REFUSALS = [
    (["--timeout", "0s"], "--timeout 0s: expected from 1s to 1d"),
    (["--timeout", "2d"], "--timeout 2d: expected from 1s to 1d"),
    (["--timeout", "soon"], "--timeout: expected a duration such as 500ms"),
    (["--concurrency", "queue", "--max-running", "2"], "--max-running: only with --concurrency allow"),
    (["--max-running", "0"], "--max-running: concurrency.max_running: expected an integer from 1"),
    (["--retries", "-1"], "--retries -1: expected from 0 to 19"),
    (["--retries", "20"], "--retries 20: expected from 0 to 19"),
    (["--retries", "1", "--retry-exit-code", "0"], "--retry-exit-code: retry.exit_codes: expected"),
    (["--retry-exit-code", "3"], "--retry-exit-code: only with --retries N"),
    (["--workdir", "relative/dir"], "--workdir: working_dir: expected an absolute path"),
    (["--log-limit", "5MiB"], "--log-limit 5MiB: over this profile's cap of 4MiB"),
    (["--log-limit", "12XB"], "--log-limit: expected a size such as 512, 64KiB or 4MiB"),
    (["--env", f"NOEQUALS{SECRET}"], "--env: expected NAME=VALUE, but --env number 1 has no ="),
    (["--env", f"1BAD={SECRET}"], "--env: env: expected variable names of letters"),
    (["--env", f"QINGLONG_RUN_ID={SECRET}"], "--env: env.QINGLONG_RUN_ID: names starting with QINGLONG_"),
    (["--env", "A=1", "--env", f"A={SECRET}"], "--env A: given twice"),
    (["--executor", ""], "--executor: executor: expected the name of an executor"),
    (["--timeout", "30m", "--payload", '{"timeout_ms": 5000}'],
     "--timeout and the --payload key 'timeout_ms' both set timeout_ms; give it once"),
    (["--payload", '{"retry": {"max_attempts": 0}}'], "--payload: retry.max_attempts: expected an integer"),
    (["--payload", f'{{"env": {{"A": 1, "B": "{SECRET}"}}}}'], "--payload: env.A: expected a string value"),
]


@pytest.mark.parametrize("options, expected", REFUSALS, ids=[" ".join(o)[:40] for o, _ in REFUSALS])
def test_a_bad_execution_option_is_refused_naming_it_and_writes_nothing(ws, options, expected):
    """A spec refused only at dispatch would fail every Run of the task (or run it with a value the
    user never meant); a refusal that wrote part of it would leave a revision nobody asked for; one
    that echoed an env value would print a secret."""
    ws.ok("task", "put", "ops", "job", "--", "true")
    before = ws.dump()
    code, out, err = ws.call("task", "put", "ops", "job", *options, "--", "echo", "x")
    assert code == 3, (code, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("qinglong: error: "), err
    assert expected in err, err
    assert ws.dump() == before
    assert_no_secret(ws)


def test_execution_options_without_a_command_or_with_a_bad_choice_are_refused(ws):
    """An option with no command to apply to would be dropped in silence; an unknown policy name
    is a usage error (2) like any other bad choice, and neither writes anything."""
    before = ws.dump()
    code, _, err = ws.call("task", "put", "ops", "data", "--payload", '{"a": 1}', "--timeout", "5m")
    assert code == 3 and "--timeout: given without a command" in err, err
    code, _, err = ws.call("task", "put", "ops", "data", "--concurrency", "sometimes", "--", "true")
    assert code == 2 and "argument --concurrency: invalid choice" in err, err
    assert ws.dump() == before


def test_task_show_of_an_unknown_task_is_not_found(ws):
    """A typo must say so (exit 3), not print an empty spec a script would take as the truth."""
    code, out, err = ws.call("task", "show", "ops", "nope")
    assert code == 3 and out == b"" and "task 'nope' does not exist in project 'ops'" in err


# --------------------------------------------------------------------------- task run, runs, cancel


def test_task_run_with_the_same_key_admits_one_run(ws):
    """A retried `task run` (a script re-run after a timeout) must not run the job twice; without a
    key every call is a new Run; an unknown task admits nothing."""
    ws.ok("task", "put", "ops", "job", "--", "true")
    first = ws.json("task", "run", "ops", "job", "--idempotency-key", "deploy-42")
    again = ws.json("task", "run", "ops", "job", "--idempotency-key", "deploy-42")
    assert first["created"] is True and again["created"] is False
    assert again["run_id"] == first["run_id"]
    text = ws.ok("task", "run", "ops", "job", "--idempotency-key", "deploy-42")
    assert f"run {first['run_id']} exists already" in text
    assert [r["idempotency_key"] for r in ws.json("runs")] == ["ql3:manual:v1:deploy-42"]
    ws.ok("task", "run", "ops", "job")
    ws.ok("task", "run", "ops", "job")
    assert len(ws.json("runs")) == 3
    before = ws.dump()
    code, _, err = ws.call("task", "run", "ops", "ghost")
    assert code == 3 and "task 'ghost' does not exist" in err
    assert ws.dump() == before


def test_cancel_of_a_queued_run_ends_it_cancelled_at_once(ws):
    """A queued Run that a cancel left queued would still start its job at the next dispatch."""
    ws.ok("task", "put", "ops", "job", "--", "true")
    run_id = ws.admit("job")
    assert ws.run_state(run_id) == "queued"
    out = ws.ok("runs", "cancel", run_id)
    assert "cancelled (it was queued)" in out
    detail = ws.json("runs", "show", run_id)
    assert detail["state"] == "cancelled"
    (attempt,) = detail["attempts"]
    assert attempt["state"] == "cancelled" and attempt["cancel_reason"] == "operator"
    assert "had already ended: cancelled" in ws.ok("runs", "cancel", run_id)
    assert [r["state"] for r in ws.json("runs", "--state", "cancelled")] == ["cancelled"]
    assert ws.json("runs", "--state", "queued") == []


def test_unknown_run_ids_are_not_found(ws):
    """A mistyped run id must exit 3 with the id named, from every command that takes one."""
    for args in (("runs", "show", "nope"), ("runs", "cancel", "nope"), ("logs", "nope")):
        code, out, err = ws.call(*args)
        assert code == 3 and out == b"", (args, code, out, err)
        assert "run 'nope' does not exist" in err, err


# --------------------------------------------------------------------------- with a running control plane


def test_runs_and_logs_show_what_real_jobs_did(ws, plane):
    """The first question about a scheduler: did my job run, how did it end, what did it print. A
    wrong exit code or a log decoded and re-encoded (binary output, text that is not UTF-8) would
    answer it wrongly; a truncated log that did not say so would look complete."""
    ws.ok("task", "put", "ops", "ok", "--", "sh", "-c", "printf 'one\\ntwo\\nthree\\n'")
    ws.ok("task", "put", "ops", "bad", "--", "sh", "-c", "printf 'oops\\n' >&2; exit 7")
    ws.ok("task", "put", "ops", "bin", "--", "sh", "-c", "printf '\\377\\376\\000raw\\nlast'")
    ws.ok("task", "put", "ops", "big", "--log-limit", "512", "--", "sh", "-c",
          "head -c 2000 /dev/zero | tr '\\000' x; echo")
    runs = {task: ws.admit(task) for task in ("ok", "bad", "bin", "big")}
    details = {task: ws.wait_ended(run_id, plane.process) for task, run_id in runs.items()}

    listed = {r["task_id"]: r for r in ws.json("runs", "--project", "ops")}
    for task, expected_state, expected_exit in (("ok", "succeeded", 0), ("bad", "failed", 7),
                                                ("bin", "succeeded", 0), ("big", "succeeded", 0)):
        row = listed[task]
        assert row["run_id"] == runs[task] and row["state"] == expected_state, row
        assert row["exit_code"] == expected_exit and row["attempts"] == 1, row
        assert isinstance(row["duration_ms"], int) and row["duration_ms"] >= 0, row
        assert isinstance(row["scheduled_for_ms"], int) and row["task_id"] == task
    assert [r["task_id"] for r in ws.json("runs", "--state", "failed")] == ["bad"]
    assert [r["run_id"] for r in ws.json("runs", "--task", "bad")] == [runs["bad"]]
    table = ws.ok("runs")
    assert runs["bad"] in table and "failed" in table

    (bad_attempt,) = details["bad"]["attempts"]
    assert bad_attempt["exit_code"] == 7 and bad_attempt["state"] == "failed"
    assert bad_attempt["started_at_ms"] <= bad_attempt["finished_at_ms"]
    assert bad_attempt["log_bytes"] == len(b"oops\n") and bad_attempt["log_deleted"] is False
    shown = ws.ok("runs", "show", runs["bad"])
    assert "exit 7" in shown and "failed" in shown

    assert ws.call("logs", runs["ok"])[1] == b"one\ntwo\nthree\n"
    assert ws.call("logs", runs["ok"], "--tail", "2")[1] == b"two\nthree\n"
    assert ws.call("logs", runs["ok"], "--tail", "9")[1] == b"one\ntwo\nthree\n"
    assert ws.call("logs", runs["bad"], "--attempt", "1")[1] == b"oops\n"
    assert ws.call("logs", runs["bin"])[1] == b"\xff\xfe\x00raw\nlast"
    assert ws.call("logs", runs["bin"], "--tail", "1")[1] == b"last"
    code, _, err = ws.call("logs", runs["bin"], "--attempt", "2")
    assert code == 3 and "has no attempt 2" in err

    code, out, err = ws.call("logs", runs["big"])
    (big_attempt,) = details["big"]["attempts"]
    assert code == 0 and out == b"x" * 512
    assert big_attempt["log_dropped_bytes"] == 2001 - 512
    assert f"{2001 - 512} more bytes of output were dropped" in err


def test_logs_of_a_deleted_log_report_the_tombstone_and_exit_3(ws, plane):
    """A deleted log read as empty would tell the operator the job printed nothing."""
    ws.ok("task", "put", "ops", "ok", "--", "echo", "gone soon")
    run_id = ws.admit("ok")
    (attempt,) = ws.wait_ended(run_id, plane.process)["attempts"]
    plane.stop()  # retention runs in the control plane; here its two steps are taken by hand

    import asyncio

    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    async def delete_log() -> None:
        backend = build_container(load_settings(ws.settings)).backend()
        await backend.open(create=False)
        async with closing(backend):
            os.unlink(os.path.join(attempt["attempt_dir"], "log"))
            await backend.execution().mark_log_deleted(attempt["attempt_id"], int(time.time() * 1000))

    asyncio.run(delete_log())
    code, out, err = ws.call("logs", run_id)
    assert code == 3 and out == b""
    assert "was deleted by log retention" in err, err
    assert ws.json("runs", "show", run_id)["attempts"][0]["log_deleted"] is True


def test_logs_follow_of_a_real_job_prints_all_its_output_and_ends_with_it(ws, plane):
    """A follow that ended before the job would hide the end of its output; one that never ended
    would hang every script that waits on it."""
    gate = ws.root / "gate"
    ws.ok("task", "put", "ops", "slow", "--", "sh", "-c",
          f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second")
    run_id = ws.admit("slow")
    wait_until(lambda: ws.run_state(run_id) == "running", "the job to start", timeout=60, every=0.1,
               alive=plane.process)
    follower = ws.subprocess("logs", run_id, "--follow")
    try:
        gate.touch()  # (the follow loop's own timing is the next test's: here, the real job's end)
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert out == b"first\nsecond\n"
    assert ws.run_state(run_id) == "succeeded"


def test_logs_follow_prints_bytes_as_they_are_appended_and_ends_when_the_attempt_ends(ws):
    """The follow loop itself, on an Attempt whose log and end are written here through the store
    API and the log file (as the dispatcher and the job's wrapper write them): each appended piece
    must be printed while the Attempt runs (not only at its end), and the follow must end once the
    Attempt has ended and its last bytes are printed."""
    import asyncio

    from qinglong.contracts.execution import Actor, AttemptOutcome, AttemptState, ProcessHandle

    ws.ok("task", "put", "ops", "job", "--", "true")
    run_id = ws.admit("job")
    (attempt,) = ws.json("runs", "show", run_id)["attempts"]
    attempt_dir = ws.root / "attempt"
    attempt_dir.mkdir()
    log = attempt_dir / "log"
    log.write_bytes(b"")

    async def on_store(action) -> Any:
        from qinglong.host.containers import build_container
        from qinglong.host.settings import load_settings

        backend = build_container(load_settings(ws.settings)).backend()
        await backend.open(create=False)
        async with closing(backend):
            return await action(backend.execution())

    now = int(time.time() * 1000)
    handle = ProcessHandle("boot", os.getpid(), os.getpid(), 1)
    assert asyncio.run(on_store(lambda s: s.begin_dispatch(attempt["attempt_id"], str(attempt_dir),
                                                           now + 60_000, now)))
    assert asyncio.run(on_store(lambda s: s.record_started(attempt["attempt_id"], handle, now)))

    follower = ws.subprocess("logs", run_id, "--follow")
    try:
        with log.open("ab") as f:
            for piece in (b"one\n", b"\xff\xfe binary\n"):
                f.write(piece)
                f.flush()
                assert follower.stdout.read(len(piece)) == piece  # printed while still running
        assert follower.poll() is None
        with log.open("ab") as f:
            f.write(b"last words")
        outcome = AttemptOutcome(AttemptState.SUCCEEDED, exit_code=0, ended_at_ms=now + 5,
                                 log_bytes=log.stat().st_size)
        result = asyncio.run(on_store(lambda s: s.record_finished(attempt["attempt_id"], outcome, now + 5,
                                                                  Actor.COMPLETION)))
        assert result.recorded
        rest, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert rest == b"last words"


def test_cancel_of_a_running_run_stops_its_process(ws, plane):
    """A cancel that only changed a row would leave the job running (and holding its slot)."""
    ws.ok("task", "put", "ops", "long", "--", "sleep", "600")
    run_id = ws.admit("long")
    wait_until(lambda: ws.run_state(run_id) == "running", "the job to start", timeout=60, every=0.1,
               alive=plane.process)
    out = ws.ok("runs", "cancel", run_id)
    assert "cancel requested" in out or "cancelled" in out, out
    detail = ws.wait_ended(run_id, plane.process)
    assert detail["state"] == "cancelled", detail
    (attempt,) = detail["attempts"]
    assert attempt["cancel_reason"] == "operator" and attempt["signal"] == signal.SIGTERM, attempt
    pgid = int((Path(attempt["attempt_dir"]) / "pid").read_text().split()[0])

    def group_gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_gone, "the job's process group to be gone", timeout=60, every=0.1)
