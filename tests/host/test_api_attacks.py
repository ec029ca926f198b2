"""The management API under attack, over real TCP: every request answered as expected, and the
store (every row of every table, the audit log included) the same before and after.

Also: a walk over every route of the application proving deny by default."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from api_helpers import Client, Plane, api_settings, cli, make_token, store_dump
from host_helpers import wait_until

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


def _raw(port: int, data: bytes, *, source: str = "127.0.0.1", timeout: float = 60) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.fixture
def attacked(tmp_path):
    """A plane with a project, a task, a Run and three tokens; the store dumped once it settled."""
    settings = api_settings(tmp_path, http='listen = "127.0.0.1:0"\nrequest_timeout_ms = 20000\nmax_body_bytes = 65536',
                            extra="failed_auth_burst = 20\nfailed_auth_per_second = 0.01\n")
    cli(settings, "project", "create", "ops")
    cli(settings, "project", "create", "web")
    cli(settings, "task", "put", "ops", "job", "--env", "API_KEY=hunter2-value", "--", "sh", "-c", "echo done")
    cli(settings, "task", "run", "ops", "job", "--idempotency-key", "k1")
    tokens = {"read": make_token(settings, "reader", "read"), "write": make_token(settings, "writer", "write"),
              "web": make_token(settings, "webteam", "admin", "web")}
    plane = Plane(settings)
    client = Client(plane.port, tokens["read"])
    wait_until(lambda: client.request("GET", "/api/v1/runs")[1]["runs"][0]["state"] == "succeeded",
               "the Run to end", timeout=60, every=0.1, alive=plane.process)
    client.close()
    # the delivery loop routes the Run's end event after the Run ended: a dump taken before it
    # did would see the store change under the test without any request changing it
    wait_until(lambda: _events_settled(tmp_path / "q.db"), "the Run's end event to be routed",
               timeout=60, every=0.1, alive=plane.process)
    try:
        yield plane, settings, tokens, store_dump(tmp_path / "q.db")
    finally:
        plane.stop()


def _events_settled(db) -> bool:
    """No outbox event waits to be routed and no delivery to be tried."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT (SELECT count(*) FROM event_outbox WHERE routed_at_ms IS NULL) + "
                            "(SELECT count(*) FROM event_deliveries WHERE state = 'pending')").fetchone()[0] == 0
    finally:
        conn.close()


def _add_nightly(settings, plane) -> None:
    """Add the trigger ``ops/nightly`` and wait until the running plane has computed its first
    fire time: a dump taken before that would see the scheduler's write as the attack's."""
    import sqlite3

    cli(settings, "trigger", "add", "ops", "nightly", "--task", "job", "--cron", "0 0 1 1 *")

    def scheduled() -> bool:
        conn = sqlite3.connect(f"file:{settings.parent / 'q.db'}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT next_fire_at_ms FROM trigger_schedules WHERE trigger_id = 'nightly'").fetchone()
        finally:
            conn.close()
        return row is not None and row[0] is not None
    wait_until(scheduled, "the plane to schedule the new trigger", timeout=60, every=0.1, alive=plane.process)


def _unchanged(settings, before):
    assert store_dump(settings.parent / "q.db") == before, "the store changed"


