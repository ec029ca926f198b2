"""What the management API costs: latency of ``GET /api/v1/runs?limit=50`` and of ``POST`` task
run at 1, 10 and 50 concurrent clients against a real ``qinglong run`` on edge, beside the same
store calls made in-process without HTTP (the ceiling), and the RSS the API adds on edge. A script
run by hand, never a test.

    python bench/api.py [--quick] [--requests 2000] [--runs 500] [--clients 1,10,50]

* setup: an edge SQLite file with one project, one task and ``--runs`` queued manual Runs;
  ``[execution] enabled = false`` so admitted Runs stay queued (the API is measured, not jobs).
* HTTP: ``qinglong run`` with ``[http]`` on a free loopback port and ``[api] enabled``; each client
  a thread with one kept-alive connection (the standard library's client), ``--requests`` requests
  per level split over the clients; latency per request in the client; p50, p99, max and the
  requests per second of the level.
* ceiling: the same calls on the store in one process without HTTP (``list_runs(limit=50)`` plus
  the JSON serialiser, ``admit_manual_run``), ``--requests`` times, ``--clients`` of them at once
  as asyncio tasks on the backend's one connection.
* RSS: VmRSS of ``qinglong run`` on edge once ready and after 200 API requests, with ``[http]`` off,
  with ``[http]`` on (probes and metrics only), and with ``[api] enabled``; medians of 3 starts.

Results go to stdout and to ``bench/results/api.json`` (``api-quick.json`` with ``--quick``), with
the load average before and after (absolute figures drift with it).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
LISTENING = re.compile(r"HTTP surface listening on [0-9.]+:(\d+)")


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    e["PYTHONPATH"] = str(REPO)
    return e


def cli(settings: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "qinglong", "--settings", str(settings), *args], env=env(),
                          cwd=settings.parent, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"{args}: {done.stderr}")
    return done.stdout


def write_settings(root: Path, http: bool, api: bool) -> Path:
    settings = root / "settings.toml"
    text = f'profile = "edge"\n[backend]\npath = "{root / "q.db"}"\n[execution]\nenabled = false\n'
    if http:
        text += '[http]\nlisten = "127.0.0.1:0"\nrequest_timeout_ms = 60000\nmax_connections = 128\n'
    if api:
        text += "[api]\nenabled = true\nfailed_auth_burst = 10000\n"
    settings.write_text(text)
    return settings


async def seed(settings: Path, runs: int) -> None:
    sys.path.insert(0, str(REPO))
    from qinglong.host.cli.boot import opened_backend
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    container = build_container(load_settings(settings))
    async with opened_backend(container) as backend:
        store = backend.execution()
        for n in range(runs):
            await store.admit_manual_run("ops", "job", f"seed-{n}", time.time_ns() // 1_000_000)


class Running:
    def __init__(self, settings: Path, http: bool) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "qinglong", "--settings", str(settings), "run"],
                                        env=env(), cwd=settings.parent, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.port = 0
        deadline = time.monotonic() + 120
        for line in self.process.stderr:
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
            if (http and self.port) or "lifecycle.admission_open" in line:
                if not http or self.port:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("qinglong run did not start")
        threading.Thread(target=self.process.stderr.read, daemon=True).start()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]  # noqa: E731
    return {"p50_ms": round(pick(0.5) * 1000, 2), "p99_ms": round(pick(0.99) * 1000, 2),
            "max_ms": round(ordered[-1] * 1000, 2), "n": len(ordered)}


def http_level(port: int, token: str, clients: int, requests: int, method: str, path: str) -> dict:
    per = max(1, requests // clients)
    samples: list[float] = []
    lock = threading.Lock()
    failures = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        for _ in range(per):
            headers = {"Authorization": f"Bearer {token}"}
            if method == "POST":
                headers["Idempotency-Key"] = uuid.uuid4().hex
            started = time.perf_counter()
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            response.read()
            mine.append(time.perf_counter() - started)
            if response.status >= 300:
                failures.append(response.status)
        conn.close()
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit(f"{method} {path}: answers {sorted(set(failures))}")
    return {**percentiles(samples), "per_second": round(len(samples) / elapsed, 1)}


async def ceiling(settings: Path, clients: int, requests: int) -> dict:
    from qinglong.host.cli.boot import opened_backend
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings
    from qinglong.host.views import run_summary_json

    container = build_container(load_settings(settings))
    out = {}
    async with opened_backend(container, create=False) as backend:
        store = backend.execution()

        async def listing() -> None:
            json.dumps([run_summary_json(r) for r in await store.list_runs(limit=50)])

        async def admit() -> None:
            await store.admit_manual_run("ops", "job", uuid.uuid4().hex, time.time_ns() // 1_000_000)

        for name, call in (("runs", listing), ("task_run", admit)):
            samples: list[float] = []

            async def worker(n: int) -> None:
                for _ in range(n):
                    started = time.perf_counter()
                    await call()
                    samples.append(time.perf_counter() - started)

            started = time.perf_counter()
            await asyncio.gather(*(worker(max(1, requests // clients)) for _ in range(clients)))
            elapsed = time.perf_counter() - started
            out[name] = {**percentiles(samples), "per_second": round(len(samples) / elapsed, 1)}
    return out


def rss_modes(repeat: int) -> dict:
    figures: dict[str, list[tuple[int, int]]] = {"off": [], "http": [], "api": []}
    for _ in range(repeat):
        for mode in figures:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp)
                settings = write_settings(root, http=mode != "off", api=mode == "api")
                cli(settings, "project", "create", "ops")
                cli(settings, "task", "put", "ops", "job", "--", "true")
                token = cli(settings, "token", "create", "bench", "--scope", "admin").strip() if mode == "api" else ""
                plane = Running(settings, http=mode != "off")
                try:
                    time.sleep(1.0)  # let the first rounds settle before reading
                    ready = plane.rss_kib()
                    if mode == "api":
                        http_level(plane.port, token, 1, 200, "GET", "/api/v1/runs?limit=50")
                    elif mode == "http":
                        for _ in range(200):
                            conn = http.client.HTTPConnection("127.0.0.1", plane.port, timeout=60)
                            conn.request("GET", "/metrics")
                            conn.getresponse().read()
                            conn.close()
                    figures[mode].append((ready, plane.rss_kib()))
                finally:
                    plane.stop()
    return {mode: {"ready_mib": round(statistics.median(r for r, _ in v) / 1024, 1),
                   "after_200_requests_mib": round(statistics.median(a for _, a in v) / 1024, 1)}
            for mode, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--clients", default="1,10,50")
    parser.add_argument("--rss-repeat", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.runs, args.rss_repeat = 200, 100, 1
    levels = [int(c) for c in args.clients.split(",")]
    results: dict = {"load_before": os.getloadavg(), "requests": args.requests, "runs": args.runs, "levels": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = write_settings(root, http=True, api=True)
        cli(settings, "project", "create", "ops")
        cli(settings, "task", "put", "ops", "job", "--", "true")
        token = cli(settings, "token", "create", "bench", "--scope", "admin").strip()
        asyncio.run(seed(settings, args.runs))
        plane = Running(settings, http=True)
        try:
            for clients in levels:
                level = {
                    "runs_http": http_level(plane.port, token, clients, args.requests, "GET", "/api/v1/runs?limit=50"),
                    "task_run_http": http_level(plane.port, token, clients, args.requests, "POST",
                                                "/api/v1/projects/ops/tasks/job/runs"),
                    "ceiling": asyncio.run(ceiling(settings, clients, args.requests)),
                }
                results["levels"][str(clients)] = level
                c = level["ceiling"]
                print(f"{clients:>3} clients  GET runs p50 {level['runs_http']['p50_ms']} ms p99 "
                      f"{level['runs_http']['p99_ms']} ms ({level['runs_http']['per_second']}/s; ceiling p50 "
                      f"{c['runs']['p50_ms']} ms, {c['runs']['per_second']}/s)  POST run p50 "
                      f"{level['task_run_http']['p50_ms']} ms p99 {level['task_run_http']['p99_ms']} ms "
                      f"({level['task_run_http']['per_second']}/s; ceiling p50 {c['task_run']['p50_ms']} ms, "
                      f"{c['task_run']['per_second']}/s)", flush=True)
        finally:
            plane.stop()
    results["rss"] = rss_modes(args.rss_repeat)
    for mode, figure in results["rss"].items():
        print(f"RSS {mode:>4}: ready {figure['ready_mib']} MiB, after 200 requests {figure['after_200_requests_mib']} MiB")
    results["load_after"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("api-quick.json" if args.quick else "api.json")
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
