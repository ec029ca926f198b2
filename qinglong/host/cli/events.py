"""``qinglong notifications``: every delivery of the events out, newest first, with its tries."""

from __future__ import annotations

import argparse
from typing import Any

from qinglong.contracts.capabilities import EventingBackend
from qinglong.contracts.errors import ExitCode, UserError

from .boot import container_of, on_backend
from .output import iso, print_json, print_table
from .parsing import add_command, add_json_flag, positive_count


def delivery_json(d: Any) -> dict:
    """One delivery as ``--json`` and ``GET /api/v1/notifications`` show it."""
    return {"event_id": d.event.event_id, "kind": d.event.kind, "subject": d.event.subject,
            "reason": d.event.reason, "project_id": d.event.project_id or None,
            "task_id": d.event.task_id or None, "trigger_id": d.event.trigger_id or None,
            "run_id": d.event.run_id, "run_state": d.event.state, "at_ms": d.event.at_ms,
            "channel": d.channel, "state": d.state.value, "tries": d.tries,
            "next_try_at_ms": d.next_try_at_ms if d.state.value == "pending" else None,
            "delivered_at_ms": d.delivered_at_ms, "last_error": d.last_error}


def cmd_notifications(args: argparse.Namespace) -> int:
    """The deliveries of events to channels: pending, delivered or dead."""
    container = container_of(args)

    async def read(backend: Any) -> Any:
        outbox = backend.outbox() if isinstance(backend, EventingBackend) else None
        if outbox is None:
            raise UserError(f"the {backend.name} backend keeps no events out; nothing is delivered")
        return await outbox.list_deliveries(state=args.state, limit=args.limit)

    deliveries = on_backend(container, read, read_only=True)
    if args.json:
        print_json([delivery_json(d) for d in deliveries])
    else:
        print_table(["event", "kind", "subject", "channel", "state", "tries", "at", "last_error"],
                    [[d.event.event_id[:12], d.event.kind, d.event.subject, d.channel,
                      d.state.value, d.tries, iso(d.event.at_ms), d.last_error or ""]
                     for d in deliveries])
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``notifications``."""
    p = add_command(sub, common, "notifications",
                    "deliveries of events (Run outcomes, skips) to the configured channels",
                    cmd_notifications)
    p.add_argument("--state", choices=("pending", "delivered", "dead"), default=None,
                   help="only deliveries in this state")
    p.add_argument("--limit", type=positive_count, default=50, help="deliveries to show (default 50)")
    add_json_flag(p)
