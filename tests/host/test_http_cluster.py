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


def _samples(plane: Plane) -> dict[tuple, float]:
    status, body, _ = plane.get("/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


def test_workers_appear_in_status_the_page_and_the_metrics_and_stranded_runs_are_attention(
        database, tmp_path):
    """With the worker figures stuck at "none registered", Runs waiting with no worker alive
    read "clear", ``qinglong_workers`` and ``qinglong_worker_free_slots`` had no samples and an
    Attempt a worker reported failed never reached ``qinglong_attempts_finished_total``; and the
    page, reading Runs without the cluster's run control, showed no exit code and no reason."""
    import json
    import re

    import psycopg

    from host_helpers import run_cli
    from http_helpers import child_env

    name = "ql_workers"
    pg.create_database(database, name)
    dsns = {key: database.dsn(role, pg.ROLE_PASSWORDS[role], name) for key, role in (
        ("runtime_dsn", "qinglong_runtime"), ("admin_dsn", "qinglong_admin"), ("owner_dsn", "qinglong_owner"))}
    settings = tmp_path / "cluster.toml"
    settings.write_text('profile = "cluster"\n[scheduler]\nlease_ms = 5000\n[backend]\n'
                        + "".join(f'{k} = "{v}"\n' for k, v in dsns.items())
                        + '[http]\nlisten = "127.0.0.1:0"\n')
    cli(settings, "db", "migrate")
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "hello", "--", "false")
    cli(settings, "trigger", "add", "ops", "every-second", "--task", "hello", "--cron", "* * * * * *")
    plane = Plane(settings)
    try:
        wait_until(lambda: _samples(plane).get(("qinglong_runs_without_worker", ()), 0) >= 1,
                   "a queued Run counted as having no worker", alive=plane.process)
        samples = _samples(plane)
        assert samples[("qinglong_workers", (("state", "live"),))] == 0
        assert samples[("qinglong_worker_free_slots", ())] == 0
        assert samples[("qinglong_status_verdict", ())] == 20
        done = run_cli(["--settings", str(settings), "status", "--once", "--json"], cwd=tmp_path,
                       env=child_env())
        assert done.returncode == 20, done.stdout + done.stderr
        assert any("no live worker able to take them" in r for r in json.loads(done.stdout)["reasons"])
        screen = run_cli(["--settings", str(settings), "status", "--once"], cwd=tmp_path, env=child_env())
        assert "workers" in screen.stdout and "0 live" in screen.stdout, screen.stdout
        assert "no live worker able to take them" in plane.get("/")[1]

        worker = psycopg.connect(database.dsn("qinglong_gateway",
                                              pg.ROLE_PASSWORDS["qinglong_gateway"], name),
                                 autocommit=True)
        try:
            session, generation = worker.execute(
                "SELECT session_id, generation FROM qinglong.worker_open_session('w1', '{}', 3, 600000)"
            ).fetchone()
            token = b"t" * 32
            (attempt, version) = worker.execute(
                "SELECT attempt_id, lease_version FROM qinglong.worker_claim('w1', %s, %s, %s::bytea[])",
                (session, generation, [token])).fetchone()
            fence = ("w1", session, generation, attempt, version, token)
            worker.execute("SELECT qinglong.worker_started(%s, %s, %s, %s, %s, %s)", fence)
            worker.execute("SELECT qinglong.worker_complete(%s, %s, %s, %s, %s, %s, 'failed', 1, NULL, "
                           "0, 0, NULL, true)", fence)

            def worker_seen():
                got = _samples(plane)
                return got if got.get(("qinglong_attempts_finished_total", (("outcome", "failed"),))) else None

            samples = wait_until(worker_seen, "the failed Attempt counted", alive=plane.process)
            assert samples[("qinglong_workers", (("state", "live"),))] == 1
            assert samples[("qinglong_worker_free_slots", ())] == 3
            cancelled = json.loads(cli(settings, "runs", "--state", "queued", "--json"))[0]["run_id"]
            cli(settings, "runs", "cancel", cancelled)
            page = plane.get("/")[1]
            assert "1 live; 3 free slots" in page, page
            # the Runs table reads what `qinglong runs` reads: the worker's exit code, the reason
            assert "<td>failed</td><td>1</td>" in page, page
            assert re.search(r"<td>cancelled</td><td>–</td>.*?<td>[^<]*operator[^<]*</td>", page), page
        finally:
            worker.close()
    finally:
        plane.stop()
