"""Workers through the API tier's gateway beside the ceiling of the same work (PostgreSQL 18).

* latency: ``--latency-triggers`` cron triggers spread over the minute (``S * * * * *``) admitted by
  one ``qinglong run`` replica for ``--latency-seconds``; 2 and 20 workers (``max_running`` 4) take
  them through one ``qinglong api`` gateway (``[worker] url``, a claim waits at the gateway and
  wakes on the admission's notification). Beside them, the ceiling: as many clients in this
  process calling the worker functions through the gateway's own store side
  (``PostgresWorkerGateway``: its pool of ``PostgresWorkerProtocol`` on the gateway's role, its
  listener waking the claims), claiming, starting and completing each Attempt at once (no HTTP,
  no process, no job). Admitted-to-started = the Attempt's
  ``started_at_ms`` (the worker's ``started`` call, just before its spawn) - the Run's
  ``admitted_at_ms``, both the database's clock; p50 and p99 after ``--warm-s``.
* throughput: a backlog of ``--backlog`` queued no-op Runs (``true``), drained by 2 and 20 workers,
  and by the ceiling's clients: Runs completed per second (first claim to last completion,
  database clock). The backlog is held (``not_before_ms``) until every session is open, then
  released with a notification: 20 worker processes starting on a small host take seconds of
  CPU, and measured from the first worker's claim that start-up read as a slow drain
  (``sessions_open_s`` says how long it took).
* idle: ``--idle-workers`` simulated workers (threads, each its own registration, session and
  kept-alive connection) long-polling ``claim`` at one gateway with a pool of 4: the gateway
  role's database connections (``pg_stat_activity``) while they wait, and the claims served.
* memory: one real gateway worker idle (VmRSS, VmHWM; its fence keeper beside it), beside the
  edge import floor (peak RSS of a process importing what the edge host
  imports before its container: ``bench/edge.py``'s floor). Target: gateway worker < floor + 4 MiB.

Results go to stdout and to ``bench/results/gateway.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cluster  # noqa: E402
import cluster_workers  # noqa: E402
from cluster import (TERMINAL_SQL, YEARLY, DRAIN_GRACE_MS, _completion_span, _replica_settings, _wait,  # noqa: E402
                     drain_with_replicas, make_db, percentile, publish, reseed, sql, start_database)

RESULTS = ROOT / "bench" / "results" / "gateway.json"
GATEWAY_ROLE = "qinglong_gateway"
#: the edge floor: what bench/edge.py measures as the edge host's imports before its container
EDGE_FLOOR_IMPORTS = "import pluggy, croniter, aiosqlite, pydantic_settings, dependency_injector.containers"
TARGET_ABOVE_FLOOR_MIB = 4.0
#: ``not_before_ms`` of the throughput backlog while the workers start (far in the future)
HELD_UNTIL_MS = 2**62
STARTED: list = []


def _ingress_dsn(server, dbname: str) -> str:
    from devtools.pg import ROLE_PASSWORDS

    return cluster_workers.worker_dsn(server.host, server.port, dbname, ROLE_PASSWORDS[GATEWAY_ROLE])


def _workers(server, dsns: dict, workdir: Path, prefix: str, n: int, *, max_running: int, gateway) -> list:
    names = [f"{prefix}{i}" for i in range(n)]
    tokens = cluster_workers.register_workers(dsns["superuser"], names, capacity=max_running)
    pool = []
    for worker_id in names:
        settings = cluster_workers.write_gateway_worker_settings(
            workdir / f"{worker_id}.toml", gateway.url, tokens[worker_id], worker_id,
            log_dir=workdir / f"{worker_id}-logs", max_running=max_running)
        worker = cluster_workers.WorkerProcess(worker_id, settings, workdir / f"{worker_id}.log")
        STARTED.append(worker)
        pool.append(worker)
    return pool


class Ceiling:
    """``n`` clients in this process, each its own session of ``max_running`` slots, calling the
    worker functions through the gateway's store side (pool of 4, its listener): claim (waiting
    on the listener when nothing is claimable), then started and complete at once. Until
    :meth:`stop`."""

    def __init__(self, server, dsns: dict, n: int, max_running: int) -> None:
        self.dsn = _ingress_dsn(server, dsns["dbname"])
        self.n, self.max_running = n, max_running
        self.done = threading.Event()
        self.sessions = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._body()), daemon=True)

    def start(self) -> "Ceiling":
        self.thread.start()
        return self

    async def _body(self) -> None:
        from qinglong.contracts.execution import AttemptOutcome, AttemptState
        from qinglong.contracts.worker import new_lease_token
        from qinglong.plugins.cluster_postgres.gateway import create_worker_gateway

        gateway = await create_worker_gateway(self.dsn, "bench ceiling", 4)

        async def client(i: int) -> None:
            fence = (await gateway.open_session(f"ceiling{i}", [], self.max_running, 600_000)).fence
            self.sessions += 1
            answered = None  # the wake-up the next claim answers
            while not self.done.is_set():
                waiter = gateway.waiter()
                tokens = [new_lease_token() for _ in range(self.max_running)]
                claimed = await gateway.claim(fence, tokens)
                if answered is not None:
                    answered.claimed(len(claimed), len(tokens))  # passed on if there may be more
                    answered = None
                if not claimed:
                    try:
                        await asyncio.wait_for(waiter.wait(), 1.0)
                        answered = waiter
                    except asyncio.TimeoutError:
                        waiter.discard()
                    continue
                waiter.discard()
                for attempt in claimed:
                    await gateway.started(fence, attempt.lease)
                    await gateway.complete(fence, attempt.lease, AttemptOutcome(
                        AttemptState.SUCCEEDED, exit_code=0, signal=None, ended_at_ms=None, log_bytes=0))
            await gateway.close_session(fence)

        try:
            await asyncio.gather(*(client(i) for i in range(self.n)))
        except Exception as exc:  # reported by the part
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            await gateway.close()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=60)
        if self.errors:
            raise SystemExit(f"the ceiling's clients failed: {self.errors[0]}")


def _pool(path: str, server, dsns: dict, workdir: Path, prefix: str, n: int, *, max_running: int):
    """The gateway and its started workers, or the ceiling's clients: (gateway or None, pool)."""
    if path == "ceiling":
        return None, [Ceiling(server, dsns, n, max_running).start()]
    gateway = cluster_workers.GatewayProcess(workdir, dsns, _ingress_dsn(server, dsns["dbname"])).start()
    return gateway, [w.start() for w in _workers(server, dsns, workdir, prefix, n, max_running=max_running,
                                                 gateway=gateway)]


