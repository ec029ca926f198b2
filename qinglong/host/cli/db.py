"""``qinglong db migrate`` and ``qinglong db status``."""

from __future__ import annotations

import argparse
from typing import Any

from qinglong.contracts.errors import CheckFailed, ExitCode

from .boot import container_of, on_backend
from .output import print_json, print_table
from .parsing import add_command, add_json_flag


def cmd_db(args: argparse.Namespace) -> int:
    """``db migrate`` applies pending migrations; ``db status`` lists them."""
    container = container_of(args)

    async def go(backend: Any) -> list[Any]:
        if args.db_command == "migrate":
            return list(await backend.migrate())
        return list(await backend.migration_status())

    states = on_backend(container, go, readiness=False, create=args.db_command == "migrate")
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


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``db migrate`` and ``db status``."""
    db = add_command(sub, common, "db", "database schema: migrate, status", None)
    db_sub = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    for name, text in (("migrate", "apply pending migrations (cluster: with the owner DSN)"),
                       ("status", "list applied, pending and drifted migrations")):
        p = db_sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=cmd_db)
        add_json_flag(p)
