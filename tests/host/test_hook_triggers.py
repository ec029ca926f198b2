"""Incoming webhook triggers (kind ``hook``) over real TCP against a real ``qinglong run`` on a
SQLite file: a signed delivery admits one Run, and every refused delivery leaves the store (every
row of every table, the audit log included) as it was."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
import time

import pytest

from api_helpers import Client, Plane, api_settings, child_env, cli, make_token, store_dump
from host_helpers import run_cli, wait_until
from http_helpers import Plane

from qinglong.contracts.signing import signature

SECRET = "s" * 20 + "-hook-secret-0123456789"
OTHER = "o" * 20 + "-other-secret-012345678"


def _post(port, path, body, *, secret=SECRET, ts=None, delivery="d-1", headers=None):
    ts = str(int(time.time())) if ts is None else ts
    sent = {"Content-Type": "application/json", "X-Qinglong-Timestamp": ts,
            "X-Qinglong-Signature": signature(secret, ts, body), "X-Qinglong-Delivery": delivery}
    sent.update(headers or {})
    client = Client(port)
    try:
        status, parsed, _ = client.request("POST", path, body, headers=sent)
        return status, parsed
    finally:
        client.close()


def _admissions(db):
    """What an admission writes (Runs, their keys and payloads), not how an admitted Run goes on
    (its state moves while the job runs)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [conn.execute(q).fetchall() for q in (
            "SELECT run_id, trigger_id, idempotency_key FROM runs ORDER BY 1",
            "SELECT * FROM manual_run_keys ORDER BY 1", "SELECT * FROM run_event_payloads ORDER BY 1",
            "SELECT attempt_id, run_id FROM attempts ORDER BY 1")]
    finally:
        conn.close()


def _hook_runs(db):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT run_id, trigger_id, idempotency_key FROM runs WHERE trigger_id LIKE 'gh%' "
                            "OR trigger_id = 'web-hook' ORDER BY 1").fetchall()
    finally:
        conn.close()


HOOK_HTTP = 'listen = "127.0.0.1:0"\nrequest_timeout_ms = 20000\nmax_body_bytes = 65536'


@pytest.fixture(scope="module")
def published_store(tmp_path_factory):
    """The store every test starts from, published once through the real CLI (ten commands):
    each test gets its own copy, so what one test admits or refuses never reaches another."""
    root = tmp_path_factory.mktemp("published")
    settings = api_settings(root, http=HOOK_HTTP)
    env = child_env(HOOK_SECRET=SECRET, OTHER_SECRET=OTHER)
    cli(settings, "project", "create", "ops")
    cli(settings, "project", "create", "web")
    cli(settings, "task", "put", "ops", "job", "--", "sh", "-c", "cat \"$QINGLONG_EVENT_FILE\" 2>/dev/null; echo ran")
    cli(settings, "task", "put", "web", "job", "--", "sh", "-c", "echo web")
    cli(settings, "trigger", "add", "ops", "gh", "--task", "job", "--hook-secret-env", "HOOK_SECRET",
        "--hook-per-minute", "3", env=env)
    cli(settings, "trigger", "add", "ops", "gh-off", "--task", "job", "--hook-secret-env", "HOOK_SECRET", env=env)
    cli(settings, "trigger", "disable", "ops", "gh-off")
    cli(settings, "trigger", "add", "web", "web-hook", "--task", "job", "--hook-secret-env", "OTHER_SECRET", env=env)
    cli(settings, "trigger", "add", "ops", "clock", "--task", "job", "--cron", "0 0 1 1 *")
    return root


@pytest.fixture
def hooked(published_store, tmp_path):
    shutil.copytree(published_store, tmp_path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("settings.toml"))
    settings = api_settings(tmp_path, http=HOOK_HTTP)
    plane = Plane(settings)
    try:
        yield plane, settings
    finally:
        plane.stop()


