"""Benchmark of the edge profile. A script run by hand, never a test.

    python bench/edge.py [--triggers 10000] [--steady-triggers 1000] [--seconds 15] [--python PY]

Every figure is measured in a fresh child process and printed beside its floors, all in one run.
The children run in a clean virtualenv holding only ``qinglong[edge]`` (built from this checkout
under ``bench/results/venv-edge`` unless ``--python`` names an interpreter), because a developer's
environment carries packages an edge install does not (dependency-injector imports werkzeug and
yaml when they are installed, which alone costs several MiB).

* floors, each a child of this same script (so the harness's own imports count on both sides):
  the bare child, one that also imports pluggy, croniter, aiosqlite, pydantic_settings and
  dependency_injector (the package, which imports nothing), and one that also imports
  ``dependency_injector.containers``, and one that also declares and builds a one-provider
  container: the edge's real floor, since its composition root is a dependency-injector
  container;
* ceiling: the admission transaction shape (read one due row by index, compare-and-set the
  schedule, insert Run, Attempt and two events, commit) with stdlib sqlite3 in a tight loop;
* drain: N triggers, half of them due, drained by the real host (settings file, plugins loaded by
  entry point, the edge container, the lifecycle and its scheduler loop): admissions per second,
  import time, RSS once built and once started, peak RSS, RSS at idle after the backlog; repeated
  at 1,000 and 100,000 triggers to show memory does not grow with the table;
* steady: M triggers firing every second, the host's loop at a 1 s cadence; lag (admitted - due)
  p50/p99.

Every peak is the child's own ``VmHWM`` (``/proc/self/status``), read as it ends. Not ``wait4``'s
``ru_maxrss``: a child started by ``vfork`` and ``exec`` is charged the parent's resident size at
the spawn, so a parent bigger than the child would have been measured instead of it.

Results go to stdout and to ``bench/results/edge.json``. Uses only the stdlib and the project.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = len(sys.argv) > 1 and sys.argv[1] == "--child"
if not CHILD:  # the parent prepares databases from the checkout; children import the installed wheel
    sys.path.insert(0, str(ROOT))

FLOOR_IMPORTS = "import pluggy, croniter, aiosqlite, pydantic_settings, dependency_injector"
FLOOR_CONTAINER_IMPORTS = FLOOR_IMPORTS + ".containers"
#: The least a dependency-injector root costs: its first container class (declaring one touches
#: another ~0.5 MiB of the compiled providers module) with a configuration and a singleton.
FLOOR_DI_ROOT = FLOOR_CONTAINER_IMPORTS + """
from dependency_injector import containers, providers
class Root(containers.DeclarativeContainer):
    config = providers.Configuration(strict=True)
    value = providers.Singleton(dict, size=config.size)
root = Root()
root.config.from_dict({"size": 1})
root.value()
"""
PYTHON = sys.executable
ZONES = ["UTC", "Europe/Berlin", "Asia/Shanghai", "America/New_York", "Europe/London",
         "Asia/Tokyo", "America/Chicago", "Australia/Brisbane"]
MiB = 1024 * 1024
#: What every admitted Run executes: a job that is still running while the backlog drains, so
#: the peak includes the dispatcher, its processes' supervision and their logs.
JOB = ["sleep", "1"]


def _child(mode: str, *args: str) -> tuple[int, dict]:
    """Run one child; return its own peak RSS (bytes, its ``VmHWM``) and its result."""
    proc = subprocess.run([PYTHON, __file__, "--child", mode, *args], stdout=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(f"child {mode} failed with {proc.returncode}")
    result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result.pop("peak_rss_bytes"), result


def _own_peak_rss() -> int:
    """This process's peak resident size since its ``exec`` (bytes)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status")


def _current_rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- database set-up (bulk SQL)

