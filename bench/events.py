"""Benchmark of events out: events delivered per second to a local webhook receiver, and the
latency from a Run's outcome to its delivery. A script run by hand, never a test.

    python bench/events.py [--events 2000] [--runs 100] [--poll-ms 500,50] [--out bench-events.json]

On the edge profile (a SQLite file in a temporary directory), real ``qinglong run`` processes,
one webhook channel to a ``ThreadingHTTPServer`` on the loopback answering 200 at once:

* throughput (``--events``): N Runs admitted and cancelled through the execution store before
  the control plane starts (so N events wait in the outbox), then ``qinglong run`` with
  ``[execution] enabled = false``; figure: N / (last arrival - first arrival), events/s. The
  ceiling printed beside it: the same receiver taking N signed POSTs from one client thread in
  this process (urllib, one connection per request, as the notifier sends them).
* latency (``--runs``): ``qinglong run`` executing M Runs of ``true`` one at a time; figure:
  arrival at the receiver - the Run's recorded end (``at_ms`` of its event), p50 and p99, per
  ``[notifications] poll_ms`` given (the dispatcher wakes the loop at each Run end; the poll is
  its fallback).

Writes every figure to ``--out`` as JSON.
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.receiver import Receiver  # noqa: E402

SECRET = "bench-secret-0123456789"


def write_settings(root: Path, receiver: Receiver, *, execution: bool, poll_ms: int) -> Path:
    settings = root / "settings.toml"
    settings.write_text("\n".join([
        'profile = "edge"', "[backend]", f'path = "{root / "q.db"}"',
        "[execution]", f"enabled = {'true' if execution else 'false'}", 'poll_ms = 50',
        f'log_dir = "{root / "logs"}"', "max_running = 1",
        "[diagnostics]", 'level = "warning"',
        "[notifications]", 'default = "always"', f"poll_ms = {poll_ms}", "batch = 500",
        "concurrency = 16",
        "[notifications.channels.hook]", 'kind = "webhook"', f'url = "{receiver.url}/hook"',
        'secret_env = "BENCH_HOOK_SECRET"', ""]))
    return settings


def env_for(settings: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env.update(PYTHONPATH=str(ROOT), QINGLONG_SETTINGS=str(settings), BENCH_HOOK_SECRET=SECRET)
    return env


def cli(settings: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "qinglong", *args], env=env_for(settings),
                          capture_output=True, text=True, check=True).stdout


def start(settings: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "qinglong", "run"], env=env_for(settings),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(60)


async def fill_outbox(db: Path, n: int) -> None:
    from qinglong.contracts.execution import CancelReason
    from qinglong.contracts.store import BackendContext, SchedulerLimits
    from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

    class Sink:
        def emit(self, event):
            pass

    backend = create_backend(BackendContext(
        settings=EdgeSqliteSettings(path=str(db)),
        limits=SchedulerLimits(page_size=32, claim_budget=16, lease_ms=30_000, cadence_ms=1000),
        providers={}, diagnostics=Sink(), clock_ms=lambda: int(time.time() * 1000), owner="bench"))
    await backend.open()
    try:
        store = backend.execution()
        for i in range(n):
            now = int(time.time() * 1000)
            run_id, _ = await store.admit_manual_run("bench", f"t{i % 50}", f"k{i}", now)
            await store.request_cancel(run_id, CancelReason.OPERATOR, now)
    finally:
        await backend.close()


def seed(settings: Path, tasks: int) -> None:
    cli(settings, "db", "migrate")
    cli(settings, "project", "create", "bench")
    for i in range(tasks):
        cli(settings, "task", "put", "bench", f"t{i}", "--", "true")


def ceiling(receiver: Receiver, n: int) -> float:
    from qinglong.contracts.events import Message, OutboxEvent
    from qinglong.plugins.notify.webhook import WebhookNotifier

    notifier = WebhookNotifier("hook", receiver.url + "/ceiling", SECRET, 10)
    event = OutboxEvent("0" * 32, 1, "run.cancelled", "bench/t0", "bench", "t0", "", "r", "cancelled",
                        None, None, "cancelled", 0)
    started = time.perf_counter()
    for _ in range(n):
        with urllib.request.urlopen(notifier.request(Message(event)), timeout=10) as answer:
            answer.read()
    return n / (time.perf_counter() - started)


def throughput(n: int) -> dict:
    receiver = Receiver()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            settings = write_settings(root, receiver, execution=False, poll_ms=500)
            seed(settings, 50)
            asyncio.run(fill_outbox(root / "q.db", n))
            process = start(settings)
            try:
                receiver.wait_for(n, timeout=600)
            finally:
                stop(process)
            stamps = sorted(receiver_times(receiver))
            rate = (n - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
            ids = [h["X-Qinglong-Event"] for _, h, _ in receiver.received]
            return {"events": n, "delivered": len(set(ids)), "duplicates": len(ids) - len(set(ids)),
                    "events_per_s": round(rate, 1),
                    "ceiling_posts_per_s": round(ceiling(receiver, min(n, 1000)), 1)}
    finally:
        receiver.close()


def receiver_times(receiver: Receiver) -> list[float]:
    return [float(h["X-Bench-Arrival"]) for _, h, _ in receiver.received]


def latency(runs: int, poll_ms: int) -> dict:
    receiver = Receiver()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            settings = write_settings(root, receiver, execution=True, poll_ms=poll_ms)
            seed(settings, 1)
            process = start(settings)
            try:
                for i in range(runs):
                    cli(settings, "task", "run", "bench", "t0", "--idempotency-key", f"r{i}")
                    receiver.wait_for(i + 1, timeout=120)
            finally:
                stop(process)
            lags = sorted(float(h["X-Bench-Arrival"]) * 1000 - json.loads(b)["at_ms"]
                          for _, h, b in receiver.received)
            q = statistics.quantiles(lags, n=100, method="inclusive")
            return {"runs": runs, "poll_ms": poll_ms, "p50_ms": round(q[49], 1),
                    "p99_ms": round(q[98], 1), "max_ms": round(lags[-1], 1)}
    finally:
        receiver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--poll-ms", default="500,50")
    parser.add_argument("--out", default="bench-events.json")
    args = parser.parse_args()
    result = {"throughput": throughput(args.events),
              "latency": [latency(args.runs, int(p)) for p in args.poll_ms.split(",")]}
    t = result["throughput"]
    print(f"delivered {t['delivered']}/{t['events']} events, {t['duplicates']} duplicates: "
          f"{t['events_per_s']} events/s (ceiling: one client thread, {t['ceiling_posts_per_s']} "
          "signed POSTs/s to the same receiver)")
    for row in result["latency"]:
        print(f"outcome to delivery, poll_ms {row['poll_ms']}: p50 {row['p50_ms']} ms, "
              f"p99 {row['p99_ms']} ms, max {row['max_ms']} ms over {row['runs']} Runs "
              f"(ceiling: the loop's fallback poll, {row['poll_ms']} ms)")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
