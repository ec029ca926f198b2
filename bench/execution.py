"""Benchmark of local execution on the edge profile. A script run by hand, never a test.

    python bench/execution.py [--quick] [--python PY] [--max-running 2] [--backlog 2000]
                              [--latency-seconds 40] [--triggers 10000]

The measured children run in the clean virtualenv bench/edge.py builds (only ``qinglong[edge]``
from this checkout, under ``bench/results/venv-edge``) unless ``--python`` names an interpreter;
``--quick`` uses the running interpreter.

Every figure of ours is measured on a real ``qinglong run`` (settings file, plugins loaded by entry
point, the edge store, the dispatcher, the ``local_process`` executor and its shell wrapper) in a
child process, beside its ceiling measured in the same run:

* ceiling: the same no-op job (``/bin/true``) started by a bare asyncio ``create_subprocess_exec``
  loop: the spawn latency (call -> process exists) p50/p99 one at a time; arrival -> started for
  bursts of 17 jobs through the same number of slots as ours (1,000 a minute arrive as ~17 at
  each second); and jobs completed per second draining a backlog with that concurrency
  (``--max-running``, the edge default 2; the full run repeats latency at the edge cap, 8);
* latency: 1,000 triggers spread over the minute (six-field crons ``S * * * * *``, about 17 Runs a
  second, 1,000 a minute) running ``/bin/true``: admitted -> process started p50/p99 (from the
  store: the Run's admission time, the Attempt's start time) and scheduled -> admitted beside it;
* executor alone: the ``local_process`` executor (its shell wrapper) starting, waiting for and
  reading the receipt of the same backlog with no store and no dispatcher, between the two;
* drain: a backlog of ``--backlog`` admitted no-op Runs (admitted first by a ``qinglong run`` with
  ``[execution] enabled = false``), then drained by one with it enabled: Runs completed per second;
* memory: peak RSS of ``qinglong run`` with ``--triggers`` triggers (ten of them firing every second
  a job that sleeps 2 s, so the running slots stay full; the rest hourly, not due) beside the same
  with ``[execution] enabled = false`` (the difference is what the dispatcher costs), the edge
  import floor beside them; and what each running job adds besides its own process: the control
  plane's RSS growth per running job, and the RSS/PSS of the processes the wrapper adds to the
  job's group (the waiter shell, its log reader's subshell and ``head``; PSS counts shared pages
  once, which is what a router's memory sees).

Results go to stdout and to ``bench/results/execution.json``. ``--quick`` shrinks every part to a
fast check (figures then say little). Uses only the stdlib and the project.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = len(sys.argv) > 1 and sys.argv[1] == "--child"
if not CHILD:  # the parent prepares databases from the checkout
    sys.path.insert(0, str(ROOT))

FLOOR_IMPORTS = "import pluggy, croniter, aiosqlite, pydantic_settings, dependency_injector"
MiB = 1024 * 1024
PYTHON = sys.executable
NOOP = "/bin/true"


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _peak_rss_of(argv: list[str]) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed")
    return usage.ru_maxrss * 1024


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise KeyError("Pss")


def _live_processes(field: int, value: int) -> list[int]:
    """Live (non-zombie) pids whose ``/proc/<pid>/stat`` field ``field`` (counted after the
    command name: 1 the parent, 2 the process group) is ``value``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[field]) == value and fields[0] != b"Z":
                found.append(int(entry.name))
    return found


def _children_of(pid: int) -> list[int]:
    return _live_processes(1, pid)


def _group_members(pgid: int) -> list[int]:
    return _live_processes(2, pgid)


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[:-1]
    except OSError:
        return []


# ---------------------------------------------------------------- the ceiling (a child process)

BURST = 17  # 1,000 Runs a minute, as they arrive: about 17 at each second


