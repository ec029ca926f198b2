"""The HTTP surface of a cluster replica on a real PostgreSQL (both supported builds)."""

from __future__ import annotations

from tests.support import pg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from host_helpers import wait_until
from http_helpers import Plane, cli


@pytest.fixture(scope="module", params=["pg18", "pg15"])
def database(request):
    server = pg.start_server(request.param)
    request.addfinalizer(server.destroy)
    pg.create_roles(server)
    pg.create_database(server, "ql_http")
    return server


def test_a_replica_scrape_counts_its_admissions_and_lag_and_shows_store_figures(database, tmp_path):
    """On a cluster each replica counts only what it admitted: a replica whose scrape shows no
    admissions or no lag histogram hides which replica fell behind; a DSN password in a page or in
    stderr hands out the database."""
    dsns = {key: database.dsn(role, pg.ROLE_PASSWORDS[role], "ql_http") for key, role in (
        ("runtime_dsn", "qinglong_runtime"), ("admin_dsn", "qinglong_admin"), ("owner_dsn", "qinglong_owner"))}
    settings = tmp_path / "cluster.toml"
    settings.write_text('profile = "cluster"\n[scheduler]\nlease_ms = 5000\n[backend]\n'
                        + "".join(f'{k} = "{v}"\n' for k, v in dsns.items())
                        + '[http]\nlisten = "127.0.0.1:0"\n')
    cli(settings, "db", "migrate")
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "hello", "--", "true")
    cli(settings, "trigger", "add", "ops", "every-second", "--task", "hello", "--cron", "* * * * * *")
    plane = Plane(settings)
    bodies = []
    try:
        def admitted():
            status, body, _ = plane.get("/metrics")
            assert status == 200
            bodies.append(body)
            families = {f.name: f for f in text_string_to_metric_families(body)}
            lag = [s.value for s in families["qinglong_admission_lag_seconds"].samples
                   if s.name == "qinglong_admission_lag_seconds_count"]
            return families if lag and lag[0] >= 2 else None

        families = wait_until(admitted, "two admissions counted with their lag", timeout=60, every=0.2,
                              alive=plane.process)
        status, page, _ = plane.get("/")
        bodies.append(page)
        assert status == 200 and "<td>ops/every-second</td>" in page
        assert plane.get("/readyz")[:2] == (200, "ready\n")
    finally:
        plane.stop()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("qinglong_admissions_total", ())] >= 2
    assert samples[("qinglong_build_info", (("profile", "cluster"), ("version", "0.1.0")))] == 1
    assert samples[("qinglong_schedules_total", (("enabled", "true"),))] == 1
    assert "qinglong_workers" in families and "qinglong_worker_free_slots" in families
    assert ("qinglong_claim_races_total", (("kind", "released"),)) in samples
    for secret in pg.ROLE_PASSWORDS.values():
        assert secret not in plane.stderr.text()
        assert all(secret not in body for body in bodies)