def make_database(path: Path, triggers: int, due_fraction: float, expression: str, now_ms: int,
                  grace_ms: int = 60_000) -> None:
    """Create ``triggers`` triggers with bulk SQL (publishing 100,000 one by one would dominate the
    run); the first ``due_fraction`` have a due cursor, the rest are not due for an hour."""
    from qinglong.contracts.records import canonical_json
    from qinglong.plugins.cron.provider import CronProvider
    from qinglong.plugins.edge_sqlite import migrations

    provider = CronProvider()
    conn = sqlite3.connect(path, isolation_level=None)
    migrations.apply_pending(conn, migrations.load_migrations(), str(path), now_ms)
    conn.close()
    # The project and its one task are published as a user would (the task's revision and digest
    # rows are the publisher's business); only the triggers are bulk SQL.
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["QINGLONG_BACKEND__PATH"] = str(path)
    for argv in (["project", "create", "bench"], ["task", "put", "bench", "job", "--", *JOB]):
        subprocess.run([sys.executable, "-m", "qinglong", *argv], env=env, check=True,
                       stdout=subprocess.DEVNULL, cwd=ROOT)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    specs = [provider.validate({"expression": expression, "timezone": z}) for z in ZONES]
    due_count = int(triggers * due_fraction)

    def rows():
        for i in range(triggers):
            spec = specs[i % len(specs)]
            if due_count and i < due_count:
                nxt = provider.latest_at_or_before(spec, now_ms)
            elif expression.split()[0] == "*" and len(expression.split()) == 6:
                nxt = None  # initialized by the first round
            else:
                nxt = now_ms + 3_600_000
            yield (f"tr{i:06d}", canonical_json(spec), nxt)

    batch = []
    for trigger_id, spec_json, nxt in rows():
        batch.append((trigger_id, spec_json, nxt))
        if len(batch) == 5000:
            _insert(conn, batch, now_ms, grace_ms)
            batch = []
    _insert(conn, batch, now_ms, grace_ms)
    conn.execute("COMMIT")
    conn.close()


def _insert(conn, batch, now_ms, grace_ms) -> None:
    conn.executemany(
        "INSERT INTO triggers (trigger_id, project_id, task_id, trigger_revision, kind, spec_json, "
        "misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms) "
        "VALUES (?, 'bench', 'job', 1, 'cron', ?, 'fire_once', ?, 1, 'sha256:0', ?)",
        [(t, s, grace_ms, now_ms) for t, s, _ in batch])
    conn.executemany(
        "INSERT INTO trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms, "
        "last_scheduled_at_ms, state_version, updated_at_ms, published_at_ms) "
        "VALUES (?, 'bench', 1, ?, NULL, 1, ?, ?)",
        [(t, n, now_ms, now_ms) for t, _, n in batch])


# ---------------------------------------------------------------- child processes

def child_floor(imports: str) -> dict:
    """Only ``imports`` (``none``: the bare child)."""
    if imports != "none":
        exec(imports, {})
    return {}


def child_ceiling(path: str, count: int, synchronous: str) -> dict:
    """The admission transaction shape with stdlib sqlite3, one transaction per occurrence."""
    import uuid
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    now = int(time.time() * 1000)
    started = time.perf_counter()
    done = 0
    while done < count:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            "SELECT trigger_id, trigger_revision, state_version, next_fire_at_ms FROM trigger_schedules "
            "WHERE next_fire_at_ms <= ? ORDER BY next_fire_at_ms, project_id, trigger_id LIMIT 1",
            (now,)).fetchone()
        if row is None:
            conn.execute("ROLLBACK")
            break
        tid, rev, version, nxt = row
        conn.execute("UPDATE trigger_schedules SET next_fire_at_ms = ?, last_scheduled_at_ms = ?, "
                     "state_version = state_version + 1, updated_at_ms = ? WHERE trigger_id = ? AND "
                     "trigger_revision = ? AND state_version = ? AND next_fire_at_ms IS ?",
                     (nxt + 3_600_000, nxt, now, tid, rev, version, nxt))
        run_id = uuid.uuid4().hex
        conn.execute("INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
                     "task_revision, task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state, "
                     "idempotency_key) VALUES (?, 'bench', ?, ?, 'job', 1, 'sha256:0', ?, ?, ?, 'queued', ?)",
                     (run_id, tid, rev, nxt, now, now, f"ql3:cron:v1:{tid}:{rev}:{nxt}"))
        conn.execute("INSERT INTO attempts (attempt_id, run_id, attempt_no, state, executor, "
                     "execution_digest, created_at_ms) VALUES (?, ?, 1, 'claimed', 'local_process', "
                     "'sha256:0', ?)", (uuid.uuid4().hex, run_id, now))
        conn.execute("INSERT INTO run_events (run_id, seq, type, at_ms) VALUES (?1, 1, 'run.created', ?2), "
                     "(?1, 2, 'run.queued', ?2)", (run_id, now))
        conn.execute("COMMIT")
        done += 1
    elapsed = time.perf_counter() - started
    return {"transactions": done, "tps": round(done / elapsed)}


