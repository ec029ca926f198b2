"""A worker with no database credential runs the cluster's Runs through the API tier's gateway:
real PostgreSQL (both builds), a real ``qinglong api`` over TCP, a real ``qinglong worker``."""

from __future__ import annotations

import base64
import os
import signal

from tests.gateway.helpers import ApiGateway, plane_settings, register, start_gateway_worker
from tests.worker.helpers import admit, attempts, py_job, publish_task, stored_log, wait_run_state


def test_a_registered_worker_runs_a_run_through_the_gateway_without_a_database_credential(cluster, tmp_path):
    """Without the gateway a worker host would need a database password (which any
    job could read and use to impersonate every worker); through it the Run still runs once, its
    exit code and every log byte are stored, and the worker's settings name no DSN."""
    settings = plane_settings(cluster, tmp_path)
    token = register(settings, "w-gw")
    api = ApiGateway(settings, tmp_path / "api.stderr")
    worker = None
    try:
        trigger = publish_task(cluster, "hello", {"command": py_job("print('x' * 200000); raise SystemExit(5)"),
                                                  "timeout_ms": 60_000})
        run_id = admit(cluster, trigger)
        worker = start_gateway_worker(api.url, token, tmp_path, "w-gw")
        assert wait_run_state(cluster, run_id) == "failed"
        (attempt,) = attempts(cluster, run_id)
        assert (attempt["state"], attempt["exit_code"]) == ("failed", 5)
        assert stored_log(cluster, attempt["attempt_id"]) == b"x" * 200000 + b"\n"
        text = (tmp_path / "w-gw.toml").read_text()
        assert "dsn" not in text and "password" not in text
        assert token not in worker.text() and token not in api.text()
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        closed = cluster.sql("SELECT closed_at_ms FROM qinglong.worker_sessions WHERE worker_id = 'w-gw'")
        assert closed[0][0] is not None
    finally:
        if worker is not None:
            worker.stop()
        api.stop()


def test_a_worker_gets_a_sealed_env_value_in_clear_only_through_its_claim(cluster, tmp_path):
    """Env values are sealed in the store under the API tier's key; the gateway opens them for
    the worker that claimed the Attempt, so the job sees the value, while the store, the API's
    and the worker's own output never hold it in clear."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from qinglong.contracts.secrets import Sealer

    secret = "s3cr3t-" + os.urandom(8).hex()
    key = os.urandom(32)
    key_file = tmp_path / "secrets.key"
    key_file.write_text(base64.b64encode(key).decode() + "\n")
    settings = plane_settings(cluster, tmp_path)
    settings.write_text(settings.read_text() + f'[secrets]\nkey_file = "{key_file}"\n')
    token = register(settings, "w-sealed")
    api = ApiGateway(settings, tmp_path / "api.stderr")
    worker = None
    try:
        trigger = publish_task(cluster, "sealed", {
            "command": py_job("import os; print('token=' + os.environ['TOKEN'])"), "timeout_ms": 60_000,
            "env": {"TOKEN": secret}}, sealer=Sealer([key], AESGCM))
        stored = cluster.sql("SELECT payload_json FROM qinglong.task_revisions WHERE task_id = 'sealed' "
                             "UNION ALL SELECT spec_json FROM qinglong.execution_revisions WHERE task_id = 'sealed'")
        assert stored and all(secret not in text and "ql-sealed:v1:" in text for (text,) in stored)
        run_id = admit(cluster, trigger)
        worker = start_gateway_worker(api.url, token, tmp_path, "w-sealed")
        assert wait_run_state(cluster, run_id) == "succeeded"
        (attempt,) = attempts(cluster, run_id)
        assert stored_log(cluster, attempt["attempt_id"]) == f"token={secret}\n".encode()
        assert secret not in worker.text() and secret not in api.text()
    finally:
        if worker is not None:
            worker.stop()
        api.stop()


def test_an_api_without_the_key_of_the_stored_values_does_not_start(cluster, tmp_path):
    """An API tier that cannot open the stored values would hand every worker a job it must
    refuse; it stops at start instead, exit 6, naming the setting and the key ids only."""
    import subprocess
    import sys

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from qinglong.contracts.secrets import Sealer

    from tests.gateway.helpers import child_env

    publish_task(cluster, "sealed-nokey", {"command": py_job("print(1)"), "env": {"TOKEN": "t0ken-value"}},
                 sealer=Sealer([os.urandom(32)], AESGCM))
    settings = plane_settings(cluster, tmp_path)
    for extra in ("", f'[secrets]\nkey_file = "{tmp_path / "other.key"}"\n'):
        if extra:
            (tmp_path / "other.key").write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
        settings.write_text(settings.read_text() + extra)
        done = subprocess.run([sys.executable, "-m", "qinglong", "--settings", str(settings), "api"],
                              env=child_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 6, done.stderr
        assert "[secrets] key_file" in done.stderr and "t0ken-value" not in done.stderr