def child_ceiling(sequential: int, backlog: int, concurrency: int, bursts: int = 30) -> dict:
    """A bare asyncio loop starting ``/bin/true``: spawn latency one at a time, then a backlog."""
    import asyncio

    async def run() -> dict:
        latencies = []
        for _ in range(sequential):
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(NOOP, stdin=asyncio.subprocess.DEVNULL,
                                                        start_new_session=True)
            latencies.append((time.perf_counter() - t0) * 1000)
            await proc.wait()
        slots = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with slots:
                proc = await asyncio.create_subprocess_exec(NOOP, stdin=asyncio.subprocess.DEVNULL,
                                                            start_new_session=True)
                await proc.wait()

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(backlog)))
        elapsed = time.perf_counter() - t0

        # 1,000 a minute arrive as ~17 at each second (a cron's resolution is the second): the
        # same bursts through the same number of slots, arrival -> process started
        waits: list[float] = []

        async def arriving(t_arrival: float) -> None:
            async with slots:
                proc = await asyncio.create_subprocess_exec(NOOP, stdin=asyncio.subprocess.DEVNULL,
                                                            start_new_session=True)
                waits.append((time.perf_counter() - t_arrival) * 1000)
                await proc.wait()

        for _ in range(bursts):
            t_arrival = time.perf_counter()
            await asyncio.gather(*(arriving(t_arrival) for _ in range(BURST)))
        return {"spawn_latency_p50_ms": round(_percentile(latencies, 0.5), 2),
                "spawn_latency_p99_ms": round(_percentile(latencies, 0.99), 2),
                "burst_of": BURST, "bursts": bursts,
                "burst_arrival_to_started_p50_ms": round(_percentile(waits, 0.5), 2),
                "burst_arrival_to_started_p99_ms": round(_percentile(waits, 0.99), 2),
                "backlog": backlog, "concurrency": concurrency, "seconds": round(elapsed, 3),
                "completed_per_s": round(backlog / elapsed, 1)}

    return asyncio.run(run())


def child_executor(backlog: int, concurrency: int, log_dir: str) -> dict:
    """The ``local_process`` executor alone (its shell wrapper, no store, no dispatcher): start,
    wait, read the receipt of ``backlog`` no-op jobs through ``concurrency`` slots. Between the
    bare loop and ``qinglong run``, it says how much of the difference the wrapper costs."""
    import asyncio
    import uuid

    from qinglong.contracts.execution import (ExecutionSpec, ExecutorContext, StartRequest,
                                              minimal_environment)
    from qinglong.plugins.local_process import create_executor

    executor = create_executor(ExecutorContext(log_dir=log_dir, base_env=minimal_environment("/"),
                                               kill_grace_ms=1000))
    spec = ExecutionSpec(command=(NOOP,))

    async def run() -> dict:
        slots = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with slots:
                attempt = uuid.uuid4().hex
                request = StartRequest(attempt, attempt, 1, 0, spec, os.path.join(log_dir, attempt))
                handle = await executor.start(request)
                await executor.wait(request.attempt_dir, handle)
                assert executor.read_receipt(request.attempt_dir) is not None

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(backlog)))
        elapsed = time.perf_counter() - t0
        return {"backlog": backlog, "concurrency": concurrency, "seconds": round(elapsed, 3),
                "completed_per_s": round(backlog / elapsed, 1)}

    os.makedirs(log_dir, mode=0o700, exist_ok=True)
    return asyncio.run(run())


# ---------------------------------------------------------------- a workspace driving `qinglong run`

