"""Self-fencing: a worker whose link to the gateway (and so to the store) is cut stops its job (TERM, then KILL to the
process group) before its session lease can expire in the store's time, measured on the
machine's monotonic clock from the start of its last successful heartbeat; then it opens a new
session (a new generation) once the store answers again, and the abandoned Attempt is never
reported by it."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.cluster import expire
from devtools.fault_proxy import BOTH, FaultProxy
from tests.support.procs import process_alive
from tests.worker.helpers import (
    keeper_pid,
    SHORT_TIMING,
    admit,
    attempts,
    group_alive,
    py_job,
    publish_task,
    run_state,
    wait_until,
)
from tests.support.gateway import start_gateway_worker

#: Ignores TERM (only KILL stops it), writes its pid and group, then its monotonic time every
#: 10 ms: the last line written is its last moment alive as far as it can tell.
STUBBORN_JOB = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "mark, stamps = sys.argv[1], sys.argv[2]\n"
    "with open(mark + '.tmp', 'w') as f: f.write('%d %d' % (os.getpid(), os.getpgid(0)))\n"
    "os.rename(mark + '.tmp', mark)\n"
    "fd = os.open(stamps, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n"
    "while True:\n"
    "    os.write(fd, b'%.6f\\n' % time.monotonic())\n"
    "    time.sleep(0.01)\n"
)


#: The fence is the worker's own clock and signals, the same against either server build: the
#: slow fencing scenarios run on one (the calls themselves are proven on both by the client tests).
ONE_SERVER = pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)


@ONE_SERVER
def test_a_partitioned_worker_kills_its_job_before_its_session_lease_can_expire(cluster, tmp_path, worker_gateway):
    """Without self-fencing the job would run on while the store, its lease expired, hands the Run
    to another worker: two executions of one Run at once. The job ignores TERM, so only the KILL
    at the schedule's kill point stops it; its last own timestamp must lie before the last
    successful heartbeat's start + lease - margin."""
    mark, stamps = tmp_path / "job.pid", tmp_path / "job.stamps"
    trigger = publish_task(cluster, "stubborn", {"command": py_job(STUBBORN_JOB, str(mark), str(stamps)),
                                                 "timeout_ms": 600_000})
    run_id = admit(cluster, trigger)
    with FaultProxy(("127.0.0.1", worker_gateway.api.port), name="worker-link") as proxy:
        token = worker_gateway.register("w-fence")
        worker = start_gateway_worker(f"http://{proxy.host}:{proxy.port}", token, tmp_path, "w-fence",
                                      level="debug")
        try:
            wait_until(mark.exists, "the job to start")
            pid, pgid = map(int, mark.read_text().split())
            beats = len(worker.events("worker.heartbeat"))
            worker.wait_event("worker.heartbeat", beats + 1)  # one renewal with the job running
            proxy.partition(BOTH)
            worker.wait_event("worker.self_fenced")
            wait_until(lambda: not group_alive(pgid), "the job's process group to be gone")
            last_heartbeat = max(e["heartbeat_started_mono"] for e in worker.events("worker.heartbeat"))
            job_end = float(stamps.read_text().split()[-1])
            fence = last_heartbeat + (SHORT_TIMING["session_lease_ms"] - SHORT_TIMING["self_fence_margin_ms"]) / 1000
            assert job_end < fence, (job_end, last_heartbeat, fence)
            print(f"[figures] self-fence: job ended {fence - job_end:.3f} s before last heartbeat start + lease - "
                  f"margin, {job_end - last_heartbeat:.3f} s after the last heartbeat started", flush=True)
            # it took the KILL: the job ignored TERM and wrote on after the self-fence began
            fenced = worker.events("worker.self_fenced")[0]
            assert job_end >= fenced["term_at_mono"]
            assert worker.events("worker.fence_breached") == []

            # the store never heard of the end: the Attempt still looks running until its lease expires
            (attempt,) = attempts(cluster, run_id)
            assert attempt["state"] == "running"
            proxy.heal()
            worker.wait_event("worker.session_opened", 2)
            assert cluster.sql("SELECT generation FROM qinglong.worker_sessions "
                               "WHERE worker_id = 'w-fence'")[0][0] == 2
            # the control plane's expiry (every replica runs it) ends the abandoned Attempt lost;
            # not idempotent: no retry
            expiry = cluster.sql("SELECT lease_expires_at_ms FROM qinglong.attempts WHERE attempt_id = %s",
                                 (attempt["attempt_id"],))[0][0]
            wait_until(lambda: cluster.db_now_ms() > expiry, "the abandoned lease to expire in database time")
            expire(cluster, 100)
            assert [a["state"] for a in attempts(cluster, run_id)] == ["lost"]
            assert run_state(cluster, run_id) == "lost"
            assert worker.events("worker.completed") == []
            worker.signal(signal.SIGTERM)
            assert worker.wait() == 0
        finally:
            worker.stop()


