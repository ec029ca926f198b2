"""``qinglong status [--json] [--once]``: one screen saying whether occurrences are admitted on time.

It opens the store read-only (never creating or migrating it), says whether its schema is ready
(or why not), and takes the store's figures (:class:`~qinglong.contracts.observe.StoreStats`, one
bounded read) twice, ``--interval`` apart, to see whether a backlog grows or drains (once with
``--once``). The exit code is the verdict of :func:`~qinglong.contracts.observe.status_verdict`:
0 clear, 10 converging (a backlog that drains), 20 attention (a growing or frozen backlog, lag over
the grace, lost Attempts, no scheduler working the store, Runs no worker takes), 30 failing (a
task whose last Run failed, timed out or was lost). A
problem that keeps the figures from being read keeps its usual code: 3 settings or a missing
database, 4 a schema not ready, 5 a store that cannot be reached or answer within the bound.

The grace is what an occurrence may wait before it counts as late
(:func:`~qinglong.contracts.observe.status_grace_ms`; the status page and ``/metrics`` use the same).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from qinglong.contracts.errors import ExitCode, SchemaNotReady, quoted
from qinglong.contracts.observe import FAILURE_STREAK_PERIODS, workers_summary

from .boot import container_of, opened_backend
from .output import iso, print_json
from .parsing import add_command, add_json_flag

#: The default time between the two readings, in seconds: two rounds at the default cadence.
DEFAULT_INTERVAL_S = 2.0


def interval_seconds(text: str) -> float:
    """An argparse type: seconds between the readings, above 0 and at most an hour."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {quoted(text)}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected more than 0 and at most 3600 seconds, got {text}")
    return value


def grace_ms(profile: str, limits: Any) -> int:
    """How long an occurrence may wait before it counts as late
    (:func:`~qinglong.contracts.observe.status_grace_ms`, the page's and the metrics' too)."""
    from qinglong.contracts.observe import status_grace_ms

    return status_grace_ms(limits.cadence_ms, limits.lease_ms, leased=profile == "cluster")


from ..views import stats_json  # noqa: E402,F401 (shared with the API)


