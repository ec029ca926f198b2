"""A replica in its own process, for the multi-process cluster tests.

Builds the backend through the plugin's factory with its own pool (one connection, so one backend
PID), then either runs rounds at a cadence (``rounds``) or claims once and hangs
(``claim-and-hang``, to be killed with SIGKILL while holding the claim). Prints one JSON object
per line: ``ready`` (with the backend PID), each ``round`` report, ``claimed``, ``done``.

With ``--start-on-stdin`` it waits after ``ready`` for a line on stdin, so a test starts several
replicas together once every one of them is connected, however slow their start. ``rounds``
ends when its stop condition holds, never after a wall time a slow machine might not meet:
after ``--until-admitted N`` admissions (then ``--then-rounds`` more rounds, room for a
duplicate to show), or after ``--idle-rounds`` consecutive rounds that claimed nothing;
``--duration-s`` is only the overall bound on a hang.

DSNs come from the environment (``QL_RUNTIME_DSN``), never from argv, so they do not show in ps.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time

from qinglong.contracts.store import BackendContext, SchedulerLimits
from qinglong.plugins.cluster_postgres import qinglong_scheduler_backends
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
from qinglong.plugins.cron.provider import CronProvider


class StdoutSink:
    def emit(self, event) -> None:
        say("diagnostic", code=event.code, message=event.message)


def say(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--owner", required=True)
    parser.add_argument("--mode", choices=["rounds", "claim-and-hang"], default="rounds")
    parser.add_argument("--lease-ms", type=int, default=30_000)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--cadence-ms", type=int, default=20)
    parser.add_argument("--duration-s", type=float, default=120.0, help="overall bound on a hang")
    parser.add_argument("--start-on-stdin", action="store_true", help="start rounds on a stdin line")
    parser.add_argument("--until-admitted", type=int, default=None)
    parser.add_argument("--then-rounds", type=int, default=5)
    parser.add_argument("--idle-rounds", type=int, default=5)
    args = parser.parse_args()

    settings = ClusterPostgresSettings(runtime_dsn=os.environ["QL_RUNTIME_DSN"], pool_min_size=1,
                                       pool_max_size=1)
    context = BackendContext(
        settings=settings,
        limits=SchedulerLimits(page_size=32, claim_budget=args.budget, lease_ms=args.lease_ms,
                               cadence_ms=args.cadence_ms),
        providers={"cron": CronProvider()},
        diagnostics=StdoutSink(),
        clock_ms=lambda: int(time.time() * 1000),
        owner=args.owner,
    )
    backend = qinglong_scheduler_backends()[0].create(context)
    await backend.open()
    pool = await backend.runtime_pool()
    async with pool.connection() as conn:
        pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
    say("ready", owner=args.owner, pid=pid)
    if args.start_on_stdin:
        await asyncio.to_thread(sys.stdin.readline)
    if args.mode == "claim-and-hang":
        from qinglong.plugins.cluster_postgres.claim import claim_due_schedules

        async with pool.connection() as conn:
            claims = await claim_due_schedules(conn, owner=args.owner, limit=args.budget,
                                               lease_ms=args.lease_ms)
        say("claimed", trigger_ids=[c.head.trigger_id for c in claims],
            expires_at_ms=[c.fence.expires_at_ms for c in claims])
        await asyncio.sleep(3600)  # holds the claims until killed
        return
    deadline = time.monotonic() + args.duration_s
    admitted = idle = 0
    after_target = None
    while time.monotonic() < deadline:
        started = time.monotonic()
        report = await backend.run_round()
        say("round", **dataclasses.asdict(report))
        admitted += report.admitted
        idle = idle + 1 if report.claimed == 0 and report.errors == 0 else 0
        if args.until_admitted is not None:
            if after_target is None and admitted >= args.until_admitted:
                after_target = 0
            elif after_target is not None:
                after_target += 1
            if after_target is not None and after_target >= args.then_rounds:
                break
        elif idle >= args.idle_rounds:
            break
        await asyncio.sleep(max(0.0, args.cadence_ms / 1000 - (time.monotonic() - started)))
    else:
        say("timed_out", duration_s=args.duration_s)
    await backend.close()
    say("done")


if __name__ == "__main__":
    asyncio.run(main())