def test_a_signed_delivery_admits_one_run_and_its_repeat_the_same(hooked):
    """If the delivery id were not the key, a sender's retry (the same delivery twice) would run
    the job twice; if the route needed a token, no webhook sender could reach it."""
    plane, settings = hooked
    status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", b'{"ref": "main"}')
    assert status == 202 and answer["created"] is True, answer
    again, repeat = _post(plane.port, "/api/v1/hooks/ops/gh", b'{"ref": "main"}')
    assert again == 200 and repeat == {**answer, "created": False}
    runs = _hook_runs(settings.parent / "q.db")
    assert runs == [(answer["run_id"], "gh", "ql3:hook:v1:gh:d-1")]


def test_the_secret_is_never_shown_by_listings(hooked):
    """The secret verifies every delivery: a listing that printed it would let any read token
    forge deliveries."""
    plane, settings = hooked
    listed = cli(settings, "trigger", "list", "ops", "--json")
    assert SECRET not in listed and json.loads(listed)
    for args in (("schedules", "--json"), ("schedules",), ("trigger", "list", "ops")):
        shown = cli(settings, *args)
        assert "gh" in shown and SECRET not in shown, args
    token = make_token(settings, "reader", "read")
    client = Client(plane.port, token)
    try:
        status, body, _ = client.request("GET", "/api/v1/projects/ops/triggers/gh")
        assert status == 200 and body["spec"]["secret"] == "********" and SECRET not in json.dumps(body)
    finally:
        client.close()


def test_refused_deliveries_change_nothing(hooked):
    """Each refusal asserted by its answer and by the store unchanged: a forged, stale, oversized
    or misdirected delivery that admitted a Run (or wrote anything) would let whoever reaches the
    port run jobs."""
    plane, settings = hooked
    db = settings.parent / "q.db"
    before = store_dump(db)
    body = b'{"ref": "main"}'
    now = int(time.time())
    cases = [
        ("bad signature", "/api/v1/hooks/ops/gh", dict(secret=OTHER), 401),
        ("old timestamp", "/api/v1/hooks/ops/gh", dict(ts=str(now - 301)), 401),
        ("future timestamp", "/api/v1/hooks/ops/gh", dict(ts=str(now + 400)), 401),
        ("timestamp not digits", "/api/v1/hooks/ops/gh", dict(ts=f" {now}"), 401),
        ("no signature", "/api/v1/hooks/ops/gh", dict(headers={"X-Qinglong-Signature": ""}), 401),
        ("unknown trigger", "/api/v1/hooks/ops/nope", {}, 404),
        ("unknown project", "/api/v1/hooks/nope/gh", {}, 404),
        ("another project's trigger", "/api/v1/hooks/ops/web-hook", dict(secret=OTHER), 404),
        ("not a hook", "/api/v1/hooks/ops/clock", {}, 404),
        ("disabled trigger", "/api/v1/hooks/ops/gh-off", {}, 409),
        ("no delivery id", "/api/v1/hooks/ops/gh", dict(delivery=""), 400),
    ]
    for name, path, options, expected in cases:
        status, answer = _post(plane.port, path, body, **options)
        assert status == expected, (name, status, answer)
        assert SECRET not in json.dumps(answer) and OTHER not in json.dumps(answer), name
    status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", b"x" * 16_385)
    assert status == 413, answer
    assert store_dump(db) == before, "a refused delivery changed the store"


def test_a_replay_after_the_window_is_refused_and_within_it_is_the_same_run(hooked):
    """A captured delivery replayed: within the window the delivery id makes it the same Run;
    re-signed with an old timestamp it is refused. Without both, a replay would start jobs."""
    plane, settings = hooked
    status, first = _post(plane.port, "/api/v1/hooks/ops/gh", b"{}", delivery="r-1")
    assert status == 202
    before = _admissions(settings.parent / "q.db")
    stale = str(int(time.time()) - 3600)
    assert _post(plane.port, "/api/v1/hooks/ops/gh", b"{}", delivery="r-2", ts=stale)[0] == 401
    assert _post(plane.port, "/api/v1/hooks/ops/gh", b"{}", delivery="r-1") == (200, {**first, "created": False})
    assert _admissions(settings.parent / "q.db") == before


