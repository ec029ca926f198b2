"""What a Prometheus scrape costs the store: the one bounded read behind ``/metrics``
(``backend.reader().store_stats()``) at many schedules, on edge (a SQLite file) and on the cluster
(PostgreSQL 18), and what scraping once a second does to the admission lag of a real
``qinglong run``. A script run by hand, never a test.

    python bench/scrape.py [--quick] [--schedules 10000,1000000] [--due 300] [--reads 200]
                           [--lag-seconds 20] [--lag-repeat 3] [--skip-cluster] [--skip-lag]

* store read: a store with ``--schedules`` schedules, all far in the future except ``--due`` that
  are due now (the backlog the read counts), grown from one count to the next. Before the first
  count is measured, real scheduler rounds (``run_round``) admit the due ones, which are then made
  due again: so the lag window holds ``--due`` recent Runs for the percentiles to read. One trigger of
  each kind is published through the real publisher; the rest are copies of it inserted in bulk
  (edge: one ``INSERT ... SELECT`` per table; cluster: ``devtools/scale_seed.py``), because
  publishing a million triggers one by one takes hours. ``--reads`` calls of
  ``store_stats()`` one after the other, wall time of each in the caller (for SQLite that is the
  database time plus one hop to the connection's thread); median, p99 and max. On PostgreSQL also
  the server's own time: ``EXPLAIN (ANALYZE, TIMING OFF, BUFFERS)`` of the ``store_stats`` statement of
  ``sql/stats.sql`` with the same parameters (execution and planning time, buffers), median of
  ``--reads`` / 5 (the wheel's server has no ``pg_stat_statements``).
* admission lag: ``qinglong run`` on edge, 10,000 yearly schedules and 20 triggers firing every
  second, ``[http]`` listening on a free loopback port, once never scraped and once with
  ``/metrics`` fetched once a second, alternated ``--lag-repeat`` times for ``--lag-seconds``
  each (``bench/http_surface.py``'s ``run_once``, modes ``on`` and ``scraped``); lag = admitted -
  scheduled from the Runs table, the first two seconds and the last one of a run left out. The
  RSS the surface adds is ``bench/http_surface.py``'s figure (docs/http.md), not re-measured.

The load average (1, 5, 15 min) before and after goes into the results: absolute figures drift
with it. Results go to stdout and to ``bench/results/scrape.json`` (``scrape-quick.json`` with
``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

RESULTS = ROOT / "bench" / "results"
#: Far-future cursor of the copied schedules (year 2255), plus their number.
FAR_FUTURE_MS = 9_000_000_000_000


def percentile(values, q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]); 0 for no values."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary_ms(samples: list[float]) -> dict:
    return {"reads": len(samples), "median_ms": round(statistics.median(samples), 2),
            "p99_ms": round(percentile(samples, 0.99), 2), "max_ms": round(max(samples), 2)}


async def timed_reads(reader, reads: int) -> list[float]:
    """``reads`` calls of ``reader.store_stats()`` one after the other, ms each. A read past the
    bound (StoreUnavailable) is kept as its time too, so a too-slow store shows in the p99."""
    from qinglong.contracts.errors import StoreUnavailable

    samples = []
    for _ in range(reads):
        t0 = time.perf_counter()
        try:
            await reader.store_stats()
        except StoreUnavailable as exc:
            print(f"  a read failed: {exc}", flush=True)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def first_read(reader):
    """The warm-up read, whose figures prove the seed (retried: a loaded server may miss the
    bound once)."""
    from qinglong.contracts.errors import StoreUnavailable

    for attempt in range(5):
        try:
            return await reader.store_stats()
        except StoreUnavailable as exc:
            print(f"  the warm-up read failed: {exc}", flush=True)
    raise RuntimeError("five reads in a row past the bound")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- edge (SQLite)


def edge_clone(db: Path, template_id: str, start: int, count: int, due: int, prefix: str = "x") -> None:
    """Copy trigger ``template_id`` and its schedule ``count`` times (ids ``prefix`` + 8 digits,
    numbered from ``start``): cursors far in the future, except the first ``due`` copies, due a
    second ago. Every column is copied from the template's rows except the id and the cursor."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for table in ("triggers", "trigger_schedules"):
            cols = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            exprs = []
            for col in cols:
                if col == "trigger_id":
                    exprs.append("?1 || printf('%08d', g.n)")
                elif col == "next_fire_at_ms":
                    exprs.append(f"CASE WHEN g.n < ?2 + ?4 THEN ?5 ELSE {FAR_FUTURE_MS} + g.n END")
                else:
                    exprs.append(f"t.{col}")
            conn.execute("BEGIN")
            conn.execute(
                f"WITH RECURSIVE g(n) AS (SELECT ?2 UNION ALL SELECT n + 1 FROM g WHERE n < ?2 + ?3 - 1) "
                f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} "
                f"FROM {table} t, g WHERE t.trigger_id = ?6",
                (prefix, start, count, due, now_ms() - 1000, template_id))
            conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def edge_store(root: Path, every_second: int) -> Path:
    """A migrated edge store with ``every_second`` triggers firing each second and one yearly
    trigger (``tr{every_second}``) published through the real publisher; returns the file."""
    import http_surface

    http_surface.write_settings(root)
    http_surface.populate(root, 1, every_second)
    return root / "q.db"


