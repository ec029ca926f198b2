"""A task whose Runs all fail shows in every health signal of a real ``qinglong run``: the log
(one line per failed Attempt), ``qinglong status`` (a verdict line, exit 30), the status page and
``/metrics``; and never with the task's environment values."""

from __future__ import annotations

import json
import re

from prometheus_client.parser import text_string_to_metric_families

from host_helpers import run_cli, wait_until
from http_helpers import Plane, child_env, cli, write_settings

SECRET = "s3cret-value-never-logged"


def _failing(plane: Plane) -> float | None:
    status, text, _ = plane.get("/metrics")
    assert status == 200
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values.get("qinglong_tasks_failing") or None


def test_a_task_failing_every_run_is_logged_shown_and_exits_failing(tmp_path):
    """140 failing Runs of 140 once read "clear" on the page, exit 0 from status and nothing in
    the log: an operator would learn of a broken backup only when the restore is needed."""
    settings = write_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "bad", "--env", f"TOKEN={SECRET}", "--", "sh", "-c", "exit 3")
    cli(settings, "trigger", "add", "ops", "tick", "--task", "bad", "--cron", "* * * * * *")
    plane = Plane(settings)
    try:
        wait_until(lambda: _failing(plane), "the failing task in /metrics", alive=plane.process)
        line = plane.stderr.wait_for("failed: exit 3 after", timeout=60)
        assert re.search(r"task ops/bad run [0-9a-f-]+ attempt 1 failed: exit 3 after \d+\.\d{3} s", line), line
        done = run_cli(["--settings", str(settings), "status", "--once", "--json"], cwd=tmp_path,
                       env=child_env())
        assert done.returncode == 30, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["verdict"] == "failing"
        assert report["reasons"][0].startswith("task ops/bad is failing: its last run failed"), report
        assert report["stats"]["failing_tasks"][0]["task_id"] == "bad"
        screen = run_cli(["--settings", str(settings), "status", "--once"], cwd=tmp_path, env=child_env())
        assert "verdict" in screen.stdout and "failing (30)" in screen.stdout, screen.stdout
        status, page, _ = plane.get("/")
        assert "<strong>failing</strong>" in page and "Failing tasks (1)" in page
        assert "<td>ops/bad</td>" in page
    finally:
        plane.stop()
    assert SECRET not in plane.stderr.text()