async def take_readings(backend: Any, *, once: bool, interval_s: float) -> tuple[str | None, Any, Any]:
    """``(why not ready or None, first reading or None, last reading or None)``."""
    try:
        await backend.check_readiness()
    except SchemaNotReady as exc:
        return " ".join(str(exc).split()), None, None
    reader = backend.reader()
    first = await reader.store_stats()
    if once:
        return None, None, first
    # Said on stderr, so a person knows why the screen waits (and a test can act between the two).
    sys.stderr.write(f"qinglong: status: first reading taken; the second in {interval_s:g} s shows "
                     "the backlog's trend\n")
    sys.stderr.flush()
    await asyncio.sleep(interval_s)
    return None, first, await reader.store_stats()


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def print_screen(profile: str, store: str, not_ready: str | None, before: Any, now: Any,
                 finding: Any, grace: int, interval_s: float | None) -> None:
    """The person's screen: one line per figure, the verdict last."""
    lines = [("profile", f"{profile} ({store})" if store else profile),
             ("readiness", "ready" if not_ready is None else f"not ready: {not_ready}")]
    if now is not None:
        if now.live_schedulers:
            scheduler = f"running ({_count(now.live_schedulers, 'live scheduler')})"
        else:
            scheduler = "none running on this store"
        if now.last_round_at_ms is not None:
            scheduler += f"; last round {iso(now.last_round_at_ms)}"
        lines.append(("scheduler", scheduler))
        if now.schedules_due:
            backlog = (f"{now.schedules_due} due, the oldest waiting {now.oldest_due_seconds:.1f} s "
                       f"(since {iso(now.oldest_due_ms)})")
        else:
            backlog = "nothing due"
        lines.append(("backlog", backlog))
        if before is not None:
            lines.append(("trend", f"{before.schedules_due} -> {now.schedules_due} due over "
                                   f"{(now.now_ms - before.now_ms) / 1000:.1f} s"))
        else:
            lines.append(("trend", "one reading (--once): no trend"))
        if now.admitted_in_window:
            lag = (f"p50 {now.admission_lag_p50_ms} ms, p99 {now.admission_lag_p99_ms} ms over the "
                   f"last 5 min ({_count(now.admitted_in_window, 'admission')}; grace {grace} ms)")
        else:
            lag = "no admission in the last 5 min"
        lines.append(("admission lag", lag))
        states = [f"{state} {n}" for state, n in now.runs_by_state.items() if n]
        lines.append(("runs", ", ".join(states) if states else "none"))
        queued = sorted(now.queued_by_task.items(), key=lambda kv: (-kv[1], kv[0]))
        lines.append(("queued per task", ", ".join(f"{task} {n}" for task, n in queued) if queued else "none"))
        lines.append(("running", _count(now.running, "attempt") + " holding a process"))
        lines.append(("skips", f"{_count(now.skipped_recent, 'occurrence')} skipped in the last hour"))
        lines.append(("lost", f"{_count(now.lost_recent, 'attempt')} lost in the last hour"))
        tasks = f"{now.tasks_failing} failing (their last run failed, timed out or was lost)"
        if now.tasks_not_succeeding:
            tasks += f", {now.tasks_not_succeeding} without a success in {FAILURE_STREAK_PERIODS} runs"
        lines.append(("tasks", tasks if now.tasks_failing else "none failing"))
        if now.worker_free_slots is not None:
            lines.append(("workers", workers_summary(now)))
        lines.append(("schedules", f"{now.schedules_total} ({now.schedules_enabled} enabled)"))
    if finding is not None:
        lines.append(("verdict", f"{finding.verdict.name.lower()} ({int(finding.verdict)})"))
        for reason in finding.reasons:
            lines.append(("", f"- {reason}"))
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}".rstrip())


def cmd_status(args: argparse.Namespace) -> int:
    """Readiness, backlog, lag, Runs, skips; the exit code is the verdict."""
    from qinglong.contracts.observe import assess

    container = container_of(args)
    loaded = container.loaded()
    profile = loaded.profile.name
    grace = grace_ms(profile, container.limits())
    from qinglong.contracts.capabilities import LocalStoreSettings

    settings = container.backend_settings()
    store = (settings.path or "") if isinstance(settings, LocalStoreSettings) else ""

    async def go() -> tuple[str | None, Any, Any]:
        async with opened_backend(container, readiness=False, read_only=True) as backend:
            return await take_readings(backend, once=args.once, interval_s=args.interval)

    not_ready, before, now = asyncio.run(go())
    finding = None
    if now is not None:
        finding = assess(before, now, grace_ms=grace)
    code = int(finding.verdict) if finding is not None else int(ExitCode.CHECK_FAILED)
    if args.json:
        from ..views import status_json

        print_json(status_json(profile, not_ready, finding, code, grace,
                               None if args.once else int(args.interval * 1000), now, before))
    else:
        print_screen(profile, str(store), not_ready, before, now, finding, grace,
                     None if args.once else args.interval)
    if not_ready is not None:
        sys.stderr.write(f"qinglong: not ready: {not_ready}\n")
    return code


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``status``."""
    p = add_command(sub, common, "status",
                    "readiness, backlog, admission lag, Runs, skips, failing tasks; exit 0 clear, 10 converging, 20 attention, 30 failing",
                    cmd_status)
    p.add_argument("--once", action="store_true",
                   help="one reading, no trend (an aged backlog is then attention)")
    p.add_argument("--interval", type=interval_seconds, default=DEFAULT_INTERVAL_S, metavar="S",
                   help=f"seconds between the two readings (default {DEFAULT_INTERVAL_S:g})")
    add_json_flag(p)
