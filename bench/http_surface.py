"""What the HTTP surface costs on edge: RSS of ``qinglong run`` with ``[http]`` off and on (idle and
scraped ten times a second), the import cost of the server libraries it could have been built on,
and the wall time of a ``/metrics`` scrape and of the status page at a given schedule count.

    python bench/http_surface.py [--schedules 10000] [--seconds 8] [--repeat 3] [--json]

Modes: ``off`` (no ``[http]``), ``on`` (listening, never asked), ``scraped`` (``/metrics`` once a
second, as Prometheus would), ``storm`` (``/metrics`` and ``/`` ten times a second). RSS figures:
``VmRSS`` of the child one second before it stops (steady state) and its peak RSS (``wait4``),
medians of ``--repeat`` runs; admission lag from the Runs table (admitted minus scheduled) of the
occurrences each run admitted. Absolute numbers drift between machines; the differences
are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
MiB = 1024 * 1024
LISTENING = re.compile(r"HTTP surface listening on [0-9.]+:(\d+)")
CANDIDATES = {
    "asyncio + prometheus_client (the floor of any choice)": "import asyncio, prometheus_client",
    "+ http.server parser (chosen)": "import asyncio, prometheus_client, http.server",
    "+ h11": "import asyncio, prometheus_client, h11",
    "+ aiohttp.web": "import asyncio, prometheus_client, aiohttp.web",
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_") and k != "NOTIFY_SOCKET"}
    env["PYTHONPATH"] = str(REPO)
    return env


def peak_rss(argv: list[str]) -> int | None:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    _, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss * 1024 if os.waitstatus_to_exitcode(status) == 0 else None


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def populate(root: Path, schedules: int, every_second: int) -> None:
    """A store with ``schedules`` yearly triggers (never due while measuring) and ``every_second``
    triggers firing each second (a task that runs ``true``)."""
    sys.path.insert(0, str(REPO))
    from qinglong.contracts.execution import parse_execution_spec, spec_to_payload
    from qinglong.contracts.records import TriggerDefinition
    from qinglong.host.cli.task import execution_limits
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    loaded = load_settings(root / "off.toml")
    payload = spec_to_payload(parse_execution_spec("t", {"command": ["true"]}, execution_limits(loaded)))

    async def fill() -> None:
        backend = build_container(loaded).backend()
        await backend.open()
        await backend.migrate()
        pub = backend.publisher()
        await pub.create_project("bench", "bench")
        await pub.put_task("bench", "t", payload)
        for i in range(schedules + every_second):
            expression = "* * * * * *" if i < every_second else "0 0 1 1 *"
            await pub.put_trigger(TriggerDefinition(project_id="bench", trigger_id=f"tr{i}", task_id="t",
                                                    kind="cron", spec={"expression": expression,
                                                                       "timezone": "UTC"}))
        await backend.close()

    asyncio.run(fill())


def write_settings(root: Path) -> None:
    base = f'profile = "edge"\n[backend]\npath = "{root / "q.db"}"\n'
    (root / "off.toml").write_text(base)
    (root / "on.toml").write_text(base + '[http]\nlisten = "127.0.0.1:0"\n')


#: mode -> (HTTP on, seconds between scrapes or None, paths scraped)
MODES = {"off": (False, None, ()), "on": (True, None, ()), "scraped": (True, 1.0, ("/metrics",)),
         "storm": (True, 0.1, ("/metrics", "/"))}


def admission_lags(db: Path, from_ms: int, to_ms: int) -> list[int]:
    """Admitted minus scheduled (ms) of the Runs scheduled in ``[from_ms, to_ms)``, ascending."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT admitted_at_ms - scheduled_for_ms FROM runs WHERE scheduled_for_ms >= ? "
                            "AND scheduled_for_ms < ? ORDER BY 1", (from_ms, to_ms)).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]


