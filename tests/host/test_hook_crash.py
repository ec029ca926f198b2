"""SIGKILL of ``qinglong run`` while signed webhook deliveries are being admitted: every delivery
a sender retries after the restart is one Run, whether the kill fell before, during or after its
admission (no delivery lost, none run twice)."""

from __future__ import annotations

import http.client
import sqlite3
import threading
import time

from api_helpers import Client, Plane, api_settings, child_env, cli

from qinglong.contracts.signing import signature

SECRET = "k" * 20 + "-crash-hook-secret-0123"
DELIVERIES = 60
SENDERS = 4
KILL_AFTER = 12


def _send(port: int, delivery: str) -> tuple[int, dict] | None:
    """One signed delivery on its own connection; None when the server is gone mid-request."""
    body = b'{"delivery": "%s"}' % delivery.encode()
    ts = str(int(time.time()))
    headers = {"Content-Type": "application/json", "X-Qinglong-Timestamp": ts,
               "X-Qinglong-Signature": signature(SECRET, ts, body), "X-Qinglong-Delivery": delivery}
    client = Client(port)
    try:
        status, parsed, _ = client.request("POST", "/api/v1/hooks/ops/gh", body, headers=headers)
        return status, parsed
    except (OSError, http.client.HTTPException):  # killed before or while answering
        return None
    finally:
        client.close()


def _hook_runs(db) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT run_id, idempotency_key FROM runs WHERE trigger_id = 'gh' "
                            "ORDER BY idempotency_key").fetchall()
    finally:
        conn.close()


def test_a_sigkill_during_hook_admissions_loses_no_delivery_and_doubles_none(tmp_path):
    """If admission and its key were not one transaction, a delivery answered 202 before the kill
    could be missing after it (lost) or admitted again when the sender retries (a second Run of one
    event); a delivery cut mid-request must be admitted exactly once by the retry."""
    settings = api_settings(tmp_path, http='listen = "127.0.0.1:0"\nrequest_timeout_ms = 20000')
    # every delivery stays a Run (the edge queue bound would turn the later ones into skips)
    settings.write_text(settings.read_text().replace("[execution]\n", "[execution]\nmax_queued = 1000\n", 1))
    env = child_env(HOOK_SECRET=SECRET)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "job", "--", "true")
    cli(settings, "trigger", "add", "ops", "gh", "--task", "job", "--hook-secret-env", "HOOK_SECRET",
        "--hook-per-minute", "10000", env=env)
    plane = Plane(settings, env=env)
    answered: dict[str, str] = {}  # delivery -> run id the first server answered
    lock = threading.Lock()
    enough = threading.Event()
    gone = threading.Event()
    pending = [f"d-{i:03d}" for i in range(DELIVERIES)]

    def sender() -> None:
        while not gone.is_set():
            with lock:
                if not pending:
                    return
                delivery = pending.pop(0)
            result = _send(plane.port, delivery)
            if result is None:
                gone.set()
                return
            status, body = result
            assert status == 202, (delivery, status, body)
            with lock:
                answered[delivery] = body["run_id"]
                if len(answered) >= KILL_AFTER:
                    enough.set()

    threads = [threading.Thread(target=sender) for _ in range(SENDERS)]
    for thread in threads:
        thread.start()
    try:
        assert enough.wait(timeout=300), "the server never accepted enough deliveries"
        plane.process.kill()  # senders are mid-request: some admissions are cut in flight
        plane.process.wait()
        gone.set()
    finally:
        for thread in threads:
            thread.join(timeout=120)
        plane.stop()
    assert len(answered) < DELIVERIES, "the kill must land before every delivery was sent"

    restarted = Plane(settings, env=env)
    try:
        retried: dict[str, tuple[int, str]] = {}
        for i in range(DELIVERIES):  # a sender retries everything it did not see answered, and more
            delivery = f"d-{i:03d}"
            result = _send(restarted.port, delivery)
            assert result is not None
            status, body = result
            assert status in (200, 202), (delivery, status, body)
            retried[delivery] = (status, body["run_id"])
    finally:
        restarted.stop()

    for delivery, run_id in answered.items():
        assert retried[delivery] == (200, run_id), f"{delivery} answered before the kill was admitted again"
    runs = _hook_runs(tmp_path / "q.db")
    assert [key for _, key in runs] == [f"ql3:hook:v1:gh:d-{i:03d}" for i in range(DELIVERIES)]
    assert {run_id for run_id, _ in runs} == {run_id for _, run_id in retried.values()}
