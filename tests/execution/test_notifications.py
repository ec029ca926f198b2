"""Notifications from a real ``qinglong run`` (edge): a failed Run's signed webhook with its
exit code, duration and log tail (env values redacted), redelivery with the same id after a
SIGKILL during a send, one event per Run across a SIGKILL during completions."""

from __future__ import annotations

import json
import time

from qinglong.plugins.notify.webhook import verify

from tests.execution.execution_helpers import TERMINAL, Workspace, wait_until
from devtools.receiver import Receiver

SECRET = "whsec-0123456789abcdef"
ENV_VALUE = "tok-9f8e7d6c5b4a"


def workspace(tmp_path, receiver: Receiver, **notifications) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    values = {"poll_ms": 50, "default": "always", "lease_ms": 1000, "backoff_ms": 100,
              **notifications}
    lines = ["[notifications]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    lines += ["[notifications.channels.hook]", 'kind = "webhook"',
              f'url = "{receiver.url}/hook"', 'secret_env = "HOOK_SECRET"']
    ws.settings.write_text(ws.settings.read_text() + "\n".join(lines) + "\n")
    return ws


def env_with_secret(ws: Workspace):
    env = ws.env()
    env["HOOK_SECRET"] = SECRET
    return env


def test_a_failed_run_reaches_the_webhook_signed_with_its_outcome_and_no_secret(tmp_path, monkeypatch):
    """The message must prove its origin (a signature over timestamp and body), say what failed
    (task, Run, state, exit code, duration, the log's last lines) and carry no env value or
    channel secret, neither in the body nor in the control plane's output."""
    receiver = Receiver()
    ws = workspace(tmp_path, receiver)
    monkeypatch.setattr(ws, "env", lambda env=ws.env: {**env(), "HOOK_SECRET": SECRET})
    try:
        ws.cli("project", "create", "ops")
        ws.cli("task", "put", "ops", "backup", "--env", f"API_TOKEN={ENV_VALUE}", "--",
               "sh", "-c", 'echo "start"; echo "using $API_TOKEN"; echo "disk full" >&2; exit 3')
        run_id = ws.cli_json("task", "run", "ops", "backup")["run_id"]
        plane = ws.start("run")
        try:
            [(path, headers, body)] = receiver.wait_for(1)
        finally:
            assert plane.terminate() == 0
        message = json.loads(body)
        assert path == "/hook"
        assert verify(SECRET, headers["X-Qinglong-Timestamp"], body,
                      headers["X-Qinglong-Signature"], now_s=time.time())
        assert not verify("other-secret", headers["X-Qinglong-Timestamp"], body,
                          headers["X-Qinglong-Signature"], now_s=time.time())
        assert headers["X-Qinglong-Event"] == message["event_id"]
        assert (message["kind"], message["project"], message["task"], message["run"],
                message["state"], message["exit_code"]) == (
            "run.failed", "ops", "backup", run_id, "failed", 3)
        assert message["duration_ms"] is not None and message["duration_ms"] >= 0
        assert message["log_tail"][-2:] == ["using [redacted]", "disk full"]
        assert ENV_VALUE not in body.decode()
        output = plane.full_stderr()
        assert SECRET not in output and ENV_VALUE not in output
        [delivery] = ws.cli_json("notifications")
        assert (delivery["event_id"], delivery["state"], delivery["tries"], delivery["channel"]) == (
            message["event_id"], "delivered", 1, "hook")
    finally:
        receiver.close()
        ws.close()


def test_a_sigkill_during_a_send_redelivers_the_same_event_id_after_restart(tmp_path, monkeypatch):
    """A control plane killed while the receiver holds the request never learns the outcome:
    the restarted one must send the event again (not lose it), under the same id (so the
    receiver can drop the duplicate), and then record it delivered once."""
    receiver = Receiver()
    receiver.hold.set()
    ws = workspace(tmp_path, receiver)
    monkeypatch.setattr(ws, "env", lambda env=ws.env: {**env(), "HOOK_SECRET": SECRET})
    try:
        ws.cli("project", "create", "ops")
        ws.cli("task", "put", "ops", "t", "--", "sh", "-c", "exit 1")
        ws.cli_json("task", "run", "ops", "t")
        plane = ws.start("first")
        [(_, first_headers, first_body)] = receiver.wait_for(1)
        plane.kill()  # mid-send: the request is held by the receiver
        receiver.hold.clear()
        receiver.released.set()
        plane = ws.start("second")
        try:
            seen = receiver.wait_for(2)
            wait_until(lambda: ws.cli_json("notifications")[0]["state"] == "delivered",
                       "the redelivery recorded")
        finally:
            assert plane.terminate() == 0
        ids = {h["X-Qinglong-Event"] for _, h, _ in seen}
        assert ids == {first_headers["X-Qinglong-Event"]}
        assert json.loads(seen[-1][2])["event_id"] == json.loads(first_body)["event_id"]
        [delivery] = ws.cli_json("notifications")
        assert delivery["tries"] == 1 and delivery["state"] == "delivered"
    finally:
        receiver.close()
        ws.close()


def test_a_sigkill_during_completions_leaves_exactly_one_event_per_ended_run(tmp_path, monkeypatch):
    """Runs ending while the control plane is killed and restarted (its reconciler ends what
    ended meanwhile) must each get exactly one event: none lost, none doubled."""
    receiver = Receiver()
    ws = workspace(tmp_path, receiver)
    monkeypatch.setattr(ws, "env", lambda env=ws.env: {**env(), "HOOK_SECRET": SECRET})
    try:
        ws.cli("project", "create", "ops")
        ws.cli("task", "put", "ops", "t", "--", "sh", "-c", "sleep 0.$(($$ % 5)); exit 2")
        runs = [ws.cli_json("task", "run", "ops", "t", "--idempotency-key", f"k{i}")["run_id"]
                for i in range(6)]
        plane = ws.start("first")
        wait_until(lambda: ws.sql("SELECT count(*) FROM runs WHERE state IN "
                                  "('running', 'failed')")[0][0] >= 2, "jobs running or ended")
        plane.kill()
        plane = ws.start("second")
        try:
            wait_until(lambda: all(s in TERMINAL for (s,) in ws.sql("SELECT state FROM runs")),
                       "every Run ended")
            seen = receiver.wait_for(len(runs))
        finally:
            assert plane.terminate() == 0
        per_run = dict(ws.sql("SELECT run_id, count(*) FROM event_outbox GROUP BY run_id"))
        assert per_run == {r: 1 for r in runs}
        delivered = {json.loads(b)["run"] for _, _, b in seen}
        assert delivered == set(runs)
    finally:
        receiver.close()
        ws.close()
