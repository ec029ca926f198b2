"""The first ``qinglong run`` after publishing catches up the occurrences that fell due before it
started, as the misfire policy allows: that is no admission lag, so ``qinglong status``, the page
and the lag histogram (the lag alert's input) read clear right after the start."""

from __future__ import annotations

import json
import time

from prometheus_client.parser import text_string_to_metric_families

from host_helpers import run_cli, wait_until
from http_helpers import Plane, child_env, cli, write_settings


def _lag_buckets(plane: Plane) -> dict[str, float]:
    status, text, _ = plane.get("/metrics")
    assert status == 200
    return {s.labels.get("le", "count"): s.value for f in text_string_to_metric_families(text)
            if f.name == "qinglong_admission_lag_seconds" for s in f.samples
            if s.name.endswith("_bucket") or s.name.endswith("_count")}


def test_the_first_run_after_publishing_is_clear_though_it_caught_up_missed_occurrences(tmp_path):
    """Counted as lag, the catch-up of a start read "attention (20)" for five minutes after every
    restart (the lag window), and fed the lag alert: operators learn to ignore both."""
    settings = write_settings(tmp_path, extra="[scheduler]\ncadence_ms = 200\n")  # grace: 1 s
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "t", "--", "true")
    cli(settings, "trigger", "add", "ops", "tick", "--task", "t", "--cron", "* * * * * *")
    published = time.time()
    # three occurrences fall due before any scheduler runs (the clock passing them is the event)
    wait_until(lambda: time.time() > published + 3.5, "three occurrences owed", every=0.1)
    plane = Plane(settings)
    try:
        buckets = wait_until(lambda: (lambda b: b if b.get("count", 0) >= 4 else None)(_lag_buckets(plane)),
                             "the catch-up and a first on-time admission", alive=plane.process)
        assert buckets["1.0"] == buckets["count"], buckets  # none over the grace
        done = run_cli(["--settings", str(settings), "status", "--once", "--json"], cwd=tmp_path,
                       env=child_env())
        report = json.loads(done.stdout)
        assert done.returncode == 0, report["reasons"]
        assert report["stats"]["admitted_in_window"] >= 4
        assert report["stats"]["admission_lag_p99_ms"] < report["grace_ms"]
        status, page, _ = plane.get("/")
        assert "<strong>clear</strong>" in page
    finally:
        plane.stop()