async def edge_reads(root: Path, reads: int):
    """``reads`` calls of the edge reader's ``store_stats()``, ms each (after one warm-up)."""
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    backend = build_container(load_settings(root / "off.toml")).backend()
    await backend.open(create=False)
    try:
        reader = backend.reader()
        first = await first_read(reader)
        samples = await timed_reads(reader, reads)
    finally:
        await backend.close()
    return samples, first


async def _admit_until_idle(backend) -> int:
    """Real scheduler rounds on ``backend`` until one admits and claims nothing; Runs admitted."""
    await backend.open()
    admitted = 0
    try:
        while True:
            report = await backend.run_round()
            admitted += report.admitted
            if report.admitted == 0 and report.claimed == 0:
                return admitted
    finally:
        await backend.close()


async def edge_admit(root: Path) -> int:
    """Real scheduler rounds on the edge store until one admits nothing; Runs admitted."""
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    return await _admit_until_idle(build_container(load_settings(root / "off.toml")).backend())


def edge_make_due(db: Path, trigger_ids: list[str]) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.executemany("UPDATE trigger_schedules SET next_fire_at_ms = ? WHERE trigger_id = ?",
                         [(now_ms() - 1000, t) for t in trigger_ids])
    finally:
        conn.close()


def bench_edge(counts: list[int], due: int, reads: int) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory(prefix="qinglong-bench-scrape-edge-") as tmp:
        root = Path(tmp)
        db = edge_store(root, 0)
        have = 1
        for count in counts:
            t0 = time.monotonic()
            edge_clone(db, "tr0", have, count - have, due if have == 1 else 0)
            if have == 1 and due:
                # Recent Runs for the lag percentiles to read: a real round admits the due ones,
                # then the same schedules are made due again (the backlog).
                admitted = asyncio.run(edge_admit(root))
                print(f"  a round admitted {admitted} Runs", flush=True)
                edge_make_due(db, [f"x{n:08d}" for n in range(1, due + 1)])
            seed_s = time.monotonic() - t0
            have = count
            samples, first = asyncio.run(edge_reads(root, reads))
            row = {"schedules": first.schedules_total, "due": first.schedules_due,
                   "runs_in_lag_window": first.admitted_in_window, "seed_s": round(seed_s, 1), "db_mib": round(db.stat().st_size / 2**20, 1),
                   **summary_ms(samples)}
            print(f"edge {count:>9,} schedules ({first.schedules_due} due): store_stats median "
                  f"{row['median_ms']} ms, p99 {row['p99_ms']} ms, max {row['max_ms']} ms "
                  f"({reads} reads; file {row['db_mib']} MiB)", flush=True)
            out.append(row)
    return out


# --------------------------------------------------------------------------- cluster (PostgreSQL)


