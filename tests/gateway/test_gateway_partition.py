"""A worker cut off from the API tier's gateway: a real ``qinglong api`` on a real PostgreSQL, two
real workers speaking HTTP to it, one of them through a pass-through proxy that the test
partitions (both directions stop). The cut worker must stop its job before its session lease can
expire in the database's time; only then may the Run's next Attempt start on the other worker."""

from __future__ import annotations

import signal

import pytest

from devtools.fault_proxy import BOTH, FaultProxy
from tests.gateway.helpers import ApiGateway, plane_settings, register, start_gateway_worker
from tests.support.cluster import expire
from tests.worker.helpers import (SHORT_TIMING, admit, attempts, group_alive, publish_task, py_job, run_state,
                                  wait_until)

#: Attempt 1 ignores TERM (only the fence's KILL stops it) and stamps its monotonic time every
#: 10 ms; any later Attempt stamps its start and exits 0. One machine, one monotonic clock.
JOB = (
    "import os, signal, sys, time\n"
    "base = os.path.join(sys.argv[1], os.environ['QINGLONG_ATTEMPT'])\n"
    "if os.environ['QINGLONG_ATTEMPT'] != '1':\n"
    "    open(base + '.start', 'w').write('%.6f' % time.monotonic())\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(base + '.pid.tmp', 'w').write('%d' % os.getpgid(0))\n"
    "os.rename(base + '.pid.tmp', base + '.pid')\n"
    "fd = os.open(base + '.stamps', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n"
    "while True:\n"
    "    os.write(fd, b'%.6f\\n' % time.monotonic())\n"
    "    time.sleep(0.01)\n"
)

ONE_SERVER = pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)


@ONE_SERVER
def test_a_worker_cut_from_the_gateway_stops_its_job_before_another_takes_the_run(cluster, tmp_path):
    """Without the self-fence on the gateway path, a worker that can no longer reach the API tier
    would let its job run on while the lease expires and the other worker runs Attempt 2: two
    executions of one Run at once. Without the token's proof, the cut worker's late report of the
    abandoned Attempt could also overwrite the outcome of the Attempt that replaced it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    settings = plane_settings(cluster, tmp_path)
    tokens = {name: register(settings, name, capacity=2) for name in ("wa", "wb")}
    trigger = publish_task(cluster, "cut", {"command": py_job(JOB, str(marks)), "timeout_ms": 600_000,
                                            "idempotent": True,
                                            "retry": {"max_attempts": 2, "initial_backoff_ms": 0, "jitter": 0}})
    api = ApiGateway(settings, tmp_path / "api.stderr")
    proxy = FaultProxy(("127.0.0.1", api.port), name="gateway-link").start()
    wa = wb = None
    try:
        run_id = admit(cluster, trigger)
        wa = start_gateway_worker(f"http://127.0.0.1:{proxy.port}", tokens["wa"], tmp_path, "wa",
                                  level="debug")
        wait_until((marks / "1.pid").exists, "Attempt 1 to start on wa")
        pgid = int((marks / "1.pid").read_text())
        beats = len(wa.events("worker.heartbeat"))
        wa.wait_event("worker.heartbeat", beats + 1)  # one renewal through the gateway with the job running
        proxy.partition(BOTH)
        wa.wait_event("worker.self_fenced")
        wait_until(lambda: not group_alive(pgid), "Attempt 1's process group to be gone")
        last_heartbeat = max(e["heartbeat_started_mono"] for e in wa.events("worker.heartbeat"))
        job_end = float((marks / "1.stamps").read_text().split()[-1])
        fence = last_heartbeat + (SHORT_TIMING["session_lease_ms"] - SHORT_TIMING["self_fence_margin_ms"]) / 1000
        assert job_end < fence, (job_end, last_heartbeat, fence)
        (first,) = attempts(cluster, run_id)
        assert first["state"] == "running"  # the store heard nothing: only the lease can end it

        # the other worker, on a link that works, takes the Run once the lease has expired
        wb = start_gateway_worker(api.url, tokens["wb"], tmp_path, "wb")
        expiry = cluster.sql("SELECT lease_expires_at_ms FROM qinglong.attempts WHERE attempt_id = %s",
                             (first["attempt_id"],))[0][0]
        wait_until(lambda: cluster.db_now_ms() > expiry, "the abandoned lease to expire in database time")
        expire(cluster, 100)
        wait_until(lambda: run_state(cluster, run_id) == "succeeded", "Attempt 2 to succeed on wb")
        second_start = float((marks / "2.start").read_text())
        assert job_end < second_start, "Attempt 2 started while Attempt 1 still ran"
        worker_of = dict(cluster.sql("SELECT attempt_no, worker_id FROM qinglong.attempts WHERE run_id = %s",
                                     (run_id,)))
        assert worker_of == {1: "wa", 2: "wb"}
        assert [a["state"] for a in attempts(cluster, run_id)] == ["lost", "succeeded"]

        # healed, wa opens a new session through the gateway and never reports the abandoned Attempt
        proxy.heal()
        wa.wait_event("worker.session_opened", 2)
        assert cluster.sql("SELECT generation FROM qinglong.worker_sessions WHERE worker_id = 'wa'")[0][0] == 2
        assert wa.events("worker.completed") == []
        assert cluster.sql("SELECT count(*) FROM qinglong.run_events WHERE run_id = %s "
                           "AND event_type = 'run.finished'", (run_id,))[0][0] == 1
        for worker in (wa, wb):
            worker.signal(signal.SIGTERM)
            assert worker.wait() == 0
    finally:
        for worker in (wa, wb):
            if worker is not None:
                worker.stop()
        proxy.close()
        api.stop()