class Workspace:
    """A SQLite file, a log directory and a settings file; the CLI and `qinglong run` use them."""

    def __init__(self, root: Path, name: str, execution: dict) -> None:
        self.root = root / name
        self.root.mkdir()
        self.db = self.root / "q.db"
        self.settings = self.root / "settings.toml"
        self.write_settings(execution)

    def write_settings(self, execution: dict) -> None:
        values = {"log_dir": str(self.root / "logs"), **execution}
        lines = ['profile = "edge"', "[backend]", f"path = {json.dumps(str(self.db))}", "[execution]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        lines += ["[diagnostics]", 'level = "warning"']
        self.settings.write_text("\n".join(lines) + "\n")

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["QINGLONG_SETTINGS"] = str(self.settings)
        return env

    def cli(self, *args: str) -> str:
        result = subprocess.run([PYTHON, "-m", "qinglong", *args], cwd=self.root, env=self.env(),
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"qinglong {' '.join(args)} failed: {result.stderr}")
        return result.stdout

    def start(self) -> subprocess.Popen:
        log = (self.root / "run.log").open("ab")
        return subprocess.Popen([PYTHON, "-m", "qinglong", "run"], cwd=self.root, env=self.env(),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def stop(self, proc: subprocess.Popen) -> int:
        """SIGTERM; the child's own peak RSS (bytes, from wait4)."""
        proc.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"qinglong run exited {proc.returncode}: "
                             f"{(self.root / 'run.log').read_text()[-2000:]}")
        return usage.ru_maxrss * 1024

    def sql(self, statement: str, params: tuple = ()) -> list:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(statement, params).fetchall()
        finally:
            conn.close()

    def add_triggers(self, task: str, specs: list[tuple[str, str, int | None]]) -> None:
        """Triggers by bulk SQL (publishing 10,000 one by one would dominate the run):
        ``(trigger_id, cron expression, next_fire_at_ms or None)``."""
        from qinglong.contracts.records import canonical_json
        from qinglong.plugins.cron.provider import CronProvider

        provider = CronProvider()
        now = int(time.time() * 1000)
        conn = sqlite3.connect(self.db, isolation_level=None)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO triggers (trigger_id, project_id, task_id, trigger_revision, kind, spec_json, "
            "misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms) "
            "VALUES (?, 'bench', ?, 1, 'cron', ?, 'fire_once', 60000, 1, 'sha256:0', ?)",
            [(t, task, canonical_json(provider.validate({"expression": e, "timezone": "UTC"})), now)
             for t, e, _ in specs])
        conn.executemany(
            "INSERT INTO trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms, "
            "last_scheduled_at_ms, state_version, updated_at_ms, published_at_ms) "
            "VALUES (?, 'bench', 1, ?, NULL, 1, ?, ?)", [(t, n, now, now) for t, _, n in specs])
        conn.execute("COMMIT")
        conn.close()

    def publish(self, tasks: dict[str, list[str]]) -> None:
        self.cli("project", "create", "bench")
        for task, argv in tasks.items():
            self.cli("task", "put", "bench", task, "--", *argv)


def _wait(condition, what: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"qinglong run ended (rc {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not reached in {timeout:.0f} s")
        time.sleep(0.05)


TERMINAL = "('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')"


# ---------------------------------------------------------------- our figures

def latency(tmp: Path, seconds: float, max_running: int) -> dict:
    """1,000 triggers spread over the minute: admitted -> started of each Run."""
    ws = Workspace(tmp, f"latency-{max_running}", {"max_running": max_running})
    ws.publish({"noop": [NOOP]})
    ws.add_triggers("noop", [(f"s{i:04d}", f"{i % 60} * * * * *", None) for i in range(1000)])
    proc = ws.start()
    started_ms = int(time.time() * 1000)
    time.sleep(seconds)
    ws.stop(proc)
    warm = started_ms + 3000  # skip start-up and the first seconds
    rows = ws.sql("SELECT r.admitted_at_ms - r.scheduled_for_ms, a.started_at_ms - r.admitted_at_ms "
                  "FROM runs r JOIN attempts a USING (run_id) WHERE a.attempt_no = 1 "
                  "AND a.started_at_ms IS NOT NULL AND r.scheduled_for_ms >= ?", (warm,))
    admitted = ws.sql("SELECT count(*) FROM runs WHERE scheduled_for_ms >= ?", (warm,))[0][0]
    states = dict(ws.sql(f"SELECT state, count(*) FROM runs GROUP BY state"))
    lag = [r[0] for r in rows]
    start = [r[1] for r in rows]
    return {"triggers": 1000, "seconds": seconds, "max_running": max_running,
            "runs_measured": len(rows), "runs_admitted_measured_window": admitted,
            "runs_per_minute": round(admitted / max(1.0, (seconds - 3)) * 60),
            "admitted_to_started_p50_ms": _percentile(start, 0.5) if start else None,
            "admitted_to_started_p99_ms": _percentile(start, 0.99) if start else None,
            "admitted_to_started_max_ms": max(start) if start else None,
            "scheduled_to_admitted_p50_ms": _percentile(lag, 0.5) if lag else None,
            "scheduled_to_admitted_p99_ms": _percentile(lag, 0.99) if lag else None,
            "run_states": states}


def drain(tmp: Path, backlog: int, max_running: int) -> dict:
    """A backlog of admitted no-op Runs (admitted with execution off), drained with it on."""
    ws = Workspace(tmp, "drain", {"enabled": False, "max_running": max_running})
    ws.publish({"noop": [NOOP]})
    due = int(time.time() * 1000) - 1000
    # yearly crons made due once: each admits exactly one Run, none fires again during the run
    ws.add_triggers("noop", [(f"d{i:05d}", "0 0 1 1 *", due) for i in range(backlog)])
    proc = ws.start()
    _wait(lambda: ws.sql("SELECT count(*) FROM runs")[0][0] >= backlog, "the backlog admitted", 600, proc)
    ws.stop(proc)
    ws.write_settings({"enabled": True, "max_running": max_running})
    t0 = time.monotonic()
    proc = ws.start()
    _wait(lambda: ws.sql(f"SELECT count(*) FROM runs WHERE state IN {TERMINAL}")[0][0] >= backlog,
          "the backlog drained", 1800, proc)
    wall = time.monotonic() - t0
    ws.stop(proc)
    first, last = ws.sql("SELECT min(dispatched_at_ms), max(finished_at_ms) FROM attempts")[0]
    states = dict(ws.sql("SELECT state, count(*) FROM runs GROUP BY state"))
    span = (last - first) / 1000
    return {"backlog": backlog, "max_running": max_running, "seconds_first_dispatch_to_last_end": span,
            "completed_per_s": round(backlog / span, 1) if span else None,
            "wall_seconds_including_start": round(wall, 2), "run_states": states}


def memory(tmp: Path, triggers: int, seconds: float, max_running: int) -> dict:
    """Peak RSS with ``triggers`` triggers while jobs run, with and without the dispatcher."""
    out = {"triggers": triggers, "seconds": seconds, "max_running": max_running}
    for enabled in (True, False):
        name = "memory-on" if enabled else "memory-off"
        ws = Workspace(tmp, name, {"enabled": enabled, "max_running": max_running, "on_stop": "terminate"})
        ws.publish({"hold": ["sleep", "2"], "idle": [NOOP]})
        hour = int(time.time() * 1000) + 3_600_000
        specs = [(f"e{i}", "* * * * * *", None) for i in range(10)]
        ws.add_triggers("hold", specs)
        ws.add_triggers("idle", [(f"h{i:05d}", "0 * * * *", hour) for i in range(triggers - len(specs))])
        proc = ws.start()
        if enabled:
            _wait(lambda: ws.sql("SELECT count(*) FROM attempts WHERE state = 'running'")[0][0] >= max_running,
                  "the running slots full", 120, proc)
        time.sleep(seconds)
        hwm = _status_kib(proc.pid, "VmHWM") * 1024
        peak = ws.stop(proc)
        out["peak_rss_mib" if enabled else "peak_rss_without_dispatcher_mib"] = round(max(peak, hwm) / MiB, 1)
        if enabled:
            out["runs_succeeded"] = ws.sql("SELECT count(*) FROM runs WHERE state = 'succeeded'")[0][0]
    out["dispatcher_cost_mib"] = round(out["peak_rss_mib"] - out["peak_rss_without_dispatcher_mib"], 1)
    return out


def per_job(tmp: Path, jobs: int) -> dict:
    """What each running job adds besides its own process: the control plane's RSS growth per
    job, and the job's shell wrapper (the waiter that writes the receipt)."""
    ws = Workspace(tmp, "per-job", {"max_running": jobs, "on_stop": "terminate", "poll_ms": 200})
    ws.publish({"hold": ["sleep", "600"]})
    proc = ws.start()
    # idle first: let start-up allocations settle
    _wait(lambda: ws.db.exists(), "the database created", 60, proc)
    time.sleep(3)
    before = _status_kib(proc.pid, "VmRSS")
    for i in range(jobs):
        ws.cli("task", "run", "bench", "hold", "--idempotency-key", f"k{i}")
    _wait(lambda: ws.sql("SELECT count(*) FROM attempts WHERE state = 'running'")[0][0] >= jobs,
          "every job running", 120, proc)
    time.sleep(2)
    after = _status_kib(proc.pid, "VmRSS")
    wrappers = _children_of(proc.pid)
    # every process of the job's group except the job itself (`sleep 600`): the wrapper shell,
    # its log reader's subshell and `head`
    helpers = [p for w in wrappers for p in _group_members(w)
               if not (_cmdline(p)[-1:] == [b"600"] and _cmdline(p)[0].endswith(b"sleep"))]
    helper_rss = sum(_status_kib(p, "VmRSS") for p in helpers)
    helper_pss = sum(_pss_kib(p) for p in helpers)
    ws.stop(proc)
    n = len(wrappers) or 1
    return {"jobs": jobs, "control_plane_rss_idle_kib": before, "control_plane_rss_running_kib": after,
            "control_plane_kib_per_running_job": round((after - before) / jobs, 1),
            "wrappers_seen": len(wrappers), "helper_processes_per_job": round(len(helpers) / n, 1),
            "helpers_rss_kib_per_job": round(helper_rss / n),
            "helpers_pss_kib_per_job": round(helper_pss / n)}


def _clean_venv() -> str:
    """The clean ``qinglong[edge]`` virtualenv of bench/edge.py (one definition of it): a developer's
    environment carries packages an edge install does not, which alone cost several MiB."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_edge", ROOT / "bench" / "edge.py")
    edge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(edge)
    return edge._clean_venv()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a fast check, not figures")
    parser.add_argument("--python", default=None, help="interpreter of the measured children (default: "
                        "the clean qinglong[edge] venv bench/edge.py builds; with --quick: this one)")
    parser.add_argument("--max-running", type=int, default=2, help="[execution] max_running (edge default 2)")
    parser.add_argument("--backlog", type=int, default=2000, help="no-op Runs of the drain")
    parser.add_argument("--latency-seconds", type=float, default=40.0, help="length of the latency run")
    parser.add_argument("--triggers", type=int, default=10_000, help="triggers of the memory run")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, *rest = args.child
        if mode == "ceiling":
            print(json.dumps(child_ceiling(int(rest[0]), int(rest[1]), int(rest[2]))))
        else:
            print(json.dumps(child_executor(int(rest[0]), int(rest[1]), rest[2])))
        return

    global PYTHON
    if args.python:
        PYTHON = args.python
    elif not args.quick:
        PYTHON = _clean_venv()
    if args.quick:
        args.backlog, args.latency_seconds, args.triggers = 200, 10.0, 1000
    memory_seconds = 4.0 if args.quick else 10.0

    results: dict = {"python": sys.version.split()[0], "interpreter": PYTHON, "quick": args.quick,
                     "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()[0]}
    results["floor_bare_python_peak_rss_mib"] = round(_peak_rss_of([PYTHON, "-c", "pass"]) / MiB, 1)
    results["floor_imports_peak_rss_mib"] = round(_peak_rss_of([PYTHON, "-c", FLOOR_IMPORTS]) / MiB, 1)
    def ceiling(concurrency: int) -> dict:
        out = subprocess.run([PYTHON, __file__, "--child", "ceiling", "200" if not args.quick else "50",
                              str(args.backlog), str(concurrency)], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    results["ceiling_bare_asyncio"] = ceiling(args.max_running)
    with tempfile.TemporaryDirectory(prefix="ql-bench-exec-") as tmp:
        tmpdir = Path(tmp)
        results["latency"] = latency(tmpdir, args.latency_seconds, args.max_running)
        if not args.quick and args.max_running != 8:
            # the edge profile's cap: the bursts then queue far less
            results["ceiling_bare_asyncio_max_running_8"] = ceiling(8)
            results["latency_max_running_8"] = latency(tmpdir, args.latency_seconds, 8)
        out = subprocess.run([PYTHON, __file__, "--child", "executor", str(args.backlog),
                              str(args.max_running), str(tmpdir / "executor-logs")],
                             capture_output=True, text=True, check=True)
        results["executor_alone"] = json.loads(out.stdout.strip().splitlines()[-1])
        results["drain"] = drain(tmpdir, args.backlog, args.max_running)
        results["memory"] = memory(tmpdir, args.triggers, memory_seconds, args.max_running)
        results["per_running_job"] = per_job(tmpdir, 8)

    ceiling = results["ceiling_bare_asyncio"]
    mem = results["memory"]
    results["targets"] = {
        "drain_ge_half_ceiling": (results["drain"]["completed_per_s"] or 0) >= ceiling["completed_per_s"] / 2,
        "peak_rss_le_import_floor_plus_6mib": mem["peak_rss_mib"] <= results["floor_imports_peak_rss_mib"] + 6,
    }
    out_path = ROOT / "bench" / "results" / ("execution-quick.json" if args.quick else "execution.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"written to {out_path}")


if __name__ == "__main__":
    main()
