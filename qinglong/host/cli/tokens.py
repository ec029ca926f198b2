"""``qinglong token create|list|revoke``, ``qinglong audit`` and ``qinglong console link``: the
management API's credentials and the console's one-time sign-in links, made on the host (there is
no endpoint that makes a first credential), and the audit log."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qinglong.contracts.tokens import SCOPES

from .boot import container_of, on_backend
from .output import iso, now_ms, print_json, print_table
from .parsing import add_command, add_json_flag, parse_duration_ms, positive_count


def cmd_token(args: argparse.Namespace) -> int:
    from ..tokens import create_token, revoke_token, token_store_of

    container = container_of(args)
    if args.token_command == "create":
        expires = parse_duration_ms("--expires", args.expires) if args.expires else None

        async def create(backend: Any) -> Any:
            return await create_token(token_store_of(backend), args.name, args.scope, args.project or (), expires)

        # like publishing, the first credential may be made before the store's first `run`
        record, secret = on_backend(container, create, create=True)
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

    records = on_backend(container, listing, read_only=True)
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

    # never before the epoch: the API takes no negative time, and no entry is older
    since = max(0, now_ms() - parse_duration_ms("--since", args.since)) if args.since else None

    async def read(backend: Any) -> Any:
        return await token_store_of(backend).list_audit(since, args.limit)

    entries = on_backend(container_of(args), read, read_only=True)
    if args.json:
        print_json([e.as_json() for e in entries])
    else:
        print_table(("time", "actor", "source", "action", "object", "result"), [
            (iso(e.at_ms), e.actor, e.source, e.action, e.object, e.result) for e in entries])
    return 0


def console_base_url(loaded: Any) -> str:
    """Where the console of these settings answers: ``[http] listen`` (a wildcard address as this
    host's name), https with the API's TLS files. Refused when the port is picked at start."""
    import socket

    from qinglong.contracts.errors import UserError

    from ..settings import split_listen

    listen = loaded.settings.http.listen
    if not listen:
        raise UserError("the console needs [http] listen and [api] enabled = true; "
                        "or say where it answers: --url http://HOST:PORT")
    host, port = split_listen(listen)
    if port == 0:
        raise UserError(f"[http] listen = {listen!r} picks its port at start: say where the console answers "
                        "with --url http://HOST:PORT")
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if loaded.settings.api.tls_cert_file else "http"
    return f"{scheme}://{host}:{port}"


def cmd_console(args: argparse.Namespace) -> int:
    """``qinglong console link``: a one-time URL that signs a browser in as the host's admin."""
    from qinglong.contracts.errors import UserError, quoted

    from ..containers import build_container
    from ..remote import api_target
    from ..tokens import create_console_link, token_store_of
    from .boot import settings_of

    if api_target(args) is not None:
        raise UserError("console link is made on the host, from its settings and store, never through --api")
    loaded = settings_of(args)
    if args.url:
        from urllib.parse import urlsplit

        from ..settings import http_url_problem

        parts = urlsplit(args.url) if http_url_problem(args.url) is None else None
        if parts is None or parts.query or parts.fragment:
            raise UserError(f"--url: expected http://HOST:PORT or https://HOST:PORT, got {quoted(args.url)}")
        base = args.url.rstrip("/")
    else:
        base = console_base_url(loaded)
    ttl_ms = loaded.settings.api.console_link_ttl_ms

    async def create(backend: Any) -> Any:
        return await create_console_link(token_store_of(backend), ttl_ms)

    code, link_id, expires_at_ms = on_backend(build_container(loaded), create)
    url = f"{base}/console/link?code={code}"
    if args.json:
        print_json({"url": url, "link_id": link_id, "expires_at_ms": expires_at_ms, "scope": "admin"})
    else:
        print(url)
        sys.stderr.write(f"open it once, before {iso(expires_at_ms)}: it signs that browser in as this host's "
                         "admin (every project) and works only once\n")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``token``, ``audit`` and ``console``."""
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
    p.add_argument("--limit", type=positive_count, default=100, help="at most N entries, newest first (default 100)")
    add_json_flag(p)
    p = add_command(sub, common, "console", "the web console: a one-time sign-in link", cmd_console)
    con_sub = p.add_subparsers(dest="console_command", metavar="SUBCOMMAND", required=True)
    p = con_sub.add_parser("link", parents=[common],
                           help="print a URL that signs a browser in once, as this host's admin "
                                "(expires after [api] console_link_ttl_ms)")
    p.add_argument("--url", metavar="BASE", help="where the console answers (default: from [http] listen)")
    add_json_flag(p)
