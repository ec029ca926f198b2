"""The console's session bounds, over real HTTP against ``qinglong run``: a principal signing in
again and again ends only its own oldest sessions, and a full console refuses new sign-ins
instead of signing anyone out."""

from __future__ import annotations

import http.client
import json

from api_helpers import Client, Plane, api_settings, cli, make_token

#: What the console keeps at most: per principal, and in all (qinglong/host/http/console.py).
PER_PRINCIPAL = 16
ALL = 1024


def _sign_in(port: int, token: str) -> tuple[int, dict, str | None]:
    """``POST /console/session``: the status, the body and the session cookie (name=value)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/console/session", body=json.dumps({"token": token}).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = json.loads(response.read() or b"null")
        cookie = response.getheader("Set-Cookie")
        return response.status, body, cookie.split(";", 1)[0] if cookie else None
    finally:
        conn.close()


def _who(client: Client, cookie: str) -> tuple[int, dict]:
    status, body, _ = client.request("GET", "/console/session", headers={"Cookie": cookie})
    return status, body


def test_a_lesser_token_signing_in_many_times_never_signs_the_admin_out(tmp_path):
    """Without it any valid token, a read-only one too, signed in 1,025 times and so signed out
    every other browser of the console, the admin's first: one script held the operators out of
    their own console for as long as it ran (and a sign-in then a sign-out of someone else is a
    session fixation's first step)."""
    settings = api_settings(tmp_path)
    admin = make_token(settings, "root", "admin")
    reader = make_token(settings, "viewer", "read")
    plane = Plane(settings)
    client = Client(plane.port)
    try:
        status, signed, admin_cookie = _sign_in(plane.port, admin)
        assert status == 200 and admin_cookie is not None
        cookies = []
        for _ in range(ALL + 8):
            status, body, cookie = _sign_in(plane.port, reader)
            assert status == 200, body
            cookies.append(cookie)
        # the admin's session is still there, with its CSRF token
        status, who = _who(client, admin_cookie)
        assert status == 200 and (who["name"], who["scope"], who["csrf"]) == ("root", "admin", signed["csrf"]), who
        # the reader's newest sessions live, its oldest were ended: its own cap, not the console's
        assert all(_who(client, c)[0] == 200 for c in cookies[-PER_PRINCIPAL:])
        assert _who(client, cookies[-PER_PRINCIPAL - 1])[0] == 401
        assert _who(client, cookies[0])[0] == 401
    finally:
        client.close()
        plane.stop()


def test_a_full_console_refuses_new_sign_ins_and_signs_nobody_out(tmp_path):
    """Without it the sessions of many tokens together filled the console and each new sign-in
    signed out the least recently used browser, whoever's it was: a handful of tokens signing in
    in a loop evicted the admin. A refusal that did not say why would read as a wrong token; a
    one-time link used up by a refused sign-in would be lost."""
    settings = api_settings(tmp_path)
    admin = make_token(settings, "root", "admin")
    plane = Plane(settings)
    client = Client(plane.port, admin)
    bare = Client(plane.port)
    try:
        status, _, admin_cookie = _sign_in(plane.port, admin)
        assert status == 200
        tokens = []
        for n in range(ALL // PER_PRINCIPAL):
            status, made, _ = client.request("POST", "/api/v1/tokens", {"name": f"t{n}", "scope": "read"})
            assert status == 201, made
            tokens.append(made["secret"])
        first = None
        refused = []
        for token in tokens:
            for _ in range(PER_PRINCIPAL):
                status, body, cookie = _sign_in(plane.port, token)
                if status == 200:
                    first = first or cookie
                else:
                    refused.append((status, body, cookie))
        # the admin's session took one place: the last sign-in found the console full
        assert len(refused) == 1, refused
        status, body, cookie = refused[0]
        assert status == 503 and cookie is None and body["error"]["code"] == "sessions_full", body
        assert "1024" in body["error"]["message"] and "sign" in body["error"]["message"]
        assert _who(bare, admin_cookie)[0] == 200
        assert _who(bare, first)[0] == 200

        # a one-time link is refused before its code is used up, and works once there is room
        base = f"http://127.0.0.1:{plane.port}"
        made = json.loads(cli(settings, "console", "link", "--url", base, "--json"))
        path = made["url"][len(base):]
        conn = http.client.HTTPConnection("127.0.0.1", plane.port, timeout=60)
        conn.request("GET", path)
        response = conn.getresponse()
        page = response.read().decode()
        assert response.status == 503 and response.getheader("Set-Cookie") is None and "sessions" in page
        conn.close()
        status, _, _ = bare.request("DELETE", "/console/session",
                                    headers={"Cookie": first, "X-CSRF-Token": _who(bare, first)[1]["csrf"]})
        assert status == 204
        conn = http.client.HTTPConnection("127.0.0.1", plane.port, timeout=60)
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        assert response.status == 303 and response.getheader("Set-Cookie") is not None
        conn.close()
        assert _who(bare, admin_cookie)[0] == 200
    finally:
        client.close()
        bare.close()
        plane.stop()