def run_once(root: Path, mode: str, seconds: float) -> dict:
    """One ``qinglong run`` for ``seconds`` in one of :data:`MODES`."""
    http_on, interval, paths = MODES[mode]
    settings = root / ("on.toml" if http_on else "off.toml")
    wall_start_ms = time.time_ns() // 1_000_000
    proc = subprocess.Popen([PYTHON, "-m", "qinglong", "--settings", str(settings), "run", "--for-seconds",
                             str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=root)
    lines: list[str] = []
    port_seen = threading.Event()
    port: list[int] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            match = LISTENING.search(line)
            if match:
                port.append(int(match.group(1)))
                port_seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    scrape_ms: list[float] = []
    page_ms: list[float] = []
    if http_on:
        assert port_seen.wait(60), "".join(lines)
    while time.monotonic() - started < seconds - 1:
        if interval is not None:
            for path, into in ((p, scrape_ms if p == "/metrics" else page_ms) for p in paths):
                conn = http.client.HTTPConnection("127.0.0.1", port[0], timeout=30)
                t0 = time.perf_counter()
                conn.request("GET", path)
                conn.getresponse().read()
                into.append((time.perf_counter() - t0) * 1000)
                conn.close()
            time.sleep(interval)
        else:
            time.sleep(0.05)
    steady = vm_rss(proc.pid)
    wall_end_ms = time.time_ns() // 1_000_000
    _, status, usage = os.wait4(proc.pid, 0)
    reader.join(10)
    # the Runs scheduled while the process was settled (its first and last second left out)
    lags = admission_lags(root / "q.db", wall_start_ms + 2000, wall_end_ms - 1000)
    return {"steady_rss": steady, "peak_rss": usage.ru_maxrss * 1024, "scrape_ms": scrape_ms,
            "page_ms": page_ms, "lags": lags, "exit": os.waitstatus_to_exitcode(status)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--every-second", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    results: dict = {"imports_peak_rss_mib": {}}
    for label, code in CANDIDATES.items():
        peaks = [peak_rss([PYTHON, "-c", code]) for _ in range(5)]
        ok = [p for p in peaks if p is not None]
        results["imports_peak_rss_mib"][label] = round(statistics.median(ok) / MiB, 2) if ok else "not installed"

    with tempfile.TemporaryDirectory(prefix="qinglong-bench-http-") as tmp:
        root = Path(tmp)
        write_settings(root)
        t0 = time.monotonic()
        populate(root, args.schedules, args.every_second)
        results["populate_s"] = round(time.monotonic() - t0, 1)
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(run_once(root, mode, args.seconds))
    for mode, measured in runs.items():
        results[f"{mode}_steady_rss_mib"] = round(statistics.median(m["steady_rss"] for m in measured) / MiB, 1)
        results[f"{mode}_peak_rss_mib"] = round(statistics.median(m["peak_rss"] for m in measured) / MiB, 1)
        lags = sorted(lag for m in measured for lag in m["lags"])
        if lags:
            results[f"{mode}_admission_lag_ms_p50"] = lags[len(lags) // 2]
            results[f"{mode}_admission_lag_ms_p99"] = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
            results[f"{mode}_admissions_measured"] = len(lags)
    results["http_adds_steady_rss_mib"] = round(results["on_steady_rss_mib"] - results["off_steady_rss_mib"], 1)
    results["http_storm_adds_steady_rss_mib"] = round(
        results["storm_steady_rss_mib"] - results["off_steady_rss_mib"], 1)
    results["http_adds_peak_rss_mib"] = round(results["on_peak_rss_mib"] - results["off_peak_rss_mib"], 1)
    scrapes = sorted(ms for m in runs["storm"] for ms in m["scrape_ms"])
    pages = sorted(ms for m in runs["storm"] for ms in m["page_ms"])
    if scrapes:
        results["scrape_ms_p50"] = round(statistics.median(scrapes), 1)
        results["scrape_ms_p99"] = round(scrapes[min(len(scrapes) - 1, int(len(scrapes) * 0.99))], 1)
        results["scrapes"] = len(scrapes)
    if pages:
        results["status_page_ms_p50"] = round(statistics.median(pages), 1)
    results.update(schedules=args.schedules, every_second=args.every_second, seconds=args.seconds,
                   repeat=args.repeat)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
