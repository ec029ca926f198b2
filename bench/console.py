"""The web console's cost on edge: the first page's weight, and the time from navigation to the Runs
view drawn (50 Runs) in a real headless Chromium, beside the raw API call it makes (the ceiling).

A ``qinglong run`` on edge (execution off, so seeded Runs stay queued) with the API on, a store
seeded with 50 Runs, Debian's chromium driven by chromium-driver through Selenium. Each sample is
a fresh navigation (the console's answers are ``no-store``, so the shell, script, style and the
API calls are fetched every time). Results go to stdout and ``bench/results/console.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api as apibench  # noqa: E402  (bench/api.py: settings, seeding, the CLI)

RESULTS = apibench.RESULTS


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    import asyncio

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = apibench.write_settings(root, http=True, api=True)
        apibench.cli(settings, "project", "create", "ops")
        apibench.cli(settings, "task", "put", "ops", "job", "--", "true")
        asyncio.run(apibench.seed(settings, 50))
        token = apibench.cli(settings, "token", "create", "bench", "--scope", "run").strip()
        process = subprocess.Popen([sys.executable, "-m", "qinglong", "--settings", str(settings), "run"],
                                   env=apibench.env(), cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        try:
            port = None
            for line in process.stderr:
                match = apibench.LISTENING.search(line)
                if match:
                    port = int(match.group(1))
                    break
            assert port, "qinglong run did not listen"
            import threading

            threading.Thread(target=process.stderr.read, daemon=True).start()  # never a full pipe
            conn = http.client.HTTPConnection("127.0.0.1", port)
            weight = {}
            for path in ("/", "/console/app.js", "/console/app.css"):
                conn.request("GET", path)
                weight[path] = len(conn.getresponse().read())
            raw = []
            for _ in range(200):
                start = time.perf_counter()
                conn.request("GET", "/api/v1/runs?limit=100", headers={"Authorization": f"Bearer {token}"})
                conn.getresponse().read()
                raw.append((time.perf_counter() - start) * 1000)
            options = webdriver.ChromeOptions()
            options.binary_location = shutil.which("chromium")
            for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                         "--no-first-run", "--disable-component-update", "--disable-sync",
                         f"--user-data-dir={root / 'profile'}"):
                options.add_argument(flag)
            driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
            try:
                base = f"http://127.0.0.1:{port}/"
                driver.get(base)
                driver.find_element(By.ID, "token").send_keys(token)
                driver.find_element(By.CSS_SELECTOR, "#signin button[type=submit]").click()
                drawn = []
                for _ in range(args.samples):
                    driver.get("about:blank")
                    start = time.perf_counter()
                    driver.get(base + "#/runs")
                    while len(driver.find_elements(By.CSS_SELECTOR, "#view a[href^='#/run/']")) < 50:
                        time.sleep(0.002)
                    drawn.append((time.perf_counter() - start) * 1000)
            finally:
                driver.quit()
        finally:
            process.terminate()
            process.wait(timeout=60)
    results = {
        "first_page_bytes": weight, "first_page_total_bytes": sum(weight.values()), "ceiling_bytes": 150 * 1024,
        "runs_view_drawn_ms": {"p50": _p(drawn, 0.5), "p90": _p(drawn, 0.9), "samples": len(drawn)},
        "raw_api_runs_ms": {"p50": _p(raw, 0.5), "p90": _p(raw, 0.9), "samples": len(raw)},
    }
    print(f"first page: {results['first_page_total_bytes']} bytes (ceiling {150 * 1024}): {weight}")
    print(f"Runs view drawn (50 Runs, fresh navigation): p50 {results['runs_view_drawn_ms']['p50']} ms, "
          f"p90 {results['runs_view_drawn_ms']['p90']} ms; the raw GET /api/v1/runs?limit=100 "
          f"(ceiling): p50 {results['raw_api_runs_ms']['p50']} ms, p90 {results['raw_api_runs_ms']['p90']} ms")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "console.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
