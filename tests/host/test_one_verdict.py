"""One verdict everywhere: ``qinglong status``, the status page and ``/metrics`` judge the same
store with the same grace (``qinglong.contracts.observe.status_grace_ms`` and ``assess``), on a real
``qinglong run`` whose rounds cannot commit (another connection holds the database's write lock),
so its backlog ages while its scheduler still holds the store."""

from __future__ import annotations

import json
import re
import sqlite3

from prometheus_client.parser import text_string_to_metric_families

from host_helpers import run_cli, wait_until
from http_helpers import Plane, child_env, cli, write_settings

from qinglong.contracts.observe import status_grace_ms


def _scrape(plane: Plane) -> dict[str, float]:
    status, text, _ = plane.get("/metrics")
    assert status == 200
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def _verdict_on_page(plane: Plane) -> str:
    status, page, _ = plane.get("/")
    assert status == 200
    match = re.search(r"<p class=v\d+><strong>(\w+)</strong>: ([^<]*)</p>", page)
    assert match, page
    return match.group(1) + ": " + match.group(2)


def test_the_page_the_metrics_and_the_command_give_the_same_verdict_with_the_same_grace(tmp_path):
    """If the page kept a grace of its own (it had 60 s where the command had 5 cadences), it
    would show "clear" while ``qinglong status`` exits 20 for the same frozen backlog: the
    operator looking at the page would not see that nothing is admitted."""
    settings = write_settings(tmp_path, extra="[scheduler]\ncadence_ms = 200\n")
    # a round waits 50 ms for the write lock, then fails; nothing executes (only rounds write)
    text = settings.read_text().replace("[backend]\n", "[backend]\nbusy_timeout_ms = 50\n", 1)
    text = text.replace("[execution]\n", "[execution]\nenabled = false\n", 1)
    settings.write_text(text)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "t", "--", "true")
    cli(settings, "trigger", "add", "ops", "tick", "--task", "t", "--cron", "* * * * * *")
    grace_ms = status_grace_ms(200, 30_000, leased=False)
    assert grace_ms == 1000
    plane = Plane(settings)
    try:
        wait_until(lambda: _scrape(plane).get("qinglong_admissions_total", 0) >= 1,
                   "a first admission", alive=plane.process)
        assert _scrape(plane)["qinglong_status_grace_seconds"] == grace_ms / 1000
        holder = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # every round's commit now fails: the backlog ages

            def command_says_attention():
                done = run_cli(["--settings", str(settings), "status", "--json"], cwd=tmp_path,
                               env=child_env(), timeout=120)
                return done if done.returncode == 20 else None

            done = wait_until(command_says_attention, "qinglong status to say attention",
                              alive=plane.process)
            report = json.loads(done.stdout)
            assert report["grace_ms"] == grace_ms
            assert any("backlog" in r for r in report["reasons"]), report
            # the page and the gauge judge the process's own last two readings, which a loaded
            # machine may take a moment later than the command's: wait for them, while the
            # backlog keeps aging (a page with its own grace never gets there)
            page = wait_until(lambda: (text := _verdict_on_page(plane)).startswith("attention: ") and text,
                              "the page to say attention", alive=plane.process)
            assert "backlog" in page or "occurrence(s) due" in page, page
            # judged with the command's grace: a page with a grace of its own (60 s before) says
            # attention only once the oldest occurrence waited that long
            waits = re.search(r"waits ([0-9.]+) s", page)
            assert waits is None or float(waits.group(1)) < 60, page
            wait_until(lambda: _scrape(plane)["qinglong_status_verdict"] == 20,
                       "the verdict gauge to say attention", alive=plane.process)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    finally:
        plane.stop()
