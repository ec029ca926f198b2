"""Chained Runs in a real ``qinglong run`` (edge): ``trigger add --after`` on the command line,
and a SIGKILL while upstream Runs end: every ended upstream Run has exactly one downstream Run."""

from __future__ import annotations

from tests.execution.execution_helpers import TERMINAL, Workspace, wait_until


def test_a_sigkill_during_completions_neither_loses_nor_doubles_a_chained_run(tmp_path):
    """Upstream Runs ending while the control plane is killed and restarted (its reconciler
    records what ended meanwhile) must each start exactly one downstream Run."""
    ws = Workspace(tmp_path / "ws", execution={"max_running": 4})
    try:
        ws.cli("project", "create", "ops")
        ws.cli("task", "put", "ops", "up", "--", "sh", "-c", "sleep 0.$(($$ % 7)); exit 2")
        ws.cli("task", "put", "ops", "cleanup", "--", "true")
        out = ws.cli("trigger", "add", "ops", "after-up", "--task", "cleanup", "--after", "up",
                     "--on", "failure").stdout
        assert "after-up" in out
        ups = [ws.cli_json("task", "run", "ops", "up", "--idempotency-key", f"k{i}")["run_id"]
               for i in range(8)]
        plane = ws.start("first")
        wait_until(lambda: ws.sql("SELECT count(*) FROM runs WHERE task_id = 'up' AND state IN "
                                  "('running', 'failed')")[0][0] >= 3, "upstream jobs running")
        plane.kill()
        plane = ws.start("second")
        try:
            wait_until(lambda: len(ws.sql("SELECT 1 FROM runs")) == 16
                       and all(s in TERMINAL for (s,) in ws.sql("SELECT state FROM runs")),
                       "every upstream and chained Run ended")
        finally:
            assert plane.terminate() == 0
        keys = [k for (k,) in ws.sql("SELECT idempotency_key FROM runs WHERE trigger_id = 'after-up'")]
        assert sorted(keys) == sorted(f"ql3:chain:v1:{r}:after-up" for r in ups)
    finally:
        ws.close()


def test_trigger_add_after_refuses_a_loop_and_an_unknown_outcome(tmp_path):
    ws = Workspace(tmp_path / "ws")
    try:
        ws.cli("project", "create", "ops")
        ws.cli("task", "put", "ops", "a", "--", "true")
        ws.cli("task", "put", "ops", "b", "--", "true")
        ws.cli("trigger", "add", "ops", "b-after-a", "--task", "b", "--after", "a")
        loop = ws.cli("trigger", "add", "ops", "a-after-b", "--task", "a", "--after", "b", check=False)
        assert loop.returncode == 3 and "loop: a -> b -> a" in loop.stderr
        bad = ws.cli("trigger", "add", "ops", "x", "--task", "a", "--after", "b", "--on", "maybe",
                     check=False)
        assert bad.returncode == 3 and "on" in bad.stderr
        [schedule] = ws.cli_json("schedules")
        assert schedule["trigger_id"] == "b-after-a" and schedule["next_fire_at_ms"] is None
    finally:
        ws.close()


def test_an_at_start_trigger_runs_once_per_start_identity_across_a_sigkill(tmp_path, monkeypatch):
    """``@reboot`` semantics: a crash and restart of ``qinglong run`` within the same boot must
    not run the job again (the start identity is the owner and the boot), while another
    scheduler owner is another start."""
    ws = Workspace(tmp_path / "ws")
    try:
        ws.cli("project", "create", "ops")
        ws.cli("task", "put", "ops", "tunnel", "--", "true")
        ws.cli("trigger", "add", "ops", "on-boot", "--task", "tunnel", "--kind", "at_start",
               "--spec", "{}")
        runs = lambda: ws.sql("SELECT idempotency_key, state FROM runs WHERE trigger_id = 'on-boot'")
        plane = ws.start("first")
        wait_until(lambda: runs() and runs()[0][1] in TERMINAL, "the at_start Run ended")
        plane.kill()
        plane = ws.start("second")
        plane.wait_ready()
        assert plane.terminate() == 0
        assert "had its Run for this start already" in plane.full_stderr()
        [(key, _)] = runs()
        with open("/proc/sys/kernel/random/boot_id") as f:
            assert key.startswith("ql3:at_start:v1:on-boot:") and key.endswith(f.read().strip())
        env = ws.env
        monkeypatch.setattr(ws, "env", lambda: {**env(), "QINGLONG_SCHEDULER__OWNER": "other"})
        plane = ws.start("third")
        wait_until(lambda: len(runs()) == 2, "another owner's start admitted its own Run")
        assert plane.terminate() == 0
    finally:
        ws.close()