def test_deliveries_over_the_rate_are_refused_without_a_run(hooked):
    """A sender (or a leaked secret) flooding one hook would queue unbounded Runs without a
    per-trigger rate."""
    plane, settings = hooked
    db = settings.parent / "q.db"
    accepted = 0
    for i in range(7):  # 3 a minute: a 429 comes by the 7th even if one minute turns over
        before = _admissions(db)
        # each its own body: one signature opens one delivery only
        status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", b'{"n": %d}' % i, delivery=f"f-{i}")
        if status == 429:
            assert answer["error"]["code"] == "rate_limited"
            assert _admissions(db) == before, "a refused delivery changed the store"
            break
        assert status == 202, answer
        accepted += 1
    else:
        raise AssertionError("seven deliveries in a row were all accepted")
    assert 3 <= accepted <= 6


def test_the_delivery_body_reaches_the_job_as_its_event_file(hooked):
    """The job reads what the sender posted from $QINGLONG_EVENT_FILE; without it a hook could
    start a job but never tell it what happened."""
    plane, settings = hooked
    body = b'{"ref": "refs/heads/main", "note": "caf\xc3\xa9"}'
    status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", body, delivery="body-1")
    assert status == 202, answer
    token = make_token(settings, "reader", "read")
    client = Client(plane.port, token)
    try:
        wait_until(lambda: client.request("GET", f"/api/v1/runs/{answer['run_id']}")[1]["state"]
                   == "succeeded", "the hook's Run to end", timeout=60, every=0.1, alive=plane.process)
        status, log, _ = client.request("GET", f"/api/v1/runs/{answer['run_id']}/log")
    finally:
        client.close()
    printed = (log if isinstance(log, bytes) else json.dumps(log).encode()).decode("utf-8")
    assert printed.endswith("ran\n"), printed
    event = json.loads(printed[:-len("ran\n")])
    assert event == {"body": body.decode("utf-8"), "content_type": "application/json", "delivery": "body-1"}


def test_a_missing_or_short_secret_is_refused_by_name_never_quoted(tmp_path):
    """A hook with a guessable secret, or one added without it, would be open to anyone; the
    refusal must not print the value it refuses (it is meant to be a secret)."""
    from host_helpers import run_cli

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "job", "--", "true")
    short = "short-secret-value"
    for env, expected in ((child_env(), "the environment has no variable 'HOOK_SECRET'"),
                          (child_env(HOOK_SECRET=short), "secret: expected 32 to 256 printable ASCII")):
        done = run_cli(["--settings", str(settings), "trigger", "add", "ops", "gh", "--task", "job",
                        "--hook-secret-env", "HOOK_SECRET"], cwd=tmp_path, env=env)
        assert done.returncode == 3 and expected in done.stderr, done.stderr
        assert short not in done.stderr + done.stdout
    assert json.loads(cli(settings, "trigger", "list", "--json")) == []


def test_export_masks_a_hooks_secret_unless_asked(tmp_path):
    """An export is shared and committed; one that printed a hook's secret would let whoever reads
    it start the job at will."""
    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "job", "--", "true")
    cli(settings, "trigger", "add", "ops", "gh", "--task", "job", "--hook-secret-env", "HOOK_SECRET",
        env=child_env(HOOK_SECRET=SECRET))
    masked = cli(settings, "export")
    assert SECRET not in masked and 'secret = "********"' in masked
    assert SECRET in cli(settings, "export", "--with-secrets")


