"""Reading: ``qinglong schedules`` and ``skips``, and the admission listing of Runs that ``runs`` shows
on a store that does not execute Runs; they never create or migrate a store."""

from __future__ import annotations

import argparse
from typing import Any

from qinglong.contracts.errors import ExitCode

from .boot import container_of, limited, on_backend
from .output import iso, now_ms, print_json, print_table, yes_no
from .parsing import add_command, add_json_flag, positive_count


def show_runs(container: Any, *, limit: int, trigger: str | None, as_json: bool) -> int:
    """Print the most recent Runs (of one trigger, if given), newest first, with their lag: what
    ``runs`` shows on a store whose Runs are executed elsewhere (the cluster's workers)."""
    runs = on_backend(container, lambda backend: backend.reader().recent_runs(limit, trigger), create=False)
    if as_json:
        print_json([{"run_id": r.run_id, "project_id": r.project_id, "trigger_id": r.trigger_id,
                      "trigger_revision": r.trigger_revision, "scheduled_for_ms": r.scheduled_for_ms,
                      "admitted_at_ms": r.admitted_at_ms, "lag_ms": r.lag_ms, "state": r.state,
                      "idempotency_key": r.idempotency_key} for r in runs])
    else:
        print_table(["run", "trigger", "rev", "scheduled_for", "admitted_at", "lag_ms", "state"],
                     [[r.run_id[:12], r.trigger_id, r.trigger_revision, iso(r.scheduled_for_ms),
                       iso(r.admitted_at_ms), r.lag_ms, r.state] for r in runs])
    return ExitCode.OK


async def _scheduler_status(reader: Any) -> Any:
    """The reader's :class:`SchedulerStatus`, or None when this store cannot tell."""
    from qinglong.contracts.records import SchedulerStatus

    method = getattr(reader, "scheduler_status", None)
    if method is None:
        return None
    status = await method()
    return status if isinstance(status, SchedulerStatus) else None


def _first_fire_preview(schedule: Any, providers: Any) -> int | None:
    """For a schedule no round has initialised yet: its first occurrence strictly after the publish.

    That is where initialisation will put the cursor (the revision's publish time is its base), so
    the preview is what the scheduler will fire first, or decide as a misfire if it is already past.
    """
    if schedule.next_fire_at_ms is not None or not schedule.enabled:
        return None
    published = getattr(schedule, "published_at_ms", None)
    provider = providers.get(schedule.kind)
    if published is None or provider is None:
        return None
    return provider.next_after(schedule.spec, published)


def cmd_schedules(args: argparse.Namespace) -> int:
    """Every trigger's next fire time, and its lag while a scheduler runs."""
    container = container_of(args)

    async def go(backend: Any) -> tuple[Any, Any]:
        reader = backend.reader()
        schedules = await limited(reader.list_schedules, args.limit)
        return schedules, await _scheduler_status(reader)

    schedules, status = on_backend(container, go, create=False)
    now = now_ms()
    providers = container.trigger_providers()
    # Lag grows only while a scheduler works the store; a stopped one's lag is frozen at its last
    # round (or not known at all). A store that cannot tell keeps the old reading, up to now.
    if status is None or status.running:
        as_of: int | None = now
    else:
        as_of = status.last_round_at_ms
    rows = []
    for s in schedules:
        rows.append((s, _first_fire_preview(s, providers), s.lag_ms(as_of) if as_of is not None else None))
    if args.json:
        print_json([{"project_id": s.project_id, "trigger_id": s.trigger_id,
                      "trigger_revision": s.trigger_revision, "kind": s.kind, "spec": dict(s.spec),
                      "enabled": s.enabled, "misfire_policy": s.misfire_policy.value,
                      "next_fire_at_ms": s.next_fire_at_ms, "pending_first_fire_at_ms": preview,
                      "published_at_ms": getattr(s, "published_at_ms", None),
                      "last_scheduled_at_ms": s.last_scheduled_at_ms, "lag_ms": lag, "lag_as_of_ms": as_of,
                      "scheduler_running": None if status is None else status.running}
                     for s, preview, lag in rows])
        return ExitCode.OK
    print(_status_line(status))
    print_table(["project", "trigger", "rev", "enabled", "next_fire_at", "last_scheduled", "lag_ms", "schedule"],
                 [[s.project_id, s.trigger_id, s.trigger_revision, yes_no(s.enabled),
                   f"{iso(preview)} (pending)" if preview is not None else iso(s.next_fire_at_ms),
                   iso(s.last_scheduled_at_ms), lag if lag is not None else "stopped",
                   providers[s.kind].describe(s.spec) if s.kind in providers else s.kind]
                  for s, preview, lag in rows])
    return ExitCode.OK


def _status_line(status: Any) -> str:
    if status is None:
        return "scheduler: status unknown (this store does not report it); lag as of now"
    if status.running:
        replicas = f", {status.replicas} replica{'s' if status.replicas != 1 else ''}" if status.replicas else ""
        return f"scheduler: running{replicas}; lag as of now"
    if status.last_round_at_ms is not None:
        return f"scheduler: stopped; lag as of its last round at {iso(status.last_round_at_ms)}"
    return "scheduler: stopped; no round recorded, so no lag is shown"


def cmd_skips(args: argparse.Namespace) -> int:
    """Recorded misfires: what was not admitted, and under which policy."""
    container = container_of(args)

    skips = on_backend(container, lambda backend: backend.reader().recent_skips(args.limit), create=False)
    if args.json:
        print_json([{"project_id": s.project_id, "trigger_id": s.trigger_id, "trigger_revision": s.trigger_revision,
                      "policy": s.policy.value, "first_skipped_ms": s.first_skipped_ms,
                      "last_skipped_ms": s.last_skipped_ms, "count": s.count, "count_exact": s.count_exact,
                      "recorded_at_ms": s.recorded_at_ms} for s in skips])
    else:
        print_table(["trigger", "rev", "policy", "first_skipped", "last_skipped", "count", "recorded_at"],
                     [[s.trigger_id, s.trigger_revision, s.policy.value, iso(s.first_skipped_ms),
                       iso(s.last_skipped_ms), f"{s.count}{'' if s.count_exact else '+'}", iso(s.recorded_at_ms)]
                      for s in skips])
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``schedules`` and ``skips`` (``runs`` is :mod:`.runs`'s)."""
    p = add_command(sub, common, "schedules", "every trigger's next fire time, and its lag while a scheduler runs",
                    cmd_schedules)
    p.add_argument("--limit", type=positive_count, default=None, help="at most N schedules")
    add_json_flag(p)
    p = add_command(sub, common, "skips", "recorded misfires (skipped occurrences)", cmd_skips)
    p.add_argument("--limit", type=positive_count, default=20, help="records to show (default 20)")
    add_json_flag(p)
