"""``GET /api/v1/notifications`` over real TCP against a real ``qinglong run``: the deliveries of
the events out, filtered by state and paged, for a read token; refused to a token limited to some
projects (deliveries span every project and the operator's own events)."""

from __future__ import annotations

from api_helpers import Client, Plane, api_settings, cli, make_token, store_dump
from host_helpers import wait_until

SECRET = "channel-secret-0123456789"
#: A channel no receiver answers on (port 9, discard, is closed here): one try, then dead.
CHANNEL = ('[notifications]\ndefault = "always"\nmax_tries = 1\npoll_ms = 50\n'
           '[notifications.channels.hook]\nkind = "webhook"\nurl = "http://127.0.0.1:9/x"\n'
           f'secret = "{SECRET}"\n')


def test_deliveries_are_listed_by_state_and_paged_and_hidden_from_project_tokens(tmp_path):
    """Without the route an operator on the API could not see that notifications die; a page
    that skipped or repeated a delivery, or a state filter that leaked others, would misreport
    them; a project-limited token reading them would see other projects' runs."""
    settings = api_settings(tmp_path, http='listen = "127.0.0.1:0"', extra=CHANNEL)
    cli(settings, "project", "create", "ops")
    cli(settings, "project", "create", "web")
    cli(settings, "task", "put", "ops", "job", "--", "sh", "-c", "echo done")
    for key in ("k1", "k2", "k3"):
        cli(settings, "task", "run", "ops", "job", "--idempotency-key", key)
    read = make_token(settings, "reader", "read")
    web = make_token(settings, "webteam", "admin", "web")
    plane = Plane(settings)
    client = Client(plane.port, read)
    try:
        def dead():
            status, body, _ = client.request("GET", "/api/v1/notifications?state=dead")
            return status == 200 and len(body["deliveries"]) == 3 and body

        everything = wait_until(dead, "three dead deliveries", timeout=60, every=0.1,
                                alive=plane.process)
        assert {(d["channel"], d["kind"], d["state"], d["tries"]) for d in everything["deliveries"]} == {
            ("hook", "run.succeeded", "dead", 1)}
        ids = [d["event_id"] for d in everything["deliveries"]]
        status, first, _ = client.request("GET", "/api/v1/notifications?state=dead&limit=2")
        assert status == 200 and first["next"] == "2"
        status, second, _ = client.request("GET", "/api/v1/notifications?state=dead&limit=2&cursor=2")
        assert status == 200 and second["next"] is None
        assert [d["event_id"] for d in first["deliveries"] + second["deliveries"]] == ids
        status, delivered, _ = client.request("GET", "/api/v1/notifications?state=delivered")
        assert (status, delivered) == (200, {"deliveries": [], "next": None})
        before = store_dump(tmp_path / "q.db")
        status, refused, _ = client.request("GET", "/api/v1/notifications?state=bogus")
        assert status == 422 and "pending, delivered, dead" in str(refused)
        assert client.request("GET", "/api/v1/notifications", token=web)[0] == 403
        assert client.request("GET", "/api/v1/notifications", token="")[0] == 401
        assert SECRET not in str(everything)
        assert store_dump(tmp_path / "q.db") == before
        status, doc, _ = client.request("GET", "/api/v1/openapi.json")
        assert "get" in doc["paths"]["/api/v1/notifications"]
    finally:
        client.close()
        plane.stop()
