"""Env values through the management API: written sealed, kept by name, never read back, and a
key the API process cannot read is a 503 ``secrets_unavailable`` that writes nothing."""

from __future__ import annotations

import base64
import os
import sqlite3

from api_helpers import Client, api_settings, make_token
from http_helpers import Plane, cli

SECRET = "api-s3cret-" + "9b1d"
PAYLOAD = {"command": ["sh", "-c", 'printf "%s" "$TOKEN"'], "env": {"TOKEN": SECRET}}


def stored(tmp_path) -> list[str]:
    conn = sqlite3.connect(tmp_path / "q.db")
    try:
        return [r[0] for r in conn.execute("SELECT payload_json FROM tasks UNION ALL "
                                           "SELECT payload_json FROM task_revisions")]
    finally:
        conn.close()


def test_env_values_put_through_the_api_are_sealed_kept_by_name_and_never_shown(tmp_path):
    key = tmp_path / "api.key"
    key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    settings = api_settings(tmp_path, extra=f'[secrets]\nkey_file = "{key}"\n')
    cli(settings, "project", "create", "ops")
    client = None
    plane = Plane(settings)
    try:
        client = Client(plane.port, make_token(settings, "deployer", "write"))
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/tasks/job", {"payload": PAYLOAD})
        assert status == 200 and body["task_revision"] == 1, body
        kept = {"payload": {"command": PAYLOAD["command"], "env": {}}, "keep_env": ["TOKEN"]}
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/tasks/job", kept)
        assert status == 200 and body["task_revision"] == 1, body  # the same value: no new revision
        status, shown, raw = client.request("GET", "/api/v1/projects/ops/tasks/job")
        assert status == 200 and shown["execution"]["env"] == {"TOKEN": "(set)"}
        assert SECRET not in str(shown) and "ql-sealed" not in str(shown)
    finally:
        if client is not None:
            client.close()
        plane.stop()
    rows = stored(tmp_path)
    assert rows and all(SECRET not in text and "ql-sealed:v1:" in text for text in rows)


def test_a_key_the_api_cannot_read_is_503_secrets_unavailable_and_writes_nothing(tmp_path):
    missing = tmp_path / "absent.key"
    settings = api_settings(tmp_path, extra=f'[secrets]\nkey_file = "{missing}"\n')
    cli(settings, "project", "create", "ops")
    client = None
    plane = Plane(settings)  # a store without sealed values starts without reading the key
    try:
        client = Client(plane.port, make_token(settings, "deployer", "write"))
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/tasks/job", {"payload": PAYLOAD})
        assert status == 503 and body["error"]["code"] == "secrets_unavailable", body
        assert "[secrets] key_file" in body["error"]["message"] and SECRET not in str(body)
        status, _, _ = client.request("GET", "/api/v1/projects/ops/tasks/job")
        assert status == 404
    finally:
        if client is not None:
            client.close()
        plane.stop()
    assert stored(tmp_path) == [] and not missing.exists()