def _raw_delivery(port, body, headers):
    """A delivery sent as raw bytes, so a header can come twice; the status and the parsed answer."""
    import socket

    head = (f"POST /api/v1/hooks/ops/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n")
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    return int(answer.split(b" ", 2)[1]), json.loads(answer.split(b"\r\n\r\n", 1)[1])


def test_a_captured_delivery_replayed_under_another_delivery_id_admits_nothing(hooked):
    """The delivery id is not signed: whoever captured one signed delivery (a proxy's log, a
    sender's debug output) could send it again within the window under fresh delivery ids and
    start the job once per id. A signature accepted once opens no other delivery; the same
    delivery again is still its one Run, and nothing is written for the replays."""
    plane, settings = hooked
    db = settings.parent / "q.db"
    body, ts = b'{"ref": "main"}', str(int(time.time()))
    status, first = _post(plane.port, "/api/v1/hooks/ops/gh", body, ts=ts, delivery="cap-1")
    assert status == 202, first
    before = _admissions(db)
    for delivery in ("cap-2", "cap-3"):
        status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", body, ts=ts, delivery=delivery)
        assert status == 401 and answer["error"]["code"] == "replayed", (delivery, status, answer)
    assert _post(plane.port, "/api/v1/hooks/ops/gh", body, ts=ts, delivery="cap-1") == (
        200, {**first, "created": False})
    assert _admissions(db) == before, "a replayed delivery admitted a Run"


def test_a_signature_timestamp_or_delivery_header_sent_twice_is_refused(hooked):
    """Two signature, timestamp or delivery headers are read by one layer as the first and by
    another (a proxy, a log) as the last: a delivery whose checked header is not the one an
    operator sees, or whose key is not the id the sender meant, would start jobs nobody can
    trace. Each is refused 400 and nothing is written."""
    plane, settings = hooked
    db = settings.parent / "q.db"
    before = store_dump(db)
    body, ts = b'{"ref": "main"}', str(int(time.time()))
    good = signature(SECRET, ts, body)
    cases = {
        "a bad signature, then a good one": [("X-Qinglong-Signature", "sha256=00"), ("X-Qinglong-Signature", good),
                                             ("X-Qinglong-Timestamp", ts), ("X-Qinglong-Delivery", "two-1")],
        "a good signature, then a bad one": [("X-Qinglong-Signature", good), ("X-Qinglong-Signature", "sha256=00"),
                                             ("X-Qinglong-Timestamp", ts), ("X-Qinglong-Delivery", "two-2")],
        "two timestamps": [("X-Qinglong-Signature", good), ("X-Qinglong-Timestamp", ts),
                           ("X-Qinglong-Timestamp", "1"), ("X-Qinglong-Delivery", "two-3")],
        "two delivery ids": [("X-Qinglong-Signature", good), ("X-Qinglong-Timestamp", ts),
                             ("X-Qinglong-Delivery", "two-4"), ("X-Qinglong-Delivery", "two-5")],
    }
    for name, headers in cases.items():
        status, answer = _raw_delivery(plane.port, body, headers)
        assert status == 400 and answer["error"]["code"] == "doubled_header", (name, status, answer)
    assert store_dump(db) == before, "a delivery with a doubled header changed the store"


def test_the_status_page_shows_a_hook_trigger_as_never_due(hooked):
    """A hook trigger's schedule is never due (its next fire time is the far-future sentinel):
    a status page that failed on it (500) would hide every schedule, failing task and Run from
    the operator for as long as one hook trigger exists."""
    plane, settings = hooked
    client = Client(plane.port, make_token(settings, "reader", "read"))
    before = store_dump(settings.parent / "q.db")
    try:
        status, page, _ = client.request("GET", "/status")
    finally:
        client.close()
    assert status == 200, (status, page)
    text = page.decode()
    assert "<td>ops/gh</td><td>never</td>" in text and SECRET not in text, text
    assert store_dump(settings.parent / "q.db") == before, "reading the page changed the store"