def _host(path: str, page_size: int, synchronous: str):
    """The edge host as ``qinglong run`` builds it: settings file, plugins, container, lifecycle."""
    settings = Path(path).with_suffix(".toml")
    cache = os.environ.get("QINGLONG_BENCH_CACHE_KIB")
    settings.write_text(
        f'profile = "edge"\n[scheduler]\npage_size = {page_size}\ncadence_ms = 1000\n'
        f'[backend]\npath = "{path}"\nsynchronous = "{synchronous}"\n'
        + (f"cache_kib = {int(cache)}\n" if cache else "")
        + '[diagnostics]\nlevel = "warning"\n'
    )
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    return build_container(load_settings(settings)).lifecycle()


def child_drain(path: str, page_size: int, synchronous: str, due: int) -> dict:
    """Boot the host, let its scheduler loop drain the backlog, then sit idle for a moment."""
    import asyncio
    import gc

    started = time.perf_counter()
    lifecycle = _host(path, page_size, synchronous)
    import_s = time.perf_counter() - started
    built = _current_rss()  # where the memory goes: imports and the built container, then the start

    async def run() -> dict:
        t0 = time.perf_counter()
        await lifecycle.start()
        after_start = _current_rss()
        while lifecycle.loop.stats.admitted < due:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - t0
        stats = lifecycle.loop.stats
        gc.collect()
        await asyncio.sleep(1.5)
        idle = _current_rss()
        await lifecycle.stop()
        return {"admitted": stats.admitted, "rounds": stats.rounds, "seconds": round(elapsed, 3),
                "admissions_per_s": round(stats.admitted / elapsed) if elapsed else None,
                "built_rss_mib": round(built / MiB, 1), "started_rss_mib": round(after_start / MiB, 1),
                "idle_rss_mib": round(idle / MiB, 1)}

    result = asyncio.run(run())
    result["import_and_boot_ms"] = round(import_s * 1000, 1)
    return result


def child_steady(path: str, page_size: int, seconds: float, synchronous: str) -> dict:
    """The host's lifecycle for ``seconds``: rounds aligned to the second, as in production."""
    import asyncio

    lifecycle = _host(path, page_size, synchronous)

    async def run() -> dict:
        start_ms = time.time_ns() // 1_000_000
        await lifecycle.start()
        await asyncio.sleep(seconds)
        await lifecycle.stop()
        return {"start_ms": start_ms, "failed_rounds": lifecycle.last_stats.failed_rounds}

    return asyncio.run(run())


def _clean_venv() -> str:
    """A virtualenv with only ``qinglong[edge]`` from this checkout (rebuilt when the code changed)."""
    venv = ROOT / "bench" / "results" / "venv-edge"
    stamp = venv / "qinglong-source.txt"
    source = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "qinglong", "pyproject.toml"],
                           capture_output=True, text=True).stdout
    wanted = source + ("+dirty" if dirty else "")
    if not stamp.exists() or stamp.read_text() != wanted or dirty:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                        f"{ROOT}[edge]"], check=True)
        stamp.write_text(wanted)
    return str(venv / "bin" / "python")


# ---------------------------------------------------------------- parent