def _stop(gateway, pool) -> None:
    for w in pool:
        w.stop() if isinstance(w, Ceiling) else w.stop(timeout=90)
    if gateway is not None:
        gateway.stop()


def _db(server, name: str) -> dict:
    dsns = make_db(server, name)
    dsns["dbname"] = name
    return dsns


def latency(server, workdir: Path, path: str, n: int, *, triggers: int, seconds: float, warm_s: float) -> dict:
    import subprocess

    name = f"bench_gwlat_{path}_{n}"
    dsns = _db(server, name)
    publish(dsns, triggers, lambda i: f"{i % 60} * * * * *", payload={"command": ["true"]})
    gateway, pool = _pool(path, server, dsns, workdir, f"lat-{path}-{n}-", n, max_running=4)
    su = dsns["superuser"]
    watched = [w for w in pool if not isinstance(w, Ceiling)]
    _wait("every worker's session open", lambda: sql(su, "SELECT count(*) FROM qinglong.worker_sessions "
                                                        "WHERE closed_at_ms IS NULL")[0][0] >= n, 120, watched)
    log = open(workdir / f"lat-{path}-{n}-replica.log", "w")
    started_ms = time.time() * 1000
    replica = subprocess.Popen([sys.executable, "-m", "qinglong", "run", "--settings",
                                str(_replica_settings(workdir, dsns, f"lat-{path}-{n}-r")), "--for-seconds",
                                str(seconds)], stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir))
    if replica.wait(timeout=seconds + 60) != 0:
        raise SystemExit(f"the latency replica failed; see {workdir}")
    _wait("every Run admitted finished", lambda: sql(
        su, f"SELECT count(*) FROM qinglong.runs WHERE state NOT IN {TERMINAL_SQL}")[0][0] == 0, 120, watched)
    _stop(gateway, pool)
    rows = sql(su, "SELECT a.started_at_ms - r.admitted_at_ms FROM qinglong.runs r JOIN qinglong.attempts a "
                   "USING (run_id) WHERE r.scheduled_for_ms >= %s AND a.started_at_ms IS NOT NULL",
               (started_ms + warm_s * 1000,))
    values = [r[0] for r in rows]
    dup = sql(su, "SELECT count(*) FROM (SELECT run_id FROM qinglong.attempts WHERE started_at_ms IS NOT NULL "
                  "GROUP BY run_id, attempt_no HAVING count(*) > 1) d")[0][0]
    return {"path": path, "workers": n, "runs_measured": len(values),
            "admitted_to_started_p50_ms": percentile(values, 0.50),
            "admitted_to_started_p99_ms": percentile(values, 0.99), "duplicate_starts": dup}


