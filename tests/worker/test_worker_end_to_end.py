"""A ``qinglong worker`` process runs the cluster's Runs: real PostgreSQL, Runs admitted by the
replicas' own round from cron triggers, workers registered on a real gateway and speaking to it,
real jobs in their own process groups."""

from __future__ import annotations

import os
import signal

from tests.worker.helpers import (
    start_worker,
    admit,
    attempts,
    py_job,
    publish_task,
    run_state,
    stored_log,
    wait_run_state,
    WorkerProcess,
)
from tests.support.gateway import write_gateway_worker_settings

#: The job: a line naming what it saw in its environment, then 300,000 bytes of every byte value
#: (binary, not UTF-8, more than one 256 KiB chunk), then exit 7.
BINARY_JOB = (
    "import os, sys\n"
    "out = sys.stdout.buffer\n"
    "out.write(('%s %s %s\\n' % (os.environ['QINGLONG_RUN_ID'], os.environ['QINGLONG_ATTEMPT'],"
    " os.environ['GREETING'])).encode())\n"
    "out.write(bytes(range(256)) * 1171 + bytes(range(224)))\n"
    "out.flush()\n"
    "sys.exit(7)\n"
)
BINARY_BYTES = bytes(range(256)) * 1171 + bytes(range(224))


def test_a_cron_run_is_executed_by_a_worker_with_its_exit_code_and_every_log_byte_stored(cluster, tmp_path, worker_gateway):
    """Without the worker a cluster Run would stay queued forever; without chunked, offset-checked
    shipping a log over one chunk (or one holding bytes that are not UTF-8) would land cut or
    altered; without the job environment the job could not tell which Run it is."""
    assert len(BINARY_BYTES) == 300_000
    trigger = publish_task(cluster, "binary", {"command": py_job(BINARY_JOB), "env": {"GREETING": "hello-worker"},
                                               "timeout_ms": 60_000})
    run_id = admit(cluster, trigger)
    assert run_state(cluster, run_id) == "queued"
    worker = start_worker(worker_gateway, tmp_path, "w-e2e")
    try:
        assert wait_run_state(cluster, run_id) == "failed"  # exit 7, no retry by default
        (attempt,) = attempts(cluster, run_id)
        assert (attempt["state"], attempt["exit_code"], attempt["signal"]) == ("failed", 7, None)
        expected = f"{run_id} 1 hello-worker\n".encode() + BINARY_BYTES
        assert attempt["log_bytes"] == len(expected)
        assert stored_log(cluster, attempt["attempt_id"]) == expected
        chunks = cluster.count("attempt_logs", "attempt_id = %s", (attempt["attempt_id"],))
        assert chunks >= 2
        # the local Attempt directory is the one the executor wrote
        with open(tmp_path / "w-e2e-logs" / attempt["attempt_id"] / "log", "rb") as f:
            assert f.read() == expected
        codes = [e["code"] for e in worker.events()]
        assert {"worker.session_opened", "worker.claimed", "worker.job_started", "worker.completed"} <= set(codes)
        assert "hello-worker" not in worker.text()  # an env value is never in a diagnostic
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        worker.wait_event("worker.stopped")
        closed = cluster.sql("SELECT closed_at_ms FROM qinglong.worker_sessions WHERE worker_id = 'w-e2e'")
        assert closed[0][0] is not None
    finally:
        worker.stop()


def test_a_failing_job_is_retried_exactly_as_its_policy_says(cluster, tmp_path, worker_gateway):
    """Without the store's retry decision on completion a failing Run would run once (or forever);
    the worker must report each Attempt so that exactly max_attempts run, then the Run fails."""
    trigger = publish_task(cluster, "flaky", {
        "command": py_job("import os, sys; print('attempt', os.environ['QINGLONG_ATTEMPT']); sys.exit(3)"),
        "retry": {"max_attempts": 3, "initial_backoff_ms": 100, "max_backoff_ms": 200, "jitter": 0,
                  "exit_codes": [3]}})
    run_id = admit(cluster, trigger)
    worker = start_worker(worker_gateway, tmp_path, "w-retry")
    try:
        assert wait_run_state(cluster, run_id) == "failed"
        rows = attempts(cluster, run_id)
        assert [(a["attempt_no"], a["state"], a["exit_code"]) for a in rows] == [(1, "failed", 3), (2, "failed", 3),
                                                                                (3, "failed", 3)]
        for a in rows:
            assert stored_log(cluster, a["attempt_id"]) == f"attempt {a['attempt_no']}\n".encode()
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()