def _percentile(values: list[int], q: float) -> int:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=10_000, help="triggers of the drain run (half due)")
    parser.add_argument("--steady-triggers", type=int, default=1_000, help="one-second triggers of the lag run")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the lag run")
    parser.add_argument("--page-size", type=int, default=128, help="page size (the edge cap is 128)")
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal")
    parser.add_argument("--memory-scales", default="1000,100000",
                        help="trigger counts of the extra drain runs that compare peak RSS")
    parser.add_argument("--cache-kib", type=int, default=None,
                        help="override [backend] cache_kib (default: the edge profile's value)")
    parser.add_argument("--python", default=None,
                        help="interpreter for the measured children (default: a clean qinglong[edge] venv)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        mode, *rest = args.child
        result = {"floor": lambda: child_floor(rest[0]),
                  "ceiling": lambda: child_ceiling(rest[0], int(rest[1]), rest[2]),
                  "drain": lambda: child_drain(rest[0], int(rest[1]), rest[2], int(rest[3])),
                  "steady": lambda: child_steady(rest[0], int(rest[1]), float(rest[2]), rest[3])}[mode]()
        result["peak_rss_bytes"] = _own_peak_rss()
        print(json.dumps(result))
        return

    global PYTHON
    PYTHON = args.python or _clean_venv()
    if args.cache_kib is not None:
        os.environ["QINGLONG_BENCH_CACHE_KIB"] = str(args.cache_kib)
    results: dict = {"python": sys.version.split()[0], "interpreter": PYTHON, "sqlite": sqlite3.sqlite_version,
                     "cache_kib": args.cache_kib or "profile default",
                     "synchronous": args.synchronous, "page_size": args.page_size}
    bare, _ = _child("floor", "none")
    floor, _ = _child("floor", FLOOR_IMPORTS)
    floor_containers, _ = _child("floor", FLOOR_CONTAINER_IMPORTS)
    floor_di_root, _ = _child("floor", FLOOR_DI_ROOT)
    results["floor_bare_python_peak_rss_mib"] = round(bare / MiB, 1)
    results["floor_imports_peak_rss_mib"] = round(floor / MiB, 1)
    results["floor_imports_with_di_containers_peak_rss_mib"] = round(floor_containers / MiB, 1)
    results["floor_di_root_peak_rss_mib"] = round(floor_di_root / MiB, 1)

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        now = int(time.time() * 1000)

        def drain_run(count: int) -> dict:
            db = tmpdir / f"drain-{count}.db"
            make_database(db, count, 0.5, "* * * * *", now_ms=int(time.time() * 1000))
            peak, drain = _child("drain", str(db), str(args.page_size), args.synchronous, str(count // 2))
            drain["triggers"] = count
            drain["due"] = count // 2
            drain["peak_rss_mib"] = round(peak / MiB, 1)
            return drain

        ceiling_db = tmpdir / "ceiling.db"
        make_database(ceiling_db, args.triggers, 0.5, "* * * * *", now_ms=now)
        _, ceiling = _child("ceiling", str(ceiling_db), str(args.triggers // 2), args.synchronous)
        results["ceiling_stdlib_sqlite3"] = ceiling

        results["drain"] = drain_run(args.triggers)
        scales = [int(s) for s in args.memory_scales.split(",") if s.strip()]
        results["memory_scales"] = [drain_run(count) for count in scales]

        steady_db = tmpdir / "steady.db"
        make_database(steady_db, args.steady_triggers, 0.0, "* * * * * *", now_ms=now)
        peak, steady = _child("steady", str(steady_db), str(args.page_size), str(args.seconds),
                              args.synchronous)
        conn = sqlite3.connect(steady_db)
        warm_ms = steady["start_ms"] + 2_000  # skip initialization and the first second
        lags = [r[0] for r in conn.execute(
            "SELECT admitted_at_ms - scheduled_for_ms FROM runs WHERE scheduled_for_ms >= ?", (warm_ms,))]
        conn.close()
        results["steady"] = {
            "triggers": args.steady_triggers, "seconds": args.seconds, "runs_measured": len(lags),
            "lag_p50_ms": _percentile(lags, 0.50) if lags else None,
            "lag_p99_ms": _percentile(lags, 0.99) if lags else None,
            "lag_max_ms": max(lags) if lags else None,
            "peak_rss_mib": round(peak / MiB, 1),
        }

    drain = results["drain"]
    by_scale = {m["triggers"]: m["peak_rss_mib"] for m in results["memory_scales"]}
    results["targets"] = {
        "peak_rss_le_import_floor_plus_6mib": drain["peak_rss_mib"] <= results["floor_imports_peak_rss_mib"] + 6,
        # the floor a dependency-injector composition root cannot go below
        "peak_rss_le_di_root_floor_plus_6mib":
            drain["peak_rss_mib"] <= results["floor_di_root_peak_rss_mib"] + 6,
        "admissions_ge_half_ceiling": drain["admissions_per_s"] >= ceiling["tps"] / 2,
        "steady_lag_p99_lt_1500ms": (results["steady"]["lag_p99_ms"] or 0) < 1500,
    }
    if 1000 in by_scale and 100000 in by_scale:
        results["targets"]["peak_rss_100k_le_1k_plus_3mib"] = by_scale[100000] <= by_scale[1000] + 3

    out = ROOT / "bench" / "results" / "edge.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
