"""A scheduler process for the crash tests: builds the edge backend through the plugin's factory
with the real clock and runs rounds until it is killed.

Usage: ``python crash_driver.py DB_PATH``. ``QL_CRASH_TX_SLEEP_MS`` (default 0) sleeps that long
inside every admission transaction (just before the Attempt insert), so a SIGKILL at a random
moment often lands between the Run and the commit.

On stdout the driver reports its progress, one line each, flushed, so a test times its kills from
what the child has done and never from when it was spawned: ``ready`` once recovery is over, then
``round admitted=N skipped=N`` after every round that committed something (the counts are of
that round, already committed when the line is written).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from qinglong.contracts.store import BackendContext, SchedulerLimits
from qinglong.plugins.cron.provider import CronProvider
from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend


class _StderrSink:
    def emit(self, event) -> None:
        print(f"diagnostic {event.code}: {event.message}", file=sys.stderr, flush=True)


def _clock_ms() -> int:
    return time.time_ns() // 1_000_000


async def main(path: str) -> None:
    sleep_s = float(os.environ.get("QL_CRASH_TX_SLEEP_MS", "0")) / 1000
    backend = create_backend(BackendContext(
        settings=EdgeSqliteSettings(path=path),
        limits=SchedulerLimits(page_size=int(os.environ.get("QL_CRASH_PAGE", "64")), claim_budget=16,
                               lease_ms=30_000, cadence_ms=1000),
        providers={"cron": CronProvider()},
        diagnostics=_StderrSink(),
        clock_ms=_clock_ms,
        owner="crash-driver",
    ))
    await backend.open()
    if sleep_s:
        def slow_inside_transactions(statement: str) -> None:
            if statement.startswith("INSERT INTO attempts"):
                time.sleep(sleep_s)

        await backend.store.call(lambda conn: conn.set_trace_callback(slow_inside_transactions))
    await backend.migrate()
    await backend.check_readiness()
    await backend.recover()
    print("ready", flush=True)
    while True:
        report = await backend.run_round()
        if report.admitted or report.skipped:
            print(f"round admitted={report.admitted} skipped={report.skipped}", flush=True)
        if not report.more_due:
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