def throughput(server, workdir: Path, path: str, n: int, *, backlog: int) -> dict:
    name = f"bench_gwtp_{path}_{n}"
    dsns = _db(server, name)
    publish(dsns, backlog, lambda i: YEARLY, grace_ms=DRAIN_GRACE_MS, payload={"command": ["true"]})
    reseed(dsns)
    drain_with_replicas(dsns, 2, backlog, 16)
    su = dsns["superuser"]
    # held (not claimable) until every worker's session is open: 20 workers importing on a small
    # host would otherwise be measured as a slow drain (their start-up, not the gateway's work)
    sql(su, f"UPDATE qinglong.attempts SET not_before_ms = {HELD_UNTIL_MS} WHERE state = 'claimed' "
            "AND not_before_ms IS NULL")
    began = time.monotonic()
    gateway, pool = _pool(path, server, dsns, workdir, f"tp-{path}-{n}-", n, max_running=4)
    watched = [w for w in pool if not isinstance(w, Ceiling)]
    _wait("every worker's session open", lambda: sql(su, "SELECT count(*) FROM qinglong.worker_sessions "
                                                        "WHERE closed_at_ms IS NULL")[0][0] >= n, 300, watched)
    sessions_open_s = time.monotonic() - began
    sql(su, f"UPDATE qinglong.attempts SET not_before_ms = NULL WHERE not_before_ms = {HELD_UNTIL_MS}")
    sql(su, "SELECT pg_notify('qinglong_claimable', '')")  # as an admission wakes the waiting claims
    _wait(f"{backlog} Runs finished", lambda: sql(
        su, f"SELECT count(*) FROM qinglong.runs WHERE state IN {TERMINAL_SQL}")[0][0] >= backlog, 1800, watched)
    _stop(gateway, pool)
    done, span = _completion_span(su)
    return {"path": path, "workers": n, "backlog": backlog, "succeeded": done,
            "completed_per_s": round(done / span, 1) if span else None,
            "sessions_open_s": round(sessions_open_s, 1)}


