"""What the HTTP surface costs on edge: RSS of ``qinglong run`` with ``[http]`` off and on (idle and
scraped ten times a second), the import cost of the server libraries it could have been built on,
and the wall time of a ``/metrics`` scrape and of the status page at a given schedule count.

    python bench/http_surface.py [--schedules 10000] [--seconds 8] [--repeat 3] [--json]

RSS figures: ``VmRSS`` of the child one second before it stops (steady state) and its peak RSS
(``wait4``), medians of ``--repeat`` runs. Absolute numbers drift between machines; the differences
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


def run_once(root: Path, mode: str, seconds: float) -> dict:
    """One ``qinglong run`` for ``seconds``: mode off, on (idle) or scraped (10 scrapes a second)."""
    settings = root / ("off.toml" if mode == "off" else "on.toml")
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
    if mode != "off":
        assert port_seen.wait(60), "".join(lines)
    while time.monotonic() - started < seconds - 1:
        if mode == "scraped":
            for path, into in (("/metrics", scrape_ms), ("/", page_ms)):
                conn = http.client.HTTPConnection("127.0.0.1", port[0], timeout=30)
                t0 = time.perf_counter()
                conn.request("GET", path)
                conn.getresponse().read()
                into.append((time.perf_counter() - t0) * 1000)
                conn.close()
            time.sleep(0.1)
        else:
            time.sleep(0.05)
    steady = vm_rss(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    reader.join(10)
    return {"steady_rss": steady, "peak_rss": usage.ru_maxrss * 1024, "scrape_ms": scrape_ms,
            "page_ms": page_ms, "exit": os.waitstatus_to_exitcode(status)}


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
        runs: dict[str, list[dict]] = {"off": [], "on": [], "scraped": []}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(run_once(root, mode, args.seconds))
    for mode, measured in runs.items():
        results[f"{mode}_steady_rss_mib"] = round(statistics.median(m["steady_rss"] for m in measured) / MiB, 1)
        results[f"{mode}_peak_rss_mib"] = round(statistics.median(m["peak_rss"] for m in measured) / MiB, 1)
    results["http_adds_steady_rss_mib"] = round(results["on_steady_rss_mib"] - results["off_steady_rss_mib"], 1)
    results["http_scraped_adds_steady_rss_mib"] = round(
        results["scraped_steady_rss_mib"] - results["off_steady_rss_mib"], 1)
    results["http_adds_peak_rss_mib"] = round(results["on_peak_rss_mib"] - results["off_peak_rss_mib"], 1)
    scrapes = sorted(ms for m in runs["scraped"] for ms in m["scrape_ms"])
    pages = sorted(ms for m in runs["scraped"] for ms in m["page_ms"])
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
