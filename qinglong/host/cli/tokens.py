"""``qinglong token create|list|revoke`` and ``qinglong audit``: the management API's credentials,
made on the host (there is no endpoint that makes a first credential), and the audit log."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qinglong.contracts.tokens import SCOPES

from .boot import container_of, on_backend
from .output import iso, now_ms, print_json, print_table
from .parsing import add_command, add_json_flag, parse_duration_ms


def cmd_token(args: argparse.Namespace) -> int:
    from ..tokens import create_token, revoke_token, token_store_of

    container = container_of(args)
    if args.token_command == "create":
        expires = parse_duration_ms("--expires", args.expires) if args.expires else None

        async def create(backend: Any) -> Any:
            return await create_token(token_store_of(backend), args.name, args.scope, args.project or (), expires)

        record, secret = on_backend(container, create)
        if args.json:
            print_json(dict(record.as_json(now_ms()), secret=secret))
        else:
            print(secret)
            sys.stderr.write(f"token {record.name!r} ({record.scope}"
                             f"{', projects ' + ', '.join(record.projects) if record.projects else ''}"
                             f"{', expires ' + iso(record.expires_at_ms) if record.expires_at_ms else ''}) created: "
                             "the secret above is shown once and stored only as a hash\n")
        return 0
    if args.token_command == "revoke":
        async def revoke(backend: Any) -> Any:
            return await revoke_token(token_store_of(backend), args.name)

        record = on_backend(container, revoke)
        print(f"token {record.name!r} revoked")
        return 0

    async def listing(backend: Any) -> Any:
        return await token_store_of(backend).list_tokens()

    records = on_backend(container, listing, create=False)
    at = now_ms()
    if args.json:
        print_json([r.as_json(at) for r in records])
    else:
        print_table(("name", "scope", "projects", "state", "created", "expires", "id"), [
            (r.name, r.scope, ",".join(r.projects) or "*", r.state(at), iso(r.created_at_ms),
             iso(r.expires_at_ms), r.token_id) for r in records])
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from ..tokens import token_store_of

    since = now_ms() - parse_duration_ms("--since", args.since) if args.since else None

    async def read(backend: Any) -> Any:
        return await token_store_of(backend).list_audit(since, args.limit)

    entries = on_backend(container_of(args), read, create=False)
    if args.json:
        print_json([e.as_json() for e in entries])
    else:
        print_table(("time", "actor", "source", "action", "object", "result"), [
            (iso(e.at_ms), e.actor, e.source, e.action, e.object, e.result) for e in entries])
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``token`` and ``audit``."""
    tok = add_command(sub, common, "token", "the management API's tokens (create prints the secret once)",
                      cmd_token)
    tok_sub = tok.add_subparsers(dest="token_command", metavar="SUBCOMMAND", required=True)
    p = tok_sub.add_parser("create", parents=[common], help="make a token; its secret is printed once")
    p.add_argument("name", help="the token's name (who or what holds it)")
    p.add_argument("--scope", required=True, choices=SCOPES,
                   help="read < run (start and cancel Runs) < write (publish) < admin (tokens, audit)")
    p.add_argument("--project", action="append", metavar="P",
                   help="limit the token to this project (repeatable); default: every project")
    p.add_argument("--expires", metavar="DURATION", help="the token expires after this (30d, 12h)")
    add_json_flag(p)
    p = tok_sub.add_parser("list", parents=[common], help="every token (never a secret)")
    add_json_flag(p)
    p = tok_sub.add_parser("revoke", parents=[common], help="revoke a token: its next request fails")
    p.add_argument("name")
    p = add_command(sub, common, "audit", "the audit log: every change made through the API, every token made or revoked",
                    cmd_audit)
    p.add_argument("--since", metavar="DURATION", help="only entries of the last DURATION (1h, 7d)")
    p.add_argument("--limit", type=int, default=100, help="at most N entries, newest first (default 100)")
    add_json_flag(p)