def idle_connections(server, workdir: Path, workers: int, *, hold_s: float) -> dict:
    name = "bench_gwidle"
    dsns = _db(server, name)
    names = [f"idle{i}" for i in range(workers)]
    tokens = cluster_workers.register_workers(dsns["superuser"], names, capacity=1)
    gateway = cluster_workers.GatewayProcess(workdir, dsns, _ingress_dsn(server, name), pool_size=4,
                                             claim_wait_ms=20_000).start()
    su = dsns["superuser"]
    stop = threading.Event()
    served = [0] * workers
    errors: list[str] = []
    ready = threading.Barrier(workers + 1)

    def simulated(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=60)
        headers = {"Authorization": f"Bearer {tokens[names[i]]}", "Content-Type": "application/json"}

        def call(what: str, body: dict) -> dict:
            conn.request("POST", f"/worker/v1/{what}", body=json.dumps(body), headers=headers)
            response = conn.getresponse()
            data = json.loads(response.read())
            if response.status != 200:
                raise RuntimeError(f"{what}: {response.status} {data}")
            return data

        try:
            session = call("open_session", {"lease_ms": 600_000})
        except Exception as exc:  # reported below
            errors.append(str(exc))
            ready.wait()
            return
        ready.wait()
        fence = {"session_id": session["session_id"], "generation": session["generation"]}
        while not stop.is_set():
            try:
                call("claim", {**fence, "tokens": [base64.b64encode(b"t" * 32).decode()], "wait_ms": 20_000})
                served[i] += 1
            except Exception as exc:
                errors.append(str(exc))
                return

    threads = [threading.Thread(target=simulated, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(2)  # every claim is now waiting at the gateway
    samples = []
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        samples.append(sql(su, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (GATEWAY_ROLE,))[0][0])
        time.sleep(0.5)
    stop.set()
    gateway.stop()
    return {"simulated_workers": workers, "gateway_pool_size": 4, "hold_s": hold_s,
            "gateway_db_connections_max": max(samples, default=0), "ceiling": 4 + 1,
            "claims_answered": sum(served), "errors": errors[:3], "error_count": len(errors)}


def _floor_bytes() -> int:
    """Peak RSS of a process importing the edge floor, read by that process itself (VmHWM). Not
    wait4's ru_maxrss: a child started from this large process inherits its high-water mark at
    exec, which would read as the floor (68 MiB here, against 37 MiB measured alone)."""
    code = (EDGE_FLOOR_IMPORTS + "\nimport re\nprint(re.search(r'VmHWM:\\s+(\\d+)', "
            "open('/proc/self/status').read()).group(1))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1]) * 1024


def memory(server, workdir: Path, *, idle_s: float) -> dict:
    from execution import _children_of, _cmdline, _status_kib

    floor = _floor_bytes()
    out: dict = {"edge_floor_peak_rss_mib": round(floor / 2**20, 1), "idle_s": idle_s,
                 "target_mib": round(floor / 2**20 + TARGET_ABOVE_FLOOR_MIB, 1)}
    for path in ("gateway",):
        name = f"bench_gwmem_{path}"
        dsns = _db(server, name)
        gateway = cluster_workers.GatewayProcess(workdir, dsns, _ingress_dsn(server, name)).start()
        (worker,) = _workers(server, dsns, workdir, f"mem-{path}-", 1, max_running=4, gateway=gateway)
        worker.start()
        su = dsns["superuser"]
        _wait("the session open", lambda: sql(su, "SELECT count(*) FROM qinglong.worker_sessions")[0][0] > 0,
              60, [worker])
        time.sleep(idle_s)
        keepers = [c for c in _children_of(worker.pid) if any(b"keeper" in a for a in _cmdline(c))]
        out[path] = {"worker_rss_mib": round(_status_kib(worker.pid, "VmRSS") / 1024, 1),
                     "worker_hwm_mib": round(_status_kib(worker.pid, "VmHWM") / 1024, 1),
                     "keeper_rss_mib": round(sum(_status_kib(k, "VmRSS") for k in keepers) / 1024, 1)}
        worker.stop(timeout=60)
        gateway.stop()
    out["gateway_worker_above_floor_mib"] = round(out["gateway"]["worker_rss_mib"] - out["edge_floor_peak_rss_mib"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="latency,throughput,idle,memory")
    parser.add_argument("--workers", default="2,20")
    parser.add_argument("--latency-triggers", type=int, default=120)
    parser.add_argument("--latency-seconds", type=float, default=45)
    parser.add_argument("--warm-s", type=float, default=10)
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--idle-workers", type=int, default=500)
    parser.add_argument("--idle-hold-s", type=float, default=10)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    counts = [int(c) for c in args.workers.split(",")]
    server = start_database()
    workdir = Path(tempfile.mkdtemp(prefix="ql-bench-gateway-"))
    workdir.chmod(0o755)
    results: dict = {"postgresql": server.version_num()}
    try:
        if "latency" in parts:
            results["latency"] = []
            for n in counts:
                for path in ("ceiling", "gateway"):
                    row = latency(server, workdir, path, n, triggers=args.latency_triggers,
                                  seconds=args.latency_seconds, warm_s=args.warm_s)
                    print("latency   ", json.dumps(row), flush=True)
                    results["latency"].append(row)
        if "throughput" in parts:
            results["throughput"] = []
            for n in counts:
                for path in ("ceiling", "gateway"):
                    row = throughput(server, workdir, path, n, backlog=args.backlog)
                    print("throughput", json.dumps(row), flush=True)
                    results["throughput"].append(row)
        if "idle" in parts:
            results["idle"] = idle_connections(server, workdir, args.idle_workers, hold_s=args.idle_hold_s)
            print("idle      ", json.dumps(results["idle"]), flush=True)
        if "memory" in parts:
            results["memory"] = memory(server, workdir, idle_s=5.0)
            print("memory    ", json.dumps(results["memory"]), flush=True)
    finally:
        for w in STARTED:
            if w.alive():
                w.kill9()
            w.leftover_jobs()
        server.destroy() if hasattr(server, "destroy") else None
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(previous | results, indent=2) + "\n")


if __name__ == "__main__":
    main()
