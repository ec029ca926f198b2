"""Benchmark of a local burst: N jobs due at one instant, started through S slots, by ``qinglong
run`` beside a bare asyncio loop and APScheduler 3 in the same run. A script run by hand, never a
test.

    python bench/local_burst.py [--jobs 1000] [--repeat 1] [--latency-seconds 40] [--source DIR]

(APScheduler 3 comes with the ``bench`` extra: ``pip install -e '.[bench]'``.)

Every runner is a process of its own running the same no-op job (``/bin/true``) N times, all due
at one instant T (about 8 s after the runner starts, so start-up is over), with S slots:

* bare: an asyncio loop, ``asyncio.Semaphore(S)`` around ``create_subprocess_exec`` and
  ``wait``, all N coroutines released at T: the ceiling;
* APScheduler 3: a ``BackgroundScheduler`` with a ``ThreadPoolExecutor(S)`` and N ``date`` jobs
  at T (``misfire_grace_time=None``, so a late job is run, not dropped), each running the
  process with ``subprocess.run``: a scheduler that keeps nothing durable;
* executor alone: the ``local_process`` executor (its shell wrapper) starting, waiting for and
  reading the receipt of the same jobs with no store and no dispatcher: the floor under ours
  (``tree_cpu_s`` beside it: its CPU with that of every wrapper and job it reaped, and
  ``entries``: the files and directories its Attempt directories hold at the end);
* qinglong: a real ``qinglong run`` (settings file, plugins by entry point, the SQLite store, the
  dispatcher, the ``local_process`` executor and its shell wrapper) of the standalone profile
  (S = 16, its default; the HTTP surface on a free loopback port) and of the edge profile
  (S = 2, its default): N yearly cron triggers inserted into the store with their cursors at T,
  so the burst is admitted by the scheduler at T and then dispatched, every step durable
  (``max_queued`` = N: the default bound of a task's waiting Runs would skip most of the burst).

Figures: wall seconds from T to the last job's end (qinglong: the last Run's recorded end; the
others: the last ``wait`` returning), and the runner's own CPU seconds over the same span (its
utime + stime from ``/proc``, children excluded: what the control plane costs, not the jobs).
Beside them, admitted -> started p50/p99 of 1,000 Runs a minute spread over the seconds on the
standalone profile (``bench/execution.py``'s latency run, ``--latency-seconds`` long).

``--source DIR``: import qinglong from DIR. ``--before DIR``: also run ``qinglong run`` and the
executor alone imported from DIR (an exported older revision), interleaved with the current ones in
every repeat, so before and after figures share the machine's load. Results go to stdout and to
``bench/results/local_burst.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOOP = "/bin/true"
LEAD_S = 8.0  # T is this long after the runner starts
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _own_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` itself (its reaped children are not counted)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _sleep_until(at_s: float) -> None:
    while (left := at_s - time.time()) > 0:
        time.sleep(min(left, 0.5))


# ---------------------------------------------------------------- the comparison runners (children)

def child_bare(jobs: int, slots: int, at_s: float) -> dict:
    import asyncio

    async def run() -> dict:
        gate = asyncio.Event()
        sem = asyncio.Semaphore(slots)

        async def one() -> None:
            await gate.wait()
            async with sem:
                proc = await asyncio.create_subprocess_exec(NOOP, stdin=asyncio.subprocess.DEVNULL,
                                                            start_new_session=True)
                await proc.wait()

        tasks = [asyncio.ensure_future(one()) for _ in range(jobs)]
        await asyncio.sleep(max(0.0, at_s - time.time()))
        cpu0 = time.process_time()
        gate.set()
        await asyncio.gather(*tasks)
        return {"wall_s": round(time.time() - at_s, 3), "cpu_s": round(time.process_time() - cpu0, 3)}

    return asyncio.run(run())


def child_apscheduler(jobs: int, slots: int, at_s: float) -> dict:
    import datetime
    import threading

    try:
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler
    except ImportError:
        raise SystemExit("the APScheduler 3 cell needs the bench extra: pip install -e '.[bench]'") from None

    done = threading.Event()
    lock = threading.Lock()
    ended = [0]

    def job() -> None:
        subprocess.run([NOOP], stdin=subprocess.DEVNULL, start_new_session=True)
        with lock:
            ended[0] += 1
            if ended[0] == jobs:
                done.set()

    scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(slots)},
                                    job_defaults={"misfire_grace_time": None, "coalesce": False,
                                                  "max_instances": 1}, timezone="UTC")
    when = datetime.datetime.fromtimestamp(at_s, datetime.timezone.utc)
    for i in range(jobs):
        scheduler.add_job(job, "date", run_date=when, id=f"j{i}")
    scheduler.start()
    _sleep_until(at_s)
    cpu0 = time.process_time()
    done.wait()
    wall = time.time() - at_s
    cpu = time.process_time() - cpu0
    scheduler.shutdown(wait=False)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "version": _apscheduler_version()}


def _apscheduler_version() -> str:
    from importlib.metadata import version

    return version("apscheduler")


# ---------------------------------------------------------------- qinglong

def _execution_bench():
    spec = importlib.util.spec_from_file_location("bench_execution", ROOT / "bench" / "execution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workspace(base, root: Path, name: str, profile: str, execution: dict, source: str | None):
    class ProfileWorkspace(base):
        def write_settings(self, values: dict) -> None:
            super().write_settings(values)
            text = self.settings.read_text().replace('profile = "edge"', f'profile = "{profile}"')
            if profile == "standalone":
                text += f'[http]\nlisten = "127.0.0.1:{_free_port()}"\n'
            self.settings.write_text(text)

        def env(self) -> dict:
            env = super().env()
            if source:
                env["PYTHONPATH"] = source
            return env

    return ProfileWorkspace(root, name, execution)


def qinglong_burst(ex, root: Path, name: str, profile: str, jobs: int, slots: int,
                   source: str | None) -> dict:
    # the queue the burst needs: by default a task's Runs beyond max_queued waiting (16 on edge)
    # are skipped, which would measure shedding, not running
    ws = _workspace(ex.Workspace, root, name, profile, {"max_running": slots, "max_queued": jobs}, source)
    ws.publish({"noop": [NOOP]})
    at_ms = int((time.time() + LEAD_S) * 1000)
    ws.add_triggers("noop", [(f"b{i:05d}", "0 0 1 1 *", at_ms) for i in range(jobs)])
    proc = ws.start()
    _sleep_until(at_ms / 1000 - 0.5)
    if proc.poll() is not None:
        raise SystemExit(f"qinglong run ended early: {(ws.root / 'run.log').read_text()[-2000:]}")
    cpu0 = _own_cpu_s(proc.pid)
    ended = (f"SELECT (SELECT count(*) FROM runs WHERE state IN {ex.TERMINAL}) "
             "+ (SELECT count(*) FROM run_skips)")
    ex._wait(lambda: ws.sql(ended)[0][0] >= jobs, "the burst ended", 1800, proc)
    cpu = _own_cpu_s(proc.pid) - cpu0
    ws.stop(proc)
    last, = ws.sql("SELECT max(finished_at_ms) FROM runs")[0]
    states = dict(ws.sql("SELECT state, count(*) FROM runs GROUP BY state"))
    states["skipped"] = ws.sql("SELECT count(*) FROM run_skips")[0][0]
    # how many ran at once: the most Attempts whose [started, finished] spans overlap
    spans = ws.sql("SELECT started_at_ms, finished_at_ms FROM attempts WHERE started_at_ms IS NOT NULL")
    edges = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    now_running = peak = 0
    for _, step in edges:
        now_running += step
        peak = max(peak, now_running)
    return {"wall_s": round((last - at_ms) / 1000, 3), "cpu_s": round(cpu, 3),
            "peak_running": peak, "run_states": states}


def latency(ex, root: Path, seconds: float, source: str | None) -> dict:
    """1,000 Runs a minute on the standalone profile: admitted -> started (execution.py's run)."""
    original = ex.Workspace
    ex.Workspace = lambda base, name, execution: _workspace(original, base, name, "standalone", execution, source)
    try:
        return ex.latency(root, seconds, 16)
    finally:
        ex.Workspace = original


def child_executor(jobs: int, slots: int, at_s: float) -> dict:
    """The ``local_process`` executor alone (its shell wrapper; no store, no dispatcher): the
    floor under ``qinglong run``, between it and the bare loop."""
    import asyncio
    import resource
    import uuid

    from qinglong.contracts.execution import ExecutionSpec, ExecutorContext, StartRequest, minimal_environment
    from qinglong.plugins.local_process import create_executor

    log_dir = tempfile.mkdtemp(prefix="ql-bench-executor-")
    executor = create_executor(ExecutorContext(log_dir=log_dir, base_env=minimal_environment("/"),
                                               kill_grace_ms=1000))
    spec = ExecutionSpec(command=(NOOP,))

    async def run() -> dict:
        gate = asyncio.Event()
        sem = asyncio.Semaphore(slots)

        async def one() -> None:
            await gate.wait()
            async with sem:
                attempt = uuid.uuid4().hex
                request = StartRequest(attempt, attempt, 1, 0, spec, os.path.join(log_dir, attempt))
                handle = await executor.start(request)
                await executor.wait(request.attempt_dir, handle)
                assert executor.read_receipt(request.attempt_dir) is not None

        def tree_cpu() -> float:
            own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime

        tasks = [asyncio.ensure_future(one()) for _ in range(jobs)]
        await asyncio.sleep(max(0.0, at_s - time.time()))
        cpu0, tree0 = time.process_time(), tree_cpu()
        gate.set()
        await asyncio.gather(*tasks)
        return {"wall_s": round(time.time() - at_s, 3), "cpu_s": round(time.process_time() - cpu0, 3),
                "tree_cpu_s": round(tree_cpu() - tree0, 3),
                "entries": sum(len(dirs) + len(files) for _, dirs, files in os.walk(log_dir))}

    try:
        return asyncio.run(run())
    finally:
        import shutil

        shutil.rmtree(log_dir, ignore_errors=True)


CHILDREN = {"bare": child_bare, "apscheduler": child_apscheduler, "executor": child_executor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each cell, interleaved; the median is shown")
    parser.add_argument("--latency-seconds", type=float, default=40.0, help="0: no latency run")
    parser.add_argument("--source", default=None, help="import qinglong from this directory")
    parser.add_argument("--before", default=None,
                        help="also run qinglong imported from this directory (an older revision), "
                             "interleaved with the current one")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, jobs, slots, at_s = args.child
        print(json.dumps(CHILDREN[kind](int(jobs), int(slots), float(at_s))))
        return

    sys.path.insert(0, str(ROOT))
    ex = _execution_bench()
    source = os.path.abspath(args.source) if args.source else None
    before = os.path.abspath(args.before) if args.before else None
    results: dict = {"jobs": args.jobs, "source": source or str(ROOT), "before": before,
                     "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()[0], "cells": {}}

    def child(kind: str, slots: int, from_dir: str | None) -> dict:
        at_s = time.time() + LEAD_S
        env = dict(os.environ, PYTHONPATH=from_dir) if from_dir else None
        out = subprocess.run([sys.executable, __file__, "--child", kind, str(args.jobs), str(slots), str(at_s)],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:  # say why (a peer not installed, say), not only that it failed
            raise SystemExit(f"the {kind} child exited {out.returncode}:\n{out.stderr.strip()[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    runners = ["bare", "apscheduler", "executor", "qinglong"] + (["executor-before", "qinglong-before"] if before else [])
    cells = [("standalone", 16), ("edge", 2)]
    with tempfile.TemporaryDirectory(prefix="ql-bench-burst-") as tmp:
        root = Path(tmp)
        for profile, slots in cells:
            runs: dict[str, list[dict]] = {runner: [] for runner in runners}
            for i in range(args.repeat):
                for runner in runners:
                    if runner.startswith("qinglong"):
                        from_dir = before if runner == "qinglong-before" else source
                        runs[runner].append(qinglong_burst(ex, root, f"{profile}-{runner}-{i}", profile,
                                                           args.jobs, slots, from_dir))
                    elif runner == "executor-before":
                        runs[runner].append(child("executor", slots, before))
                    else:
                        runs[runner].append(child(runner, slots, source))
            for runner in runners:
                cell = {"slots": slots, "runs": runs[runner],
                        "wall_s": statistics.median(r["wall_s"] for r in runs[runner]),
                        "cpu_s": statistics.median(r["cpu_s"] for r in runs[runner])}
                extra = ""
                if runner.startswith("executor"):
                    cell["tree_cpu_s"] = statistics.median(r["tree_cpu_s"] for r in runs[runner])
                    cell["entries"] = runs[runner][-1]["entries"]
                    extra = f"  tree cpu {cell['tree_cpu_s']:6.3f} s  entries {cell['entries']}"
                results["cells"][f"{profile}/{runner}"] = cell
                print(f"{profile:<10} {slots:>2} slots  {runner:<15} wall {cell['wall_s']:7.3f} s  "
                      f"cpu {cell['cpu_s']:6.3f} s{extra}", flush=True)
        if args.latency_seconds > 0:
            results["latency_standalone_1000_per_minute"] = latency(ex, root, args.latency_seconds, source)
            lat = results["latency_standalone_1000_per_minute"]
            print(f"admitted -> started at {lat['runs_per_minute']} Runs/min: p50 "
                  f"{lat['admitted_to_started_p50_ms']} ms, p99 {lat['admitted_to_started_p99_ms']} ms", flush=True)
    results["loadavg_at_end"] = os.getloadavg()[0]
    c = results["cells"]
    results["ratios"] = {
        "standalone_vs_bare": round(c["standalone/qinglong"]["wall_s"] / c["standalone/bare"]["wall_s"], 2),
        "standalone_vs_executor_alone": round(c["standalone/qinglong"]["wall_s"]
                                              / c["standalone/executor"]["wall_s"], 2),
        "edge_vs_apscheduler": round(c["edge/qinglong"]["wall_s"] / c["edge/apscheduler"]["wall_s"], 2),
        "edge_vs_executor_alone": round(c["edge/qinglong"]["wall_s"] / c["edge/executor"]["wall_s"], 2),
    }
    out_path = ROOT / "bench" / "results" / "local_burst.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["ratios"]))
    print(f"written to {out_path}")


if __name__ == "__main__":
    main()