def _stubborn_worker(cluster, worker_gateway, tmp_path, name: str):
    mark, stamps = tmp_path / f"{name}.pid", tmp_path / f"{name}.stamps"
    trigger = publish_task(cluster, f"stubborn-{name}", {"command": py_job(STUBBORN_JOB, str(mark), str(stamps)),
                                                          "timeout_ms": 600_000})
    run_id = admit(cluster, trigger)
    worker = worker_gateway.start_worker(tmp_path, name, level="debug")
    wait_until(mark.exists, "the job to start")
    beats = len(worker.events("worker.heartbeat"))
    worker.wait_event("worker.heartbeat", beats + 1)
    _, pgid = map(int, mark.read_text().split())
    return worker, run_id, pgid, stamps


def _fence_of(worker) -> float:
    last_heartbeat = max(e["heartbeat_started_mono"] for e in worker.events("worker.heartbeat"))
    return last_heartbeat + (SHORT_TIMING["session_lease_ms"] - SHORT_TIMING["self_fence_margin_ms"]) / 1000


def test_a_killed_workers_job_is_stopped_by_its_fence_keeper(cluster, tmp_path, worker_gateway):
    """A worker killed -9 runs no watchdog, and its job, detached in its own process group, would
    run on after the lease expired, beside the worker that takes the Run over. Its fence keeper
    (a process of its own) sees the worker gone and stops the job, which ignores TERM, by KILL."""
    worker, run_id, pgid, stamps = _stubborn_worker(cluster, worker_gateway, tmp_path, "w-killed")
    try:
        keeper = keeper_pid(worker.proc.pid)
        assert keeper is not None
        worker.proc.kill()
        worker.wait()
        wait_until(lambda: not group_alive(pgid), "the killed worker's job to be gone")
        wait_until(lambda: not process_alive(keeper), "the keeper to exit once its job is gone")
        job_end = float(stamps.read_text().split()[-1])
        assert job_end < _fence_of(worker)
        assert run_state(cluster, run_id) == "running"  # nobody reported it: lost after the lease
    finally:
        worker.stop()


@ONE_SERVER
def test_a_frozen_workers_job_is_stopped_before_its_lease_could_expire(cluster, tmp_path, worker_gateway):
    """A worker frozen by SIGSTOP (or a stalled machine) neither heartbeats nor fences; without
    the keeper acting on the last schedule it was given, the job would outlive the lease. After
    the worker is continued it finds its fence passed, opens a new session and drains cleanly."""
    worker, run_id, pgid, stamps = _stubborn_worker(cluster, worker_gateway, tmp_path, "w-frozen")
    try:
        worker.signal(signal.SIGSTOP)
        wait_until(lambda: not group_alive(pgid), "the frozen worker's job to be gone")
        job_end = float(stamps.read_text().split()[-1])
        fence = _fence_of(worker)
        assert job_end < fence, (job_end, fence)
        worker.signal(signal.SIGCONT)
        worker.wait_event("worker.session_opened", 2)
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        assert worker.events("worker.completed") == []  # the abandoned Attempt is not its to report
    finally:
        worker.signal(signal.SIGCONT)
        worker.stop()


@ONE_SERVER
def test_a_dead_fence_keeper_is_started_again_with_the_jobs_it_guards(cluster, tmp_path, worker_gateway):
    """A keeper that died (killed by an operator's broad kill, say) would leave the next kill -9
    of the worker with nothing to stop its job; the worker starts it again with every order
    resent, and the new keeper stops the job when the worker dies."""
    worker, run_id, pgid, stamps = _stubborn_worker(cluster, worker_gateway, tmp_path, "w-keeper")
    try:
        first = keeper_pid(worker.proc.pid)
        os.kill(first, signal.SIGKILL)
        worker.wait_event("worker.keeper_failed")
        second = wait_until(lambda: (k := keeper_pid(worker.proc.pid)) not in (None, first) and k,
                            "a new fence keeper")
        assert group_alive(pgid)
        worker.proc.kill()
        worker.wait()
        wait_until(lambda: not group_alive(pgid), "the job to be stopped by the new keeper")
        wait_until(lambda: not process_alive(second), "the new keeper to exit")
    finally:
        worker.stop()


@ONE_SERVER
def test_a_job_whose_worker_and_keeper_are_both_killed_is_stopped_by_its_executors_fence(cluster, tmp_path, worker_gateway):
    """With the worker and its keeper both killed -9 (a `pkill -9` of both), no process of the
    worker is left to stop the job; the executor's own fence, moved to each heartbeat's KILL
    point, must end it before the last heartbeat's start + lease - margin, or it would run beside
    the worker that takes the Run over."""
    worker, run_id, pgid, stamps = _stubborn_worker(cluster, worker_gateway, tmp_path, "w-both")
    try:
        keeper = keeper_pid(worker.proc.pid)
        os.kill(keeper, signal.SIGKILL)
        worker.proc.kill()
        worker.wait()
        wait_until(lambda: not group_alive(pgid), "the job to be stopped by its executor's fence")
        job_end = float(stamps.read_text().split()[-1])
        fence = _fence_of(worker)
        assert job_end < fence, (job_end, fence)
    finally:
        worker.stop()
