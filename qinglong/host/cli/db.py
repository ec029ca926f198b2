"""``qinglong db migrate``, ``qinglong db status`` and ``qinglong db wait``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Callable

from qinglong.contracts.errors import CheckFailed, ExitCode, SchemaNotReady, UserError

from ..waiting import wait_out

from .boot import container_of, on_backend, opened_backend
from .output import print_json, print_table
from .parsing import add_command, add_json_flag, parse_duration_ms

#: ``db wait``: how long it waits by default, and between two readiness checks.
DEFAULT_WAIT_TIMEOUT = "10m"
DEFAULT_WAIT_INTERVAL = "2s"


def cmd_db(args: argparse.Namespace) -> int:
    """``db migrate`` applies pending migrations; ``db status`` lists them."""
    container = container_of(args)

    async def go(backend: Any) -> list[Any]:
        if args.db_command == "migrate":
            return list(await backend.migrate())
        return list(await backend.migration_status())

    migrate = args.db_command == "migrate"
    states = on_backend(container, go, readiness=False, create=migrate, read_only=not migrate)
    if args.json:
        print_json([{"version": s.version, "name": s.name, "checksum": s.checksum, "status": s.status}
                     for s in states])
    else:
        print_table(["version", "name", "status", "checksum"],
                     [[s.version, s.name, s.status, s.checksum[:19]] for s in states])
    bad = [s for s in states if s.status in ("drifted", "unknown")]
    if bad:
        raise CheckFailed(f"{len(bad)} migration(s) drifted or unknown: "
                          + ", ".join(f"{s.version} {s.name} ({s.status})" for s in bad))
    return ExitCode.OK


async def wait_until_ready(container: Any, timeout_s: float, interval_s: float,
                           waiting: Callable[[BaseException], None]) -> None:
    """Check the store's schema readiness (the check ``qinglong run`` makes at start) until it
    passes, at most ``timeout_s`` seconds. A schema not ready yet (migrations pending, not
    installed) and a store that cannot be reached (:func:`~qinglong.contracts.errors.outage`, the
    rule ``qinglong run`` waits by at start) are waited out, each new reason passed to
    ``waiting`` once; at the bound the last one is raised (exit 4 or 5). Anything else (settings,
    a refused login, a missing SQLite file) is raised at once: waiting would not change it.
    Nothing is written."""
    last: list[str] = []

    async def check() -> None:
        async with opened_backend(container, readiness=False, read_only=True) as backend:
            await backend.check_readiness()

    def report(exc: BaseException, attempt: int, left_s: float) -> None:
        text = str(exc)
        if text not in last:
            last[:] = [text]
            waiting(exc)

    await wait_out(check, timeout_s=timeout_s, interval_s=interval_s, waiting=report,
                   also=(SchemaNotReady,))


def cmd_db_wait(args: argparse.Namespace) -> int:
    """Wait until the schema is ready for this version (an init container before the replicas)."""
    from qinglong.contracts.diagnostics import redact

    timeout_ms = parse_duration_ms("--timeout", args.timeout)
    interval_ms = parse_duration_ms("--interval", args.interval)
    if not 0 < interval_ms <= 60_000:
        raise UserError(f"--interval {args.interval}: expected from 1ms to 1m")
    container = container_of(args)

    def waiting(exc: BaseException) -> None:
        message = " ".join(str(exc).split())
        sys.stderr.write(f"qinglong: waiting: {redact(message)}\n")
        sys.stderr.flush()

    asyncio.run(wait_until_ready(container, timeout_ms / 1000, interval_ms / 1000, waiting))
    print("ready")
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``db migrate``, ``db status`` and ``db wait``."""
    db = add_command(sub, common, "db", "database schema: migrate, status", None)
    db_sub = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    for name, text in (("migrate", "apply pending migrations (cluster: with the owner DSN)"),
                       ("status", "list applied, pending and drifted migrations")):
        p = db_sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=cmd_db)
        add_json_flag(p)
    text = ("wait until the schema is ready for this version (migrations applied, grants exact), "
            "checking as `qinglong run` does at start; exit 0 then, 4 or 5 after --timeout")
    p = db_sub.add_parser("wait", parents=[common], help=text, description=text)
    p.add_argument("--timeout", default=DEFAULT_WAIT_TIMEOUT, metavar="DURATION",
                   help=f"give up after this long: 30s, 15m (default {DEFAULT_WAIT_TIMEOUT})")
    p.add_argument("--interval", default=DEFAULT_WAIT_INTERVAL, metavar="DURATION",
                   help=f"between two checks (default {DEFAULT_WAIT_INTERVAL})")
    p.set_defaults(func=cmd_db_wait)