def test_path_variants_never_reach_a_route_without_its_token(attacked):
    """If the component that decides protection parsed a path differently from the router (case,
    doubled slashes, dot segments, encoded slashes), an unauthenticated request would publish a
    task and run it: the hole that let attackers reset admins and run miners elsewhere."""
    plane, settings, tokens, before = attacked
    body = b'{"payload": {"command": ["sh", "-c", "id > /tmp/pwned"]}}'
    variants = ["/api/v1/projects/ops/tasks/evil", "/API/v1/projects/ops/tasks/evil", "/Api/V1/projects/ops/tasks/evil",
                "//api/v1/projects/ops/tasks/evil", "/api//v1/projects/ops/tasks/evil",
                "/api/v1/projects/ops/tasks/evil/", "/api/v1/./projects/ops/tasks/evil",
                "/api/v1/x/../projects/ops/tasks/evil", "/api/v1/%2e%2e/v1/projects/ops/tasks/evil",
                "/api/v1/projects%2Fops%2Ftasks%2Fevil", "/api/v1/%70rojects/ops/tasks/evil",
                "/api/v1/projects/ops/tasks/evil;x=1", "/livez/../api/v1/projects/ops/tasks/evil",
                "/livez?/api/v1/projects/ops/tasks/evil", "/api/v1/projects/ops/tasks/" + "e" * 3000]
    for path in variants:
        answer = _raw(plane.port, f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                      "Connection: close\r\n\r\n".encode() + body)
        assert _status(answer) in (400, 401, 405), (path, answer[:200])
        answer = _raw(plane.port, f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                      f"Authorization: Bearer {tokens['read']}\r\nConnection: close\r\n\r\n".encode() + body)
        assert _status(answer) in (400, 403, 404, 405, 422), (path, answer[:200])
    invalid = _raw(plane.port, b"GET /api/v1/projects/\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _status(invalid) in (400, 401), invalid
    overlong = _raw(plane.port, b"GET /api/v1/" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status(overlong) in (400, 414, 431), overlong[:100]
    _unchanged(settings, before)


def test_an_encoded_slash_is_refused_before_routing_even_with_a_token_that_may_publish(attacked):
    """Routed by its decoded path, ``/api/v1/projects%2Fops%2Ftasks%2Fevil`` published a task with
    a token that may publish, and a worker's ``/worker%2Fv1%2F...`` reached the gateway: a proxy in front
    whose rules read the path as sent (deny /api/ from outside, say) would have let them through
    to a route it never saw. Refused as sent, whoever asks, and nothing changes."""
    plane, settings, tokens, before = attacked
    body = b'{"payload": {"command": ["sh", "-c", "id > /tmp/pwned"]}}'
    for path in ("/api/v1/projects%2Fops%2Ftasks%2Fevil", "/api/v1/projects%2fops/tasks/evil",
                 "/api%2Fv1/projects/ops/tasks/evil", "/api/v1/projects/ops%5Ctasks/evil",
                 "/worker%2Fv1%2Fopen_session"):
        answer = _raw(plane.port, f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                      f"Authorization: Bearer {tokens['write']}\r\nConnection: close\r\n\r\n".encode() + body)
        assert _status(answer) == 400 and b"encoded slash" in answer, (path, answer[:300])
    # the same request as sent without encoding is the route's, as always
    answer = _raw(plane.port, f"GET /api/v1/projects/ops/tasks HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {tokens['write']}\r\nConnection: close\r\n\r\n".encode())
    assert _status(answer) == 200, answer[:300]
    _unchanged(settings, before)


def test_method_override_head_options_trace_and_authorization_variants(attacked):
    """A method-override header honoured anywhere turns a read token's POST into a DELETE; a TRACE
    echo reflects the token; a second Authorization header could be read by one layer and not
    another; an expired or another project's token that still worked outlives its purpose."""
    plane, settings, tokens, before = attacked
    client = Client(plane.port)
    try:
        for header in ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"):
            status, _, _ = client.request("POST", "/api/v1/projects/ops", headers={header: "DELETE"},
                                          token=tokens["read"])
            assert status == 405, header
            status, _, _ = client.request("GET", "/api/v1/projects/ops", headers={header: "DELETE"},
                                          token=tokens["write"])
            assert status == 200
        for method in ("HEAD", "OPTIONS", "TRACE", "PATCH", "CONNECTX"):
            status, body, response = client.request(method, "/api/v1/projects")
            assert status == 401, method
        status, body, _ = client.request("TRACE", "/api/v1/projects", token=tokens["read"])
        assert status == 405 and tokens["read"] not in str(body)
        status, body, _ = client.request("HEAD", "/api/v1/projects", token=tokens["read"])
        assert (status, body) == (200, None)
        status, _, _ = client.request("OPTIONS", "/api/v1/projects", token=tokens["read"])
        assert status == 405
        read = tokens["read"]
        doubled = _raw(plane.port, f"DELETE /api/v1/projects/ops HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {read}\r\n"
                       f"Authorization: Bearer {tokens['write']}\r\nConnection: close\r\n\r\n".encode())
        assert _status(doubled) == 401
        lower = _raw(plane.port, f"GET /api/v1/projects HTTP/1.1\r\nhost: x\r\nauthorization: bearer {read}\r\n"
                     "connection: close\r\n\r\n".encode())
        assert _status(lower) == 200  # header names and the scheme are case-insensitive, the token is not
        for value in (read.upper(), f"Basic {read}", read, f"Bearer {read} extra", "Bearer", "Bearer  "):
            assert client.request("GET", "/api/v1/projects", headers={"Authorization": value})[0] == 401, value
        status, body, _ = client.request("DELETE", "/api/v1/projects/ops", token=tokens["web"])
        assert status == 404 and body["error"]["code"] == "unknown"
        status, _, _ = client.request("GET", "/api/v1/runs?project=ops", token=tokens["web"])
        assert status == 404
    finally:
        client.close()
    _unchanged(settings, before)


def test_a_token_revoked_between_two_requests_of_one_connection_fails_the_second(attacked):
    """A revocation that waited for the connection to close would leave a stolen token working for
    as long as the thief keeps one connection open; an expired token must fail the same way."""
    plane, settings, tokens, before = attacked
    client = Client(plane.port, tokens["write"])
    try:
        assert client.request("GET", "/api/v1/projects")[0] == 200
        sock = client.conn.sock
        cli(settings, "token", "revoke", "writer")
        status, body, _ = client.request("DELETE", "/api/v1/projects/web")
        assert client.conn.sock is sock, "the same connection"
        assert status == 401 and body["error"]["code"] == "unauthorized"
    finally:
        client.close()
    made = cli(settings, "token", "create", "brief", "--scope", "write", "--expires", "1s").strip()
    expiring = Client(plane.port, made)
    try:
        wait_until(lambda: expiring.request("GET", "/api/v1/projects")[0] == 401, "the token to expire",
                   timeout=60, every=0.2)
        assert expiring.request("DELETE", "/api/v1/projects/web")[0] == 401
    finally:
        expiring.close()
    after = store_dump(settings.parent / "q.db")
    changed = [row for row in after if row not in before]
    assert all(row[0] in ("api_tokens", "audit_log", "sqlite_sequence") for row in changed), changed  # the CLI's
    assert not any(row[0] == "projects" for row in before if row not in after)


def test_oversized_nested_slow_and_smuggled_requests_change_nothing(attacked):
    """A body parser without bounds is a memory or recursion bomb on a router; a slow client pins a
    connection; a request smuggled behind Content-Length and Transfer-Encoding runs unauthenticated
    inside an authenticated one."""
    plane, settings, tokens, before = attacked
    write = tokens["write"]
    client = Client(plane.port, write)
    try:
        status, body, _ = client.request("POST", "/api/v1/projects", b"{" + b" " * 70000 + b"}")
        assert status == 413
        nested = b'{"project_id": "deep", "name": ' + b"[" * 10000 + b"]" * 10000 + b"}"
        status, body, _ = client.request("POST", "/api/v1/projects", nested)
        assert status == 422 and "nested" in body["error"]["message"]
        status, _, _ = client.request("POST", "/api/v1/projects", b"\xff\xfe{}")
        assert status == 422
        status, _, _ = client.request("POST", "/api/v1/projects", b'{"project_id": NaN}')
        assert status == 422
    finally:
        client.close()
    started = time.monotonic()
    slow = _raw(plane.port, b"POST /api/v1/projects HTTP/1.1\r\nHost: x\r\nAuthori")
    assert _status(slow) == 408 and time.monotonic() - started < 60
    slow_body = _raw(plane.port, f"POST /api/v1/projects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {write}\r\n"
                     "Content-Length: 40\r\n\r\n{\"project_id\": ".encode())
    assert _status(slow_body) in (0, 408, 422), slow_body  # cut, never created
    smuggled = (f"POST /api/v1/projects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tokens['read']}\r\n"
                "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                "DELETE /api/v1/projects/web HTTP/1.1\r\nHost: x\r\n\r\n").encode()
    answer = _raw(plane.port, smuggled)
    assert _status(answer) in (400, 411) and answer.count(b"HTTP/1.1 ") == 1, answer
    te_only = (f"DELETE /api/v1/projects/web HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {write}\r\n"
               "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode()
    assert _status(_raw(plane.port, te_only)) == 411
    _unchanged(settings, before)


def test_a_thousand_bad_tokens_from_one_address_are_refused_without_slowing_others(attacked):
    """Guessing tokens without limit finds one eventually; a limit that also refused other
    addresses would let one scanner lock every operator out."""
    plane, settings, tokens, before = attacked
    client = Client(plane.port)
    statuses = []
    try:
        for n in range(1000):
            statuses.append(client.request("GET", "/api/v1/projects", token=f"qlt_guess{n:04d}")[0])
        assert set(statuses[:20]) == {401} and set(statuses[20:]) == {429}, statuses[:25]
        other = Client(plane.port, tokens["read"])
        other.conn.source_address = ("127.0.0.3", 0)
        try:
            assert other.request("GET", "/api/v1/projects")[0] == 200
        finally:
            other.close()
        assert client.request("GET", "/livez", token="qlt_guess")[0] == 200  # the probes stay open
    finally:
        client.close()
    _unchanged(settings, before)


def test_every_route_denies_by_default(tmp_path):
    """A route added without its protection (or a changing route a read token may call) is the
    unauthenticated endpoint that gets a control plane taken over; this walks every route the
    application has, whatever it is, rather than a list someone must remember to extend."""
    from qinglong.host.containers import build_container
    from qinglong.host.http.app import (
        PUBLIC,
        PUBLIC_CHANGING,
        PUBLIC_PATHS,
        READ_CHANGING,
        SAFE_METHODS,
        SIGNED,
        SIGNED_PATHS,
    )
    from qinglong.host.settings import load_settings

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    read = make_token(settings, "reader", "read")

    async def scenario() -> list[tuple]:
        lifecycle = build_container(load_settings(settings)).lifecycle()
        await lifecycle.start()
        try:
            (surface,) = [c for c in lifecycle._started if c.name == "http"]
            routes = surface.app.routes
            assert len(routes) >= 20
            loop = asyncio.get_running_loop()
            seen = []
            for route in routes:
                spec = route.app.qinglong_route
                path = spec.path.replace("{project}", "ops").replace("{task}", "t").replace(
                    "{trigger}", "g").replace("{run}", "r").replace("{name}", "n")
                for method in METHODS:
                    declared = spec.methods.get("GET" if method == "HEAD" else method)
                    bare = await loop.run_in_executor(None, _one, surface.port, method, path, None)
                    with_read = await loop.run_in_executor(None, _one, surface.port, method, path, read)
                    seen.append((method, spec.path, declared.scope if declared else None, bare, with_read))
            return seen
        finally:
            await lifecycle.stop()

    seen = asyncio.run(scenario())
    for method, path, scope, bare, with_read in seen:
        if scope == PUBLIC:
            assert path in PUBLIC_PATHS, (method, path)
            if path == "/console/link":  # no code is no link; a HEAD uses nothing up
                assert bare == with_read == (404 if method == "GET" else 405), (method, path, bare)
                continue
            if (method, path) in PUBLIC_CHANGING:  # the console's sign-in: no token in "{}"
                assert bare == with_read == 422, (method, path, bare)
                continue
            assert bare == with_read and bare == 200, (method, path, bare)
            continue
        if path in PUBLIC_PATHS and scope is None:  # a method the public path does not serve
            assert bare == with_read == 405, (method, path, bare)
            continue
        if path in SIGNED_PATHS and scope == SIGNED:
            # proven by a signature, not a token: a token changes nothing, and no such hook is 404
            assert bare == with_read == 404, (method, path, bare, with_read)
            continue
        assert bare == 401, (method, path, bare)
        if method not in SAFE_METHODS and (method, path) not in READ_CHANGING:
            assert with_read in (403, 405), (method, path, with_read)
        if scope == "admin":
            assert with_read == 403, (method, path, with_read)
    assert {p for _, p, *_ in seen} >= {"/api/v1/projects", "/api/v1/runs", "/metrics", "/status", "/",
                                        "/console/session", *SIGNED_PATHS}
    assert {s for _, p, s, *_ in seen if p in SIGNED_PATHS} == {None, SIGNED}


def _one(port: int, method: str, path: str, token: str | None) -> int:
    client = Client(port, token)
    try:
        return client.request(method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None)[0]
    finally:
        client.close()


def test_numbers_in_a_query_are_ascii_digits_of_bounded_length(attacked):
    """``str.isdigit`` is true for ``²`` and for 5,000 digits, which ``int`` refuses: a query
    number like that escaped the 422 of every other bad number and became a 500 (an unhandled
    error, logged as a bug), on every route that reads a number from the query."""
    plane, settings, tokens, before = attacked
    client = Client(plane.port, tokens["read"])
    digits = "1" * 5000
    try:
        for path in ("/api/v1/runs?limit=%C2%B2", f"/api/v1/runs?limit={digits}", "/api/v1/runs?cursor=%C2%B2",
                     f"/api/v1/runs?cursor={digits}", "/api/v1/notifications?cursor=%C2%B2",
                     "/api/v1/notifications?limit=%D9%A3", "/api/v1/runs?since_ms=%C2%B9"):
            status, body, _ = client.request("GET", path)
            assert status == 422, (path, status, body)
    finally:
        client.close()
    _unchanged(settings, before)


def test_notifications_refuse_forged_filters_and_project_tokens_and_change_nothing(attacked):
    """The deliveries list takes its filters from the query string: a state or cursor that
    reached the store unchecked, a limit that read it all, or a project-limited token that saw
    every project's deliveries would each be a hole; every refusal must leave the store as it
    was."""
    plane, settings, tokens, before = attacked
    client = Client(plane.port, tokens["read"])
    try:
        for query in ("state=dead'%20OR%201=1--", "state=DEAD", "cursor=-1", "cursor=1e3",
                      "cursor=99999999999", "limit=0", "limit=100000", "limit=x", "state=pending&state=x"):
            status, body, _ = client.request("GET", f"/api/v1/notifications?{query}")
            assert status == 422, (query, status, body)
        assert client.request("GET", "/api/v1/notifications", token=tokens["web"])[0] == 403
        assert client.request("GET", "/api/v1/notifications", token="")[0] == 401
        assert client.request("DELETE", "/api/v1/notifications", token=tokens["write"])[0] == 405
        assert client.request("GET", "/api/v1/notifications?limit=1000")[0] == 200
    finally:
        client.close()
    _unchanged(settings, before)


def test_a_token_limited_to_projects_cannot_mint_read_or_revoke_tokens_nor_read_the_audit(attacked):
    """An admin token limited to one project that could make a token without limits would hold
    every project (publish a task anywhere, run it, read every log); reading or revoking the
    others' tokens, or the audit log of every project, would hand one team the others' names,
    actions and credentials' fate. Each is refused 403 and the store is left as it was."""
    plane, settings, tokens, before = attacked
    client = Client(plane.port, tokens["web"])
    try:
        for method, path, body in (("POST", "/api/v1/tokens", {"name": "escalated", "scope": "admin"}),
                                   ("POST", "/api/v1/tokens", {"name": "webonly", "scope": "read",
                                                               "projects": ["web"]}),
                                   ("GET", "/api/v1/tokens", None),
                                   ("DELETE", "/api/v1/tokens/writer", None),
                                   ("DELETE", "/api/v1/tokens/webteam", None),
                                   ("GET", "/api/v1/audit", None)):
            status, answer, _ = client.request(method, path, body)
            assert status == 403 and answer["error"]["code"] == "forbidden", (method, path, status, answer)
            assert "secret" not in answer and "qlt_" not in json.dumps(answer), (method, path)
    finally:
        client.close()
    _unchanged(settings, before)
    writer = Client(plane.port, tokens["write"])
    try:
        assert writer.request("GET", "/api/v1/projects")[0] == 200, "the writer's token was revoked"
    finally:
        writer.close()


def test_a_token_limited_to_projects_reads_no_status_of_other_projects(attacked):
    """The status (the API's and the page's) names every project's failing tasks, schedules and
    recent Runs, and the metrics every project's tasks with their queue depth: a token of one team
    that read them would learn the other teams' task names, their triggers and how their jobs fail.
    Refused 403, nothing of another project in the answer."""
    plane, settings, tokens, before = attacked
    web_read = make_token(settings, "webreader", "read", "web")
    before = store_dump(settings.parent / "q.db")
    client = Client(plane.port, web_read)
    try:
        for path in ("/api/v1/status", "/status", "/metrics"):
            status, answer, _ = client.request("GET", path)
            assert status == 403, (path, status)
            assert answer["error"]["code"] == "forbidden" and "ops" not in json.dumps(answer), (path, answer)
        status, answer, _ = client.request("GET", "/api/v1/status", token=tokens["read"])
        assert status == 200 and answer["verdict"], answer  # a token of every project still reads it
        status, answer, _ = client.request("GET", "/metrics", token=tokens["read"])
        assert status == 200 and b"# TYPE qinglong_runs_" in answer, answer
    finally:
        client.close()
    _unchanged(settings, before)


def test_a_taken_trigger_id_does_not_name_a_project_the_token_cannot_see(attacked):
    """Trigger ids are unique across projects, so a trigger id another project uses must be
    refused; a refusal naming that project would let one team's token enumerate the other teams'
    projects and triggers id by id. Refused 409 without the name, and nothing changes."""
    plane, settings, tokens, before = attacked
    _add_nightly(settings, plane)
    cli(settings, "task", "put", "web", "site", "--", "true")
    before = store_dump(settings.parent / "q.db")
    client = Client(plane.port, tokens["web"])
    try:
        status, answer, _ = client.request("PUT", "/api/v1/projects/web/triggers/nightly",
                                           {"task_id": "site", "kind": "cron", "spec": {"expression": "0 0 1 1 *"}})
    finally:
        client.close()
    assert status == 409 and answer["error"]["code"] == "conflict", answer
    assert "ops" not in answer["error"]["message"], answer
    after = store_dump(settings.parent / "q.db")
    assert [r for r in before if r not in after and r[0] != "sqlite_sequence"] == []
    added = [r for r in after if r not in before and r[0] != "sqlite_sequence"]  # the refusal's audit entry only
    assert [(r[0], r[6], r[7], r[8]) for r in added] == [("audit_log", "trigger.put", "web/nightly", "refused")], added


def test_a_body_key_the_route_does_not_know_is_refused_by_name(attacked):
    """A misspelt key ignored in silence does the opposite of what was asked: a token meant for one
    project ("project" for "projects") made for every project, a trigger meant to be disabled
    ("enabeld") left firing, a kept env value ("keep-env") dropped. Each is refused 422 naming the
    key, and nothing is made or changed."""
    plane, settings, tokens, before = attacked
    admin = make_token(settings, "root", "admin")
    _add_nightly(settings, plane)
    before = store_dump(settings.parent / "q.db")
    client = Client(plane.port, admin)
    try:
        for method, path, body, key in (
                ("POST", "/api/v1/tokens", {"name": "deploy", "scope": "write", "project": ["web"]}, "project"),
                ("PUT", "/api/v1/projects/ops/triggers/nightly", {"enabeld": False}, "enabeld"),
                ("PUT", "/api/v1/projects/ops/tasks/job", {"payload": {"command": ["true"]}, "keep-env": ["API_KEY"]},
                 "keep-env"),
                ("POST", "/api/v1/projects", {"project_id": "new", "nmae": "New"}, "nmae")):
            status, answer, _ = client.request(method, path, body)
            assert status == 422 and answer["error"]["field"] == key, (method, path, status, answer)
            assert repr(key) in answer["error"]["message"], answer
    finally:
        client.close()
    _unchanged(settings, before)


def test_an_idempotency_key_of_another_projects_run_admits_nothing_and_names_nothing(attacked):
    """Manual idempotency keys are one space for every project: a key another team used would
    answer this token "200, your Run exists" with that team's Run id, so its own job would never
    start while it was told it had, and its keys could be probed to learn the other team's Runs.
    Refused 409 without the other Run's id or project, and no Run is made."""
    plane, settings, tokens, before = attacked
    cli(settings, "task", "put", "web", "site", "--", "true")
    before = store_dump(settings.parent / "q.db")
    (ops_run,) = [row[2] for row in before if row[0] == "manual_run_keys"]
    client = Client(plane.port, tokens["web"])
    try:
        status, answer, _ = client.request("POST", "/api/v1/projects/web/tasks/site/runs",
                                           headers={"Idempotency-Key": "k1"})
    finally:
        client.close()
    assert status == 409 and answer["error"]["code"] == "conflict", (status, answer)
    assert ops_run not in json.dumps(answer) and "ops" not in answer["error"]["message"], answer
    after = store_dump(settings.parent / "q.db")
    assert [r for r in before if r not in after and r[0] != "sqlite_sequence"] == []
    added = [r for r in after if r not in before and r[0] != "sqlite_sequence"]  # the refusal's audit entry only
    assert [(r[0], r[6], r[7], r[8]) for r in added] == [("audit_log", "task.run", "web/site", "refused")], added


def test_a_body_with_a_key_twice_is_refused(attacked):
    """A key given twice is read as the first by one parser (a proxy's filter, an auditor's tool)
    and as the last by ours: a body checked as a read token for one project would make an admin
    token of every project, an env variable reviewed as one value would run with another.
    Refused 422 naming the key, and nothing is made."""
    plane, settings, tokens, before = attacked
    admin = make_token(settings, "root", "admin")
    before = store_dump(settings.parent / "q.db")
    client = Client(plane.port, admin)
    try:
        for path, method, body, key in (
                ("/api/v1/tokens", "POST",
                 b'{"name": "bot", "scope": "read", "projects": ["web"], "scope": "admin", "projects": []}', "scope"),
                ("/api/v1/projects/ops/tasks/job", "PUT",
                 b'{"payload": {"command": ["env"], "env": {"MODE": "dry-run", "MODE": "live"}}}', "MODE")):
            status, answer, _ = client.request(method, path, body)
            assert status == 422 and repr(key) in answer["error"]["message"], (path, status, answer)
    finally:
        client.close()
    _unchanged(settings, before)