def test_a_task_with_labels_runs_only_on_the_worker_that_offers_them(cluster, tmp_path, worker_gateway):
    """Ignoring labels would run a GPU task on a machine without one; a worker without the label
    must leave the Run queued even while it claims other Runs, and the labelled worker takes it."""
    gpu = admit(cluster, publish_task(cluster, "needs-gpu", {"command": py_job("print('gpu')"), "labels": ["gpu"]}))
    plain = admit(cluster, publish_task(cluster, "plain", {"command": py_job("print('plain')")}))
    plain_worker = start_worker(worker_gateway, tmp_path, "w-plain", labels=("cpu",))
    gpu_worker = None
    try:
        assert wait_run_state(cluster, plain) == "succeeded"
        # the Run ahead of it in dispatch order, whose label the worker lacks, was left queued
        assert run_state(cluster, gpu) == "queued"
        claims = len(plain_worker.events("worker.claimed"))
        assert claims == 1
        gpu_worker = start_worker(worker_gateway, tmp_path, "w-gpu", labels=("gpu", "cpu"))
        assert wait_run_state(cluster, gpu) == "succeeded"
        (attempt,) = attempts(cluster, gpu)
        assert os.path.isdir(tmp_path / "w-gpu-logs" / attempt["attempt_id"])
        assert not os.path.exists(tmp_path / "w-plain-logs" / attempt["attempt_id"])
        assert len(plain_worker.events("worker.claimed")) == 1
    finally:
        for w in (plain_worker, gpu_worker):
            if w is not None:
                w.signal(signal.SIGTERM)
                w.wait()
                w.stop()


def test_a_second_worker_with_the_same_id_replaces_the_first_which_stops_instead_of_fencing_it_back(
        cluster, tmp_path, worker_gateway):
    """Two live processes with one worker id would otherwise fence each other in turn forever (each
    reopening a session on the other's refusal), and neither could keep a job running; the older
    one must stop its jobs and exit, naming the cause, while the newer one keeps its session."""
    token = worker_gateway.register("w-twin")
    first = start_worker(worker_gateway, tmp_path, "w-twin", token=token)
    second = None
    try:
        first.wait_event("worker.session_opened")
        settings = write_gateway_worker_settings(tmp_path / "twin2.toml", url=worker_gateway.url, token=token,
                                                 worker_id="w-twin", log_dir=tmp_path / "twin2-logs")
        second = WorkerProcess(settings, tmp_path / "twin2.stderr")
        second.wait_event("worker.session_opened")
        assert first.wait() == 3
        assert first.events("worker.replaced") and "worker_id" in first.text()
        assert len(first.events("worker.session_opened")) == 1  # it never reopened
        generation = cluster.sql("SELECT generation FROM qinglong.worker_sessions WHERE worker_id = 'w-twin'")[0][0]
        assert generation == 2
        # the newer one works on: a Run admitted now is run by it
        run_id = admit(cluster, publish_task(cluster, "twin-task", {"command": py_job("print('ok')")}))
        assert wait_run_state(cluster, run_id) == "succeeded"
        assert second.proc.poll() is None
        assert cluster.sql("SELECT generation FROM qinglong.worker_sessions WHERE worker_id = 'w-twin'")[0][0] == 2
    finally:
        first.stop()
        if second is not None:
            second.signal(signal.SIGTERM)
            second.wait()
            second.stop()


def test_a_run_that_cannot_start_ends_failed_with_the_reason_and_is_never_retried(cluster, tmp_path, worker_gateway):
    """A missing program or an executor this worker does not have must end the Run failed, saying
    why, without a retry (nothing ran); left claimed it would block its task forever, retried it
    would fail the same way max_attempts times."""
    retry = {"max_attempts": 3, "initial_backoff_ms": 100, "jitter": 0}
    missing = admit(cluster, publish_task(cluster, "missing-program",
                                          {"command": ["/nonexistent/program", "x"], "retry": retry}))
    unknown = admit(cluster, publish_task(cluster, "unknown-executor",
                                          {"command": py_job("print(1)"), "executor": "acme_gpu_pool",
                                           "retry": retry}))
    worker = start_worker(worker_gateway, tmp_path, "w-nostart")
    try:
        assert wait_run_state(cluster, missing) == "failed"
        assert wait_run_state(cluster, unknown) == "failed"
        (a,) = attempts(cluster, missing)
        assert a["state"] == "failed" and a["exit_code"] is None
        assert "/nonexistent/program" in a["reason"] and "does not exist" in a["reason"]
        (b,) = attempts(cluster, unknown)
        assert b["state"] == "failed" and "acme_gpu_pool" in b["reason"] and "local_process" in b["reason"]
        assert worker.events("worker.job_started") == []  # nothing was spawned
        assert len(worker.events("worker.start_failed")) == 1
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()


def test_a_worker_set_to_run_more_than_its_registration_allows_runs_at_its_registered_capacity(
        cluster, tmp_path, worker_gateway):
    """A worker registered for 1 job at once but configured with `max_running = 3` asked the
    gateway for 3 claims, was refused each time as malformed, and never ran anything: every
    Run stayed queued behind a worker that looked alive. It must run them all, one at a time
    (the registration is the bound), and say once why it runs fewer than it was told."""
    token = worker_gateway.register("w-cap", capacity=1)
    runs = [admit(cluster, publish_task(cluster, f"cap-{i}", {"command": py_job("print('ok')")}))
            for i in range(3)]
    worker = start_worker(worker_gateway, tmp_path, "w-cap", token=token, max_running=3)
    try:
        assert [wait_run_state(cluster, run_id) for run_id in runs] == ["succeeded"] * 3
        spans = sorted(cluster.sql("SELECT started_at_ms, finished_at_ms FROM qinglong.attempts "
                                   "WHERE run_id::text = ANY(%s)", (runs,)))
        assert len(spans) == 3 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        codes = [e["code"] for e in worker.events()]
        assert codes.count("worker.capacity_bound") == 1
        assert "worker.bad_call" not in codes and "worker.store_unavailable" not in codes, codes
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()