def explain_stats(su_dsn: str) -> dict:
    """EXPLAIN (ANALYZE, TIMING OFF, BUFFERS) of the ``store_stats`` statement at the database's
    now, with the parameters the reader passes (as the superuser: EXPLAIN runs the statement).
    TIMING OFF: per-node clocks would inflate the execution time of a statement that counts a
    million rows past what the reader pays."""
    import psycopg

    from qinglong.contracts.observe import LAG_WINDOW_MS, RECENT_WINDOW_MS
    from qinglong.plugins.cluster_postgres.sql import query

    with psycopg.connect(su_dsn) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        now = conn.execute(query("stats_clock")).fetchone()[0]
        params = {"now_ms": now, "lag_window_ms": LAG_WINDOW_MS, "recent_window_ms": RECENT_WINDOW_MS,
                  "live_window_ms": 30_000}
        [[doc]] = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, BUFFERS, FORMAT JSON) " + query("store_stats"),
                               params).fetchall()
        conn.rollback()
    top = doc[0]
    plan = top["Plan"]
    return {"execution_ms": top["Execution Time"], "planning_ms": top["Planning Time"],
            "shared_blocks": int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))}


async def cluster_admit(dsns: dict) -> int:
    """Real scheduler rounds on the cluster store until one admits nothing; Runs admitted."""
    import cluster as bench_cluster

    return await _admit_until_idle(bench_cluster._admin_backend(dsns))