def _file_bytes(db) -> bytes:
    """The database as a copy of it holds it: the file and its write-ahead log, byte for byte."""
    data = b""
    for suffix in ("", "-wal", "-journal"):
        path = f"{db}{suffix}"
        if os.path.exists(path):
            with open(path, "rb") as handle:
                data += handle.read()
    return data


def _stored_secret(db, trigger_id):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT spec_json FROM triggers WHERE trigger_id = ?", (trigger_id,)).fetchone()
        return json.loads(row[0])["secret"]
    finally:
        conn.close()


def test_a_sealed_secret_verifies_deliveries_and_no_file_holds_it(hooked):
    """If the secret were stored in clear, a copy of the database file (a backup, a support
    bundle) would let anyone sign deliveries; sealed, the running plane must still open it to
    accept the right signature and refuse a wrong one."""
    plane, settings = hooked
    db = settings.parent / "q.db"
    assert _stored_secret(db, "gh").startswith("ql-sealed:v1:")
    data = _file_bytes(db)
    assert SECRET.encode() not in data and OTHER.encode() not in data
    before = store_dump(db)
    status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", b"{}", secret=OTHER, delivery="w-1")
    assert status == 401 and answer["error"]["code"] == "bad_signature", answer
    assert store_dump(db) == before, "a wrongly signed delivery changed the store"
    status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", b"{}", delivery="s-1")
    assert status == 202 and answer["created"] is True, answer
    status, answer = _post(plane.port, "/api/v1/hooks/web/web-hook", b"{}", secret=OTHER, delivery="s-2")
    assert status == 202, answer
    assert SECRET.encode() not in _file_bytes(db)


def test_a_secret_in_clear_of_an_older_store_is_sealed_at_start(published_store, tmp_path):
    """A store written before trigger secrets were sealed: if the start did not seal the secret,
    the file would keep showing it after the upgrade; the hook must keep verifying with it."""
    shutil.copytree(published_store, tmp_path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("settings.toml"))
    settings = api_settings(tmp_path, http=HOOK_HTTP)
    db = tmp_path / "q.db"
    conn = sqlite3.connect(db)
    try:  # as an older version wrote it (the digest was of the same spec in clear)
        spec = json.dumps({"per_minute": 3, "secret": SECRET, "window_s": 300}, separators=(",", ":"))
        with conn:
            conn.execute("UPDATE triggers SET spec_json = ? WHERE trigger_id = 'gh'", (spec,))
    finally:
        conn.close()
    assert SECRET.encode() in _file_bytes(db)
    plane = Plane(settings)
    try:
        assert _stored_secret(db, "gh").startswith("ql-sealed:v1:")
        assert SECRET.encode() not in _file_bytes(db)
        status, answer = _post(plane.port, "/api/v1/hooks/ops/gh", b"{}", delivery="o-1")
        assert status == 202, answer
        assert _post(plane.port, "/api/v1/hooks/ops/gh", b"{}", secret=OTHER, delivery="o-2")[0] == 401
    finally:
        plane.stop()
    listed = json.loads(cli(settings, "trigger", "list", "ops", "--json"))
    assert SECRET not in json.dumps(listed)


def test_a_start_with_another_key_is_refused_not_served_in_clear(published_store, tmp_path):
    """If a plane started with a key that does not open the sealed secret, every delivery would
    fail late, or a fallback would take the sealed text for the secret; the start is refused
    (exit 6) naming the key, never a value."""
    shutil.copytree(published_store, tmp_path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("settings.toml"))
    settings = api_settings(tmp_path, http=HOOK_HTTP)
    key = tmp_path / "q.db.key"
    key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    done = run_cli(["--settings", str(settings), "run"], cwd=tmp_path, env=child_env())
    assert done.returncode == 6, (done.returncode, done.stderr)
    assert "sealed under key" in done.stderr and SECRET not in done.stderr + done.stdout
