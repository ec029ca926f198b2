"""``GET /api/v1/workers`` on the cluster, over real HTTP against ``qinglong api`` on a real
PostgreSQL: what a token limited to projects sees of the registered workers."""

from __future__ import annotations

import pytest

from api_helpers import ApiProcessPlane, Client, cli, make_token
from tests.support import pg


@pytest.fixture(scope="module")
def database(request):
    server = pg.start_server("pg18")
    request.addfinalizer(server.destroy)
    pg.create_roles(server)
    return server


def _cluster(server, name: str, tmp_path):
    pg.create_database(server, name)
    dsns = {key: server.dsn(role, pg.ROLE_PASSWORDS[role], name) for key, role in (
        ("runtime_dsn", "qinglong_runtime"), ("admin_dsn", "qinglong_admin"), ("owner_dsn", "qinglong_owner"))}
    settings = tmp_path / "cluster.toml"
    settings.write_text('profile = "cluster"\n[backend]\n' + "".join(f'{k} = "{v}"\n' for k, v in dsns.items())
                        + '[http]\nlisten = "127.0.0.1:0"\n')
    cli(settings, "db", "migrate")
    return settings


def _register(settings, name: str, *projects: str, label: str = "") -> None:
    args = ["worker", "register", name, "--capacity", "2"]
    for project in projects:
        args += ["--project", project]
    if label:
        args += ["--label", label]
    assert cli(settings, *args).strip().startswith("qlw_")


def test_a_token_limited_to_projects_sees_only_the_workers_of_its_projects(database, tmp_path):
    """Without it a token limited to project ``alpha`` (a contractor's, a team's bot) read the
    names, labels and clocks of every worker of the cluster, those registered only for other
    teams' projects included, and the console's Workers view (which reads this route) showed
    them too: the other projects' machines and when they were last seen, leaked."""
    import psycopg

    name = "ql_api_workers"
    settings = _cluster(database, name, tmp_path)
    for project in ("alpha", "beta", "gamma"):
        cli(settings, "project", "create", project)
    _register(settings, "w-alpha", "alpha", label="zone=a")
    _register(settings, "w-beta", "beta", label="secret-beta-lab")
    _register(settings, "w-both", "alpha", "beta", "gamma")
    _register(settings, "w-any")  # every project
    admin = make_token(settings, "root", "admin")
    alpha = make_token(settings, "alpha-reader", "read", "alpha")
    beta_gamma = make_token(settings, "bg-reader", "read", "beta", "gamma")
    gateway = psycopg.connect(database.dsn("qinglong_gateway", pg.ROLE_PASSWORDS["qinglong_gateway"], name),
                              autocommit=True)
    plane = ApiProcessPlane(settings)
    client = Client(plane.port)
    try:
        # each worker's session, as the gateway opens it for the registered identity
        for worker_id, labels in (("w-alpha", "{zone=a}"), ("w-beta", "{secret-beta-lab}"), ("w-both", "{}"),
                                  ("w-any", "{}")):
            gateway.execute("SELECT qinglong.worker_open_session(%s, %s, 2, 600000)", (worker_id, labels))

        def listed(token):
            status, body, _ = client.request("GET", "/api/v1/workers", token=token)
            assert status == 200, body
            return {w["worker_id"]: w for w in body["workers"]}

        everything = listed(admin)
        assert sorted(everything) == ["w-alpha", "w-any", "w-beta", "w-both"]
        assert sorted(listed(alpha)) == ["w-alpha", "w-any", "w-both"]
        assert everything["w-both"]["projects"] == ["alpha", "beta", "gamma"]
        assert everything["w-any"]["projects"] is None  # every project
        assert everything["w-beta"]["labels"] == ["secret-beta-lab"]

        seen = listed(alpha)
        assert sorted(seen) == ["w-alpha", "w-any", "w-both"], seen
        # of a shared worker's projects, only those the token covers
        assert seen["w-both"]["projects"] == ["alpha"]
        assert seen["w-any"]["projects"] == ["alpha"]
        assert seen["w-alpha"]["labels"] == ["zone=a"]

        seen = listed(beta_gamma)
        assert sorted(seen) == ["w-any", "w-beta", "w-both"], seen
        assert seen["w-both"]["projects"] == ["beta", "gamma"]

        # the limit counts the workers the token sees, not those it does not
        status, body, _ = client.request("GET", "/api/v1/workers?limit=2", token=alpha)
        assert status == 200 and [w["worker_id"] for w in body["workers"]] == ["w-alpha", "w-any"], body

        # nothing of the hidden worker anywhere in the answer a limited token gets
        status, raw, _ = client.request("GET", "/api/v1/workers", token=alpha)
        assert "w-beta" not in str(raw) and "secret-beta-lab" not in str(raw) and "gamma" not in str(raw)
    finally:
        client.close()
        plane.stop()
        gateway.close()
