"""Reading: ``qinglong schedules`` and ``skips``, and the admission listing of Runs that ``runs`` shows
on a store that does not execute Runs; they never create or migrate a store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qinglong.contracts.errors import ExitCode, quoted
from qinglong.contracts.hooks import masked_spec
from qinglong.contracts.jitter import JitteredSchedule
from qinglong.contracts.records import NO_MORE_OCCURRENCES_MS

from .boot import container_of, limited, on_backend, runs_of
from .output import format_duration_ms, iso, now_ms, print_json, print_table, yes_no
from .parsing import add_command, add_json_flag, positive_count


def show_runs(container: Any, *, limit: int, trigger: str | None, as_json: bool) -> int:
    """Print the most recent Runs (of one trigger, if given), newest first, with their lag: what
    ``runs`` shows on a store whose Runs are executed elsewhere (the cluster's workers)."""
    runs = on_backend(container, lambda backend: backend.reader().recent_runs(limit, trigger), read_only=True)
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
    """The reader's :class:`SchedulerStatus`, or None when this store cannot tell (its reader is
    not a :class:`~qinglong.contracts.capabilities.StatusReader`)."""
    from qinglong.contracts.capabilities import StatusReader
    from qinglong.contracts.records import SchedulerStatus

    if not isinstance(reader, StatusReader):
        return None
    status = await reader.scheduler_status()
    return status if isinstance(status, SchedulerStatus) else None


def _first_fire_preview(schedule: Any, providers: Any) -> int | None:
    """For a schedule no round has initialized yet: its first occurrence strictly after the publish.

    That is where initialization will put the cursor (the revision's publish time is its base), so
    the preview is what the scheduler will fire first, or decide as a misfire if it is already past.
    """
    if schedule.next_fire_at_ms is not None or not schedule.enabled:
        return None
    published = getattr(schedule, "published_at_ms", None)
    provider = providers.get(schedule.kind)
    if published is None or provider is None:
        return None
    if schedule.jitter_ms:
        # as initialization does: the first occurrence after the publish, at its jittered time
        return JitteredSchedule(provider, schedule.project_id, schedule.trigger_id,
                                schedule.jitter_ms).first_after_nominal(schedule.spec, published)
    return provider.next_after(schedule.spec, published)


def next_delay_ms(schedule: Any, at_ms: int | None, providers: Any) -> int | None:
    """The jitter the schedule's next start drew (``at_ms``, a jittered time); None without a
    jitter, a time or the kind's provider."""
    provider = providers.get(schedule.kind)
    if not schedule.jitter_ms or at_ms is None or provider is None or at_ms >= NO_MORE_OCCURRENCES_MS:
        return None
    nominal = JitteredSchedule(provider, schedule.project_id, schedule.trigger_id,
                               schedule.jitter_ms).nominal_of(schedule.spec, at_ms)
    return at_ms - nominal


def jitter_text(window_ms: int, delay_ms: int | None) -> str:
    """``-`` without a jitter; ``+1m23.456s of 5m``: the delay drawn, of the window."""
    if not window_ms:
        return "-"
    window = format_duration_ms(window_ms)
    if delay_ms is None:
        return f"up to {window}"
    minutes, rest = divmod(delay_ms, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"+{minutes}m{seconds} of {window}" if minutes else f"+{seconds} of {window}"


#: Schedules read per page by ``schedules``: each page is printed as it arrives, so memory is one
#: page whatever the store holds.
SCHEDULES_PAGE = 1_000


def encode_schedule_cursor(schedule: Any) -> str:
    """The ``--after`` token of a schedule: its keyset (next fire time or null, project, trigger)
    as compact JSON in URL-safe base64, so it passes through a shell unquoted."""
    import base64
    import json

    raw = json.dumps([schedule.next_fire_at_ms, schedule.project_id, schedule.trigger_id],
                     separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _is_identifier(value: Any) -> bool:
    """True for a project or trigger id as publishing accepts it (what a printed cursor holds)."""
    from qinglong.contracts.errors import UserError
    from qinglong.contracts.store import check_identifier

    try:
        check_identifier("id", value)
    except UserError:
        return False
    return True


def decode_schedule_cursor(token: str) -> tuple:
    """The keyset of an ``--after`` token (argparse type); a clear error for anything else."""
    import base64
    import binascii
    import json

    try:
        value = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        value = None
    if (isinstance(value, list) and len(value) == 3
            and (value[0] is None or (isinstance(value[0], int) and not isinstance(value[0], bool)
                                      and -(2**63) <= value[0] < 2**63))
            and _is_identifier(value[1]) and _is_identifier(value[2])):
        return tuple(value)
    raise argparse.ArgumentTypeError(
        f"{quoted(token)} is not a schedule cursor: pass the token a listing printed after "
        "'--after' when its --limit cut it")


async def _schedule_pages(reader: Any, limit: int | None, after: tuple | None) -> Any:
    """Yield pages of at most :data:`SCHEDULES_PAGE` schedules after ``after``, at most ``limit`` in
    all; then yield the last schedule's cursor token as a string if ``limit`` cut the listing
    (more schedules follow), else nothing more. A reader without ``after`` is read once."""
    import inspect

    if "after" not in inspect.signature(reader.list_schedules).parameters:
        if after is not None:
            from qinglong.contracts.errors import UserError

            raise UserError("this store's reader cannot page schedules; --after is not available")
        yield list(await limited(reader.list_schedules, limit))
        return
    left = limit
    while left is None or left > 0:
        size = SCHEDULES_PAGE if left is None else min(SCHEDULES_PAGE, left)
        page = await reader.list_schedules(size, after=after)
        if page:
            yield page
            after = page[-1]
        if left is not None:
            left -= len(page)
        if len(page) < size:
            return
    if page and await reader.list_schedules(1, after=after):
        yield encode_schedule_cursor(page[-1])


def _schedule_json(s: Any, preview: Any, lag: Any, as_of: Any, status: Any,
                   delay: int | None = None) -> dict:
    return {"project_id": s.project_id, "trigger_id": s.trigger_id,
            "trigger_revision": s.trigger_revision, "kind": s.kind, "spec": masked_spec(s.spec),
            "enabled": s.enabled, "misfire_policy": s.misfire_policy.value,
            "next_fire_at_ms": s.next_fire_at_ms, "pending_first_fire_at_ms": preview,
            "published_at_ms": getattr(s, "published_at_ms", None),
            "last_scheduled_at_ms": s.last_scheduled_at_ms, "lag_ms": lag, "lag_as_of_ms": as_of,
            "scheduler_running": None if status is None else status.running,
            "jitter_ms": s.jitter_ms, "next_jitter_ms": delay}


class _StreamedTable:
    """A table printed page by page: the header once, columns as wide as the widest cell so far."""

    def __init__(self, headers: list[str]) -> None:
        self.headers = headers
        self.widths = [len(h) for h in headers]
        self.started = False

    def page(self, rows: list[list[Any]]) -> None:
        cells = [[str(c) for c in row] for row in rows]
        for row in cells:
            self.widths = [max(w, len(c)) for w, c in zip(self.widths, row)]
        lines = []
        if not self.started:
            self.started = True
            lines.append("  ".join(h.ljust(w) for h, w in zip(self.headers, self.widths)).rstrip())
        lines.extend("  ".join(c.ljust(w) for c, w in zip(row, self.widths)).rstrip() for row in cells)
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()


def cmd_schedules(args: argparse.Namespace) -> int:
    """Every trigger's next fire time, and its lag while a scheduler runs, read and printed a page
    at a time (memory stays one page whatever the store holds).

    ``--json`` streams ONE JSON array: ``[`` first, each schedule's object as its page arrives,
    ``]`` last; should the store fail mid-listing, the array is left open and the exit code says
    so. When ``--limit`` cut the listing, the cursor of its last schedule is printed (a last line
    ``more: --after TOKEN``; on standard error with ``--json``) to continue from there."""
    import json

    container = container_of(args)
    providers = container.trigger_providers()

    async def go(backend: Any) -> None:
        reader = backend.reader()
        status = await _scheduler_status(reader)
        # Lag grows only while a scheduler works the store; a stopped one's lag is frozen at its
        # last round (or not known at all). A store that cannot tell keeps the old reading, up to now.
        as_of = now_ms() if status is None or status.running else status.last_round_at_ms
        table = None
        if args.json:
            sys.stdout.write("[")
        else:
            print(_status_line(status))
            table = _StreamedTable(["project", "trigger", "rev", "enabled", "next_fire_at",
                                    "jitter", "last_scheduled", "lag_ms", "schedule"])
        first = True
        more = None
        async for page in _schedule_pages(reader, args.limit, args.after):
            if isinstance(page, str):
                more = page
                break
            rows = []
            for s in page:
                preview = _first_fire_preview(s, providers)
                delay = next_delay_ms(s, preview if preview is not None else s.next_fire_at_ms,
                                      providers)
                rows.append((s, preview, s.lag_ms(as_of) if as_of is not None else None, delay))
            if table is None:
                chunk = []
                for s, preview, lag, delay in rows:
                    chunk.append(("\n  " if first else ",\n  ")
                                 + json.dumps(_schedule_json(s, preview, lag, as_of, status, delay),
                                              default=str))
                    first = False
                sys.stdout.write("".join(chunk))
                sys.stdout.flush()
            else:
                table.page([[s.project_id, s.trigger_id, s.trigger_revision, yes_no(s.enabled),
                             f"{iso(preview)} (pending)" if preview is not None else iso(s.next_fire_at_ms),
                             jitter_text(s.jitter_ms, delay),
                             iso(s.last_scheduled_at_ms), lag if lag is not None else "stopped",
                             providers[s.kind].describe(s.spec) if s.kind in providers else s.kind]
                            for s, preview, lag, delay in rows])
        if table is None:
            sys.stdout.write("\n]\n" if not first else "]\n")
            sys.stdout.flush()
            if more is not None:
                print(f"more: --after {more}", file=sys.stderr)
        else:
            table.page([])
            if more is not None:
                print(f"more: --after {more}")

    on_backend(container, go, read_only=True)
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

    async def go(backend: Any) -> tuple[Any, Any]:
        store = runs_of(backend)  # the execution store, or the cluster's run control
        skipped = getattr(store, "recent_run_skips", None)
        run_skips = await skipped(args.limit) if skipped is not None else []
        return await backend.reader().recent_skips(args.limit), run_skips

    skips, run_skips = on_backend(container, go, read_only=True)
    if args.json:
        from .. import views

        print_json([views.skip_json(s) for s in skips] + [views.run_skip_json(s) for s in run_skips])
    else:
        print_table(["trigger", "rev", "policy", "first_skipped", "last_skipped", "count", "recorded_at"],
                     [[s.trigger_id, s.trigger_revision, s.policy.value, iso(s.first_skipped_ms),
                       iso(s.last_skipped_ms), f"{s.count}{'' if s.count_exact else '+'}", iso(s.recorded_at_ms)]
                      for s in skips])
        if run_skips:
            print()
            print("runs skipped before they started (the task's concurrency, or its queue full):")
            print_table(["run", "task", "trigger", "scheduled_for", "reason", "recorded_at"],
                        [[s.run_id, f"{s.project_id}/{s.task_id}", s.trigger_id or "-", iso(s.scheduled_for_ms),
                          s.reason, iso(s.recorded_at_ms)] for s in run_skips])
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``schedules`` and ``skips`` (``runs`` is :mod:`.runs`'s)."""
    p = add_command(sub, common, "schedules", "every trigger's next fire time, and its lag while a scheduler runs",
                    cmd_schedules)
    p.add_argument("--limit", type=positive_count, default=None,
                   help="at most N schedules; when more follow, the last line says how to go on "
                        "(more: --after TOKEN; on standard error with --json)")
    p.add_argument("--after", type=decode_schedule_cursor, default=None, metavar="CURSOR",
                   help="start after the schedule of this cursor (the TOKEN a --limit listing printed)")
    add_json_flag(p)
    p.epilog = ("Schedules are read and printed 1,000 at a time, so a store of any size lists in "
                "bounded memory. --json streams one JSON array, written element by element.")
    p = add_command(sub, common, "skips", "recorded misfires (skipped occurrences)", cmd_skips)
    p.add_argument("--limit", type=positive_count, default=20, help="records to show (default 20)")
    add_json_flag(p)