def bench_cluster(counts: list[int], due: int, reads: int) -> tuple[list[dict], dict]:
    import psycopg

    import burst
    import cluster as bench_cluster
    from devtools.scale_seed import clone_triggers, make_due

    server = bench_cluster.start_database()
    out = []
    try:
        dsns = bench_cluster.make_db(server, "scrape")
        [template] = burst.publish_templates(dsns, ["0 0 1 1 *"])
        have = 1
        for i, count in enumerate(counts):
            t0 = time.monotonic()
            with psycopg.connect(dsns["superuser"], autocommit=True) as conn:
                prefix = f"x{i}"
                clone_triggers(conn, template, count - have, prefix=prefix)
                if have == 1 and due:
                    ids = [f"{prefix}{n:08d}" for n in range(1, due + 1)]
                    make_due(conn, ids)
                    admitted = asyncio.run(cluster_admit(dsns))
                    print(f"  a round admitted {admitted} Runs", flush=True)
                    make_due(conn, ids)
            seed_s = time.monotonic() - t0
            have = count

            async def measure():
                backend = bench_cluster._admin_backend(dsns)
                await backend.open(create=False)
                try:
                    reader = backend.reader()
                    first = await first_read(reader)
                    return first, await timed_reads(reader, reads)
                finally:
                    await backend.close()

            first, samples = asyncio.run(measure())
            explains = [explain_stats(dsns["superuser"])
                        for _ in range(max(3, reads // 5))]
            server_side = {
                "explains": len(explains),
                "execution_median_ms": round(statistics.median(e["execution_ms"] for e in explains), 2),
                "execution_p99_ms": round(percentile([e["execution_ms"] for e in explains], 0.99), 2),
                "planning_median_ms": round(statistics.median(e["planning_ms"] for e in explains), 2),
                "shared_blocks": explains[-1]["shared_blocks"],
            }
            with psycopg.connect(dsns["superuser"]) as conn:
                size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
            row = {"schedules": first.schedules_total, "due": first.schedules_due,
                   "runs_in_lag_window": first.admitted_in_window, "seed_s": round(seed_s, 1),
                   "db_mib": round(size / 2**20, 1), "client": summary_ms(samples), "server": server_side}
            print(f"cluster {count:>9,} schedules ({first.schedules_due} due): store_stats median "
                  f"{row['client']['median_ms']} ms, p99 {row['client']['p99_ms']} ms (client, {reads} reads); "
                  f"server execution median {server_side['execution_median_ms']} ms, p99 "
                  f"{server_side['execution_p99_ms']} ms, planning {server_side['planning_median_ms']} ms, "
                  f"{server_side['shared_blocks']} buffers", flush=True)
            out.append(row)
        with psycopg.connect(server.superuser_dsn()) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
    finally:
        server.destroy()
    return out, {"server_version": version}


# --------------------------------------------------------------------------- admission lag


def bench_lag(schedules: int, every_second: int, seconds: float, repeat: int) -> dict:
    import http_surface

    runs: dict[str, list[dict]] = {"on": [], "scraped": []}
    with tempfile.TemporaryDirectory(prefix="qinglong-bench-scrape-lag-") as tmp:
        root = Path(tmp)
        db = edge_store(root, every_second)
        edge_clone(db, f"tr{every_second}", 1, schedules - 1, 0)
        for _ in range(repeat):
            for mode in runs:
                measured = http_surface.run_once(root, mode, seconds)
                if measured["exit"] != 0:
                    raise RuntimeError(f"qinglong run ({mode}) exited {measured['exit']}")
                runs[mode].append(measured)
    result: dict = {"schedules": schedules, "every_second": every_second, "seconds": seconds,
                    "repeat": repeat}
    for mode, label in (("on", "unscraped"), ("scraped", "scraped_1hz")):
        lags = sorted(lag for m in runs[mode] for lag in m["lags"])
        result[label] = {"admissions": len(lags), "lag_p50_ms": percentile(lags, 0.5),
                         "lag_p99_ms": percentile(lags, 0.99), "lag_max_ms": max(lags) if lags else None}
    scrapes = [ms for m in runs["scraped"] for ms in m["scrape_ms"]]
    if scrapes:
        result["scraped_1hz"]["scrapes"] = len(scrapes)
        result["scraped_1hz"]["scrape_http_median_ms"] = round(statistics.median(scrapes), 2)
        result["scraped_1hz"]["scrape_http_p99_ms"] = round(percentile(scrapes, 0.99), 2)
    base, scraped = result["unscraped"]["lag_p99_ms"], result["scraped_1hz"]["lag_p99_ms"]
    result["lag_p99_change_pct"] = round((scraped - base) / base * 100, 1) if base else None
    result["lag_p99_change_ms"] = scraped - base
    print(f"lag ({schedules:,} schedules, {every_second} due/s, {repeat} x {seconds} s per mode): "
          f"unscraped p50 {result['unscraped']['lag_p50_ms']} ms p99 {base} ms "
          f"({result['unscraped']['admissions']} admissions); scraped once a second p50 "
          f"{result['scraped_1hz']['lag_p50_ms']} ms p99 {scraped} ms "
          f"({result['scraped_1hz']['admissions']} admissions); change {result['lag_p99_change_ms']} ms "
          f"({result['lag_p99_change_pct']} %)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2,000 and 20,000 schedules, 20 reads, one 8 s lag run per mode")
    parser.add_argument("--schedules", default=None, help="comma-separated counts (ascending)")
    parser.add_argument("--due", type=int, default=300)
    parser.add_argument("--reads", type=int, default=None)
    parser.add_argument("--lag-schedules", type=int, default=10_000)
    parser.add_argument("--lag-every-second", type=int, default=20)
    parser.add_argument("--lag-seconds", type=float, default=None)
    parser.add_argument("--lag-repeat", type=int, default=None)
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--skip-edge", action="store_true")
    parser.add_argument("--skip-lag", action="store_true")
    args = parser.parse_args()
    quick = args.quick
    counts = [int(c) for c in (args.schedules or ("2000,20000" if quick else "10000,1000000")).split(",")]
    reads = args.reads or (20 if quick else 200)
    lag_seconds = args.lag_seconds or (8 if quick else 20)
    lag_repeat = args.lag_repeat or (1 if quick else 3)

    results: dict = {"quick": quick, "loadavg_before": loadavg(), "cpus": os.cpu_count(),
                     "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "due": args.due, "reads": reads}
    print(f"load average {results['loadavg_before']} on {os.cpu_count()} CPUs", flush=True)
    if not args.skip_edge:
        results["edge_store_stats"] = bench_edge(counts, args.due, reads)
    if not args.skip_cluster:
        results["cluster_store_stats"], info = bench_cluster(counts, args.due, reads)
        results.update(info)
    if not args.skip_lag:
        results["edge_admission_lag"] = bench_lag(args.lag_schedules, args.lag_every_second, lag_seconds,
                                                  lag_repeat)
    results["http_rss_cited"] = (
        "bench/http_surface.py --schedules 10000 --every-second 20 --seconds 10 --repeat 3 "
        "(docs/http.md): steady VmRSS off 48.1 MiB, on 50.3 MiB, scraped once a second 50.4 MiB: "
        "the surface adds +2.2 MiB; not re-measured here")
    results["loadavg_after"] = loadavg()
    print(f"load average after {results['loadavg_after']}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("scrape-quick.json" if quick else "scrape.json")
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
