"""The status page at ``/`` of a real ``qinglong run``, loaded in headless Chromium at a phone's
width; the screenshot is kept beside the test's files (and in ``$QINGLONG_TEST_ARTIFACTS`` when
set)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families

from host_helpers import wait_until
from http_helpers import Plane, cli, write_settings

INJECTED = "<b id=injected>e</b>"


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium (Debian's chromium package) is needed: .ci/install-system-deps installs it"
    return found


def _browser(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={cwd / 'chromium-profile'}", "--window-size=412,915", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_status_page_shows_schedules_runs_exit_codes_and_skips_escaped_on_a_phone(tmp_path):
    """An operator on call opens the page on a phone: a missing table, a Run's exit code not shown,
    or a skip not listed hides why a job did not do its work; a value rendered as markup (a task's
    program name in a failure reason) lets whoever publishes tasks inject HTML into it."""
    settings = write_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "exit3", "--", "sh", "-c", "exit 3")
    cli(settings, "task", "put", "ops", "odd", "--", INJECTED)  # a program no machine has
    cli(settings, "trigger", "add", "ops", "late", "--task", "exit3", "--cron", "* * * * * *",
        "--misfire", "skip", "--grace-ms", "1500")
    cli(settings, "task", "run", "ops", "odd")
    published = time.time()
    # occurrences pass before any scheduler runs: the first round skips them (grace 1.5 s)
    wait_until(lambda: time.time() > published + 3, "three occurrences to pass unadmitted", timeout=60,
               every=0.05)
    plane = Plane(settings)
    try:
        def seen():
            status, body, _ = plane.get("/metrics")
            values = {(s.name, s.labels.get("outcome") or s.labels.get("policy")): s.value
                      for f in text_string_to_metric_families(body) for s in f.samples}
            return (values.get(("qinglong_attempts_finished_total", "failed"), 0) >= 2
                    and values.get(("qinglong_skipped_occurrences_total", "skip"), 0) >= 1)

        wait_until(seen, "a failed run of each task and a skip", timeout=60, every=0.2, alive=plane.process)
        url = f"http://127.0.0.1:{plane.port}/"
        dom = _browser("--dump-dom", url, cwd=tmp_path)
        assert dom.returncode == 0, dom.stderr[-2000:]
        shot = tmp_path / "status-page.png"
        taken = _browser(f"--screenshot={shot}", url, cwd=tmp_path)
        assert taken.returncode == 0 and shot.stat().st_size > 1000, taken.stderr[-2000:]
    finally:
        plane.stop()
    artifacts = os.environ.get("QINGLONG_TEST_ARTIFACTS")
    if artifacts:
        os.makedirs(artifacts, exist_ok=True)
        shutil.copy(shot, os.path.join(artifacts, "status-page.png"))
    page = dom.stdout
    assert "<title>Qinglong status</title>" in page and 'name="viewport"' in page
    assert "Qinglong · edge" in page and "ready" in page
    for heading in ("Schedules", "Recent runs", "Skipped occurrences"):
        assert f"<h2>{heading}</h2>" in page, heading
    assert "<td>ops/late</td>" in page                      # the schedule and its Runs
    assert "<td>failed</td><td>3</td>" in page              # state and exit code of a Run
    assert "<td>ops/late</td><td>skip</td>" in page         # the skip record
    assert 'id="injected"' not in page                      # shown as text, never as markup
    assert "&lt;b id=injected&gt;e&lt;/b&gt;" in page
