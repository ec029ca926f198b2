"""docs/workers.md says what the code does: its settings table is the model's keys and defaults,
and the timing it explains is the one the worker computes."""

from __future__ import annotations

import re
from pathlib import Path

from qinglong.contracts.worker import check_worker_timing, fence_deadlines
from qinglong.host.settings import WorkerSettings, load_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "workers.md"
BEGIN, END = "<!-- worker settings table begins -->", "<!-- worker settings table ends -->"


def test_the_settings_table_lists_every_worker_key_with_its_default():
    """An operator sizing leases from a stale table would get a worker that refuses to start, or
    one whose fence does not hold where the doc says it does."""
    text = DOC.read_text()
    table = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    rows = dict(re.findall(r"^\| `worker\.(\w+)` \| ([^|]+) \|", table, re.MULTILINE))
    defaults = WorkerSettings().model_dump(mode="json")
    assert sorted(rows) == sorted(defaults)
    for key, value in defaults.items():
        shown = rows[key].strip()
        if value is None:
            assert shown == "(not set)", key
        elif isinstance(value, list):
            assert shown == f"`{value}`".replace("'", '"'), key
        else:
            assert shown == f"`{value:g}`" if isinstance(value, float) else shown == f"`{value}`", key


def test_the_documented_timing_is_what_the_worker_computes():
    """The doc promises TERM at 29 s, KILL at 39 s and every job gone by 40 s after the last
    heartbeat started, with the defaults; the worker must compute exactly that."""
    w = WorkerSettings()
    assert check_worker_timing(w.session_lease_ms, w.heartbeat_ms, w.self_fence_margin_ms, w.kill_grace_ms) is None
    assert check_worker_timing(5000, 1000, 1000, 500) is None
    d = fence_deadlines(0.0, w.session_lease_ms, w.self_fence_margin_ms, w.kill_grace_ms)
    assert (d.term_at, d.kill_at, d.fenced_at) == (29.0, 39.0, 40.0)
    text = DOC.read_text()
    assert "TERM to every job's process group 29 s" in text and "KILL at 39 s, all gone by 40 s" in text


def test_worker_settings_come_from_the_environment_as_documented(monkeypatch):
    """The Kubernetes snippet sets the DSN and the worker id through the environment."""
    monkeypatch.setenv("QINGLONG_WORKER__DSN", "host=db user=qinglong_gateway")
    monkeypatch.setenv("QINGLONG_WORKER__WORKER_ID", "pod-1")
    monkeypatch.setenv("QINGLONG_WORKER__MAX_RUNNING", "8")
    worker = load_settings(profile="cluster").settings.worker
    assert (worker.dsn.get_secret_value(), worker.worker_id, worker.max_running) == (
        "host=db user=qinglong_gateway", "pod-1", 8)
