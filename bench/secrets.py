"""What sealing env values at rest costs: seal and open per second of one value (AES-GCM, the
rule of ``qinglong/contracts/secrets.py``), and publishing a task with 8 env values on an edge
SQLite file with the sealer and without it, in process. A script run by hand, never a test.

    python bench/secrets.py [--quick] [--values 20000] [--tasks 500]

* seal/open: ``--values`` values of 64 characters, each with its own associated data; the rate
  of each loop (``time.perf_counter``).
* publish: ``--tasks`` ``put_task`` calls of distinct tasks, each with 8 env values, on a fresh
  file per variant (``sealed``: the host's AES-GCM sealer; ``clear``: none); calls per second and
  the ratio, medians of 3 runs after a warm-up, the variants alternating; then one
  ``reseal_secrets`` (a rotation) of the sealed store, timed.

Results go to stdout and to ``bench/results/secrets.json`` (``secrets-quick.json`` with
``--quick``), with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results"

from qinglong.contracts.store import SchedulerLimits  # noqa: E402  (after the path)


def sealer(*keys: bytes):
    from qinglong.contracts.secrets import Sealer
    from qinglong.host.secrets import aes_gcm

    return Sealer(list(keys), aes_gcm)


def seal_open_rates(n: int) -> dict[str, float]:
    from qinglong.contracts.secrets import env_aad

    s = sealer(os.urandom(32))
    value = "v" * 64
    aads = [env_aad("p", f"t{i}", "TOKEN") for i in range(n)]
    start = time.perf_counter()
    sealed = [s.seal(value, aad) for aad in aads]
    sealing = time.perf_counter() - start
    start = time.perf_counter()
    for text, aad in zip(sealed, aads):
        s.open(text, aad)
    opening = time.perf_counter() - start
    return {"seal_per_s": round(n / sealing), "open_per_s": round(n / opening)}


def backend(path: Path, s):
    from qinglong.contracts.store import BackendContext
    from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend
    from qinglong.testing.conformance.harness import CollectingSink

    return create_backend(BackendContext(
        settings=EdgeSqliteSettings(path=str(path)), limits=SchedulerLimits(128, 16, 30_000, 1000),
        providers={}, diagnostics=CollectingSink(), clock_ms=lambda: int(time.time() * 1000),
        owner="bench", sealer=s))


async def publish_rate(path: Path, tasks: int, key: bytes | None) -> tuple[float, float | None]:
    """Publishes per second, then (sealed only) the seconds of a rotation to a new key."""
    s = None if key is None else sealer(key)
    b = backend(path, s)
    await b.open()
    await b.migrate()
    try:
        pub = b.publisher()
        await pub.create_project("p")
        env = {f"VAR_{i}": f"value-{i}-" + "x" * 40 for i in range(8)}
        start = time.perf_counter()
        for i in range(tasks):
            await pub.put_task("p", f"t{i}", {"command": ["true"], "env": env})
        rate = tasks / (time.perf_counter() - start)
        rotation = None
        if s is not None:
            start = time.perf_counter()
            await b.reseal_secrets(sealer(os.urandom(32), key))
            rotation = time.perf_counter() - start
        return rate, rotation
    finally:
        await b.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--values", type=int, default=20_000)
    parser.add_argument("--tasks", type=int, default=500)
    args = parser.parse_args()
    values, tasks = (2_000, 100) if args.quick else (args.values, args.tasks)
    load_before = os.getloadavg()
    result: dict = {"values": values, "tasks": tasks, **seal_open_rates(values)}
    rates: dict[str, list[float]] = {"sealed": [], "clear": []}
    rotations: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:  # warm-up: imports, page cache, first file
        asyncio.run(publish_rate(Path(tmp) / "q.db", min(tasks, 50), os.urandom(32)))
    for _ in range(3):
        for variant in ("clear", "sealed"):
            with tempfile.TemporaryDirectory() as tmp:
                key = os.urandom(32) if variant == "sealed" else None
                rate, rotation = asyncio.run(publish_rate(Path(tmp) / "q.db", tasks, key))
                rates[variant].append(rate)
                if rotation is not None:
                    rotations.append(rotation)
    result["publish_per_s_sealed"] = round(statistics.median(rates["sealed"]), 1)
    result["publish_per_s_clear"] = round(statistics.median(rates["clear"]), 1)
    result["publish_sealed_over_clear"] = round(result["publish_per_s_sealed"] / result["publish_per_s_clear"], 3)
    result["rotation_s"] = round(statistics.median(rotations), 3)
    result["rotation_rows"] = tasks * 2  # each task's head and its revision
    result["loadavg_before"], result["loadavg_after"] = load_before, os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / ("secrets-quick.json" if args.quick else "secrets.json")).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
