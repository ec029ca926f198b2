"""``qinglong apply``, ``qinglong export`` and ``qinglong import``: jobs kept as code, and moving in.

``apply FILE`` plans every project of the file (a rolled-back transaction each, so a refusal is
found before anything is written), prints the plan, then applies each project in one
transaction; ``--dry-run`` stops after the plan. ``export`` prints the same format (env values
masked as ``stored:`` unless ``--with-secrets``). ``import crontab`` and ``import qinglong-v2``
turn another scheduler's jobs into that format and apply it the same way, printing what could
not be carried. The plan never shows a value.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from qinglong.contracts.errors import ExitCode, NotFound, StoreMissing, UserError, quoted

from .boot import container_of
from .output import print_json
from .parsing import add_command, parse_duration_ms, parse_size_bytes


def _limits(container: Any) -> Any:
    from .task import execution_limits

    return execution_limits(container.loaded())


def _sources(args: argparse.Namespace, base_dir: Path, *, inline: bool) -> Any:
    from ..config.document import EnvSources

    secrets = args.secrets_dir or os.environ.get("CREDENTIALS_DIRECTORY")
    return EnvSources(environ=dict(os.environ), base_dir=base_dir,
                      secrets_dir=Path(secrets) if secrets else None, allow_inline=inline)


async def _on_store(container: Any, action: Any, *, dry_run: bool) -> Any:
    """``action(backend)`` on the opened backend. A dry run never creates or migrates a store:
    it returns None when the store does not exist yet."""
    from .boot import opened_backend

    if not dry_run:
        async with opened_backend(container, create=True) as backend:
            return await action(backend)
    backend = container.backend()
    try:
        await backend.open(create=False)
    except StoreMissing:
        return None
    try:
        await backend.check_readiness()
        return await action(backend)
    finally:
        await backend.close()


def run_plan(container: Any, document: Any, options: Any) -> Any:
    """Plan (and unless ``options.dry_run`` apply) a checked document; the report."""
    from ..config.apply import apply_projects, plan_offline

    async def go(backend: Any) -> Any:
        return await apply_projects(backend, document.projects, options, refusal=document.refusal)

    report = asyncio.run(_on_store(container, go, dry_run=options.dry_run))
    if report is None:
        loaded = container.loaded()
        report = plan_offline(document.projects, options, container.trigger_providers(),
                              container.limits(), leased=loaded.profile.name == "cluster",
                              refusal=document.refusal)
    return report


def _print_report(report: Any, as_json: bool) -> None:
    from ..config.apply import format_plan

    if as_json:
        print_json(report.to_json())
    else:
        for line in format_plan(report):
            print(line)


def cmd_apply(args: argparse.Namespace) -> int:
    """Plan and apply an apply file."""
    from ..config.apply import ApplyOptions
    from ..config.document import load_document, read_source

    container = container_of(args)
    text, source, base_dir = read_source(args.file)
    document = load_document(text, source, _sources(args, base_dir, inline=args.allow_inline_env),
                             _limits(container), parse_duration=parse_duration_ms,
                             parse_size=parse_size_bytes)
    scope = frozenset(args.project) if args.project else None
    if scope is not None and not args.prune:
        missing = sorted(scope - set(document.projects))
        if missing:
            raise UserError(f"--project {quoted(missing[0])}: {source} does not declare it (with --prune, "
                            "a project the file does not declare is deleted)")
    options = ApplyOptions(prune=args.prune, dry_run=args.dry_run, projects=scope)
    _print_report(run_plan(container, document, options), args.json)
    return ExitCode.OK


def cmd_export(args: argparse.Namespace) -> int:
    """Print projects in the apply format."""
    from ..config.render import export_projects

    container = container_of(args)

    async def go(backend: Any) -> Any:
        listed = [p.project_id for p in await backend.reader().list_projects()]
        wanted = args.project or listed
        for project_id in wanted:
            if project_id not in listed:
                raise NotFound(f"--project {quoted(project_id)}: the store has no such project")
        publisher = backend.publisher()
        return [await publisher.project_state(pid) for pid in sorted(set(wanted))]

    from .boot import on_backend

    states = on_backend(container, go, read_only=True)
    if args.with_secrets and hasattr(container, "sealer"):
        from qinglong.contracts.secrets import opened_state

        # asked for in clear (a file of mode 0600): opened here, with the keys of this host
        sealer = container.sealer()
        states = [opened_state(sealer, state) for state in states]
    text = export_projects(states, with_secrets=args.with_secrets)
    if args.output:
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if args.with_secrets else 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text, end="")
    return ExitCode.OK


def cmd_import(args: argparse.Namespace) -> int:
    """Turn another scheduler's jobs into desired projects, show the plan, apply it."""
    from ..config.apply import ApplyOptions
    from ..config.document import load_document
    from ..config.render import render_document

    container = container_of(args)
    providers = container.trigger_providers()
    if args.source_kind == "crontab":
        from ..config.crontab import import_crontab

        result = import_crontab(args.file, project_id=args.project or "crontab", providers=providers,
                                timezone=args.timezone, system=args.system)
    elif args.source_kind == "systemd-timer":
        from ..config.systemd_timer import import_systemd_timer

        result = import_systemd_timer(args.file, project_id=args.project or "systemd",
                                      providers=providers, timezone=args.timezone)
    else:
        from ..config.qinglong_v2 import import_qinglong_v2

        result = import_qinglong_v2(args.file, project_id=args.project or "qinglong-v2",
                                    providers=providers, scripts_dir=args.scripts_dir,
                                    timezone=args.timezone)
    if args.emit:
        print(render_document([result.rendered(with_secrets=args.with_secrets)], header=result.header()),
              end="")
        for note in result.notes:
            print(f"note: {note}", file=__import__("sys").stderr)
        return ExitCode.OK
    document = load_document("", result.source, _sources(args, Path.cwd(), inline=True), _limits(container),
                             parse_duration=parse_duration_ms, parse_size=parse_size_bytes,
                             data=result.data)
    document.lines = result.lines
    if not args.json:
        for note in result.notes:
            print(f"note: {note}")
    plan = run_plan(container, document, ApplyOptions(dry_run=True))
    if args.dry_run:
        _print_report(plan, args.json)
        return ExitCode.OK
    if not args.json:
        _print_report(plan, False)
    report = run_plan(container, document, ApplyOptions())
    if args.json:
        payload = report.to_json()
        payload["notes"] = list(result.notes)
        print_json(payload)
    else:
        from ..config.apply import format_plan

        print(list(format_plan(report))[-1])
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``apply``, ``export`` and ``import``."""
    p = add_command(sub, common, "apply", "apply a file of projects, tasks and triggers (one "
                    "transaction per project)", cmd_apply)
    p.add_argument("file", metavar="FILE", help="the apply file (TOML; '-' for standard input)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and write nothing")
    p.add_argument("--prune", action="store_true",
                   help="delete tasks, triggers and projects the file does not declare (within --project)")
    p.add_argument("--project", action="append", default=[], metavar="P",
                   help="only this project (repeatable)")
    p.add_argument("--allow-inline-env", action="store_true",
                   help="accept env values written in the file ({ value = \"...\" })")
    p.add_argument("--secrets-dir", metavar="DIR", default=None,
                   help="where secret:NAME is read (default $CREDENTIALS_DIRECTORY)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")

    p = add_command(sub, common, "export", "print projects as an apply file (env values masked)", cmd_export)
    p.add_argument("--project", action="append", default=[], metavar="P", help="only this project (repeatable)")
    p.add_argument("--with-secrets", action="store_true", help="write env values instead of 'stored:'")
    p.add_argument("--output", "-o", metavar="FILE", default=None,
                   help="write to FILE (mode 0600 with --with-secrets) instead of standard output")

    p = add_command(sub, common, "import", "move jobs in from a crontab, a systemd timer or a "
                    "whyour/qinglong 2.x panel", None)
    kinds = p.add_subparsers(dest="source_kind", metavar="SOURCE", required=True)
    for name, text, default in (
            ("crontab", "a crontab file ('-': standard input); /etc/crontab and /etc/cron.d files "
                        "have a user field (--system)", "crontab"),
            ("systemd-timer", "a systemd timer unit (NAME.timer) with OnCalendar= lines: its unit "
                              "started through systemd on the same calendar", "systemd"),
            ("qinglong-v2", "a whyour/qinglong 2.x database (its database.sqlite, opened read-only)",
             "qinglong-v2")):
        q = kinds.add_parser(name, parents=[common], help=text, description=text)
        q.add_argument("file", metavar={"crontab": "FILE", "systemd-timer": "UNIT.timer"}.get(name, "DB"))
        q.add_argument("--project", default=None, metavar="P", help=f"the project to import into (default {default})")
        q.add_argument("--dry-run", action="store_true", help="print the plan and write nothing")
        q.add_argument("--emit", action="store_true",
                       help="print the apply file instead of applying (keep it in git, then `qinglong apply`)")
        q.add_argument("--with-secrets", action="store_true",
                       help="with --emit: write env values instead of env:NAME references")
        q.add_argument("--json", action="store_true", help="print the plan as JSON")
        q.add_argument("--secrets-dir", default=None, help=argparse.SUPPRESS)
        if name == "crontab":
            q.add_argument("--system", action="store_true", default=None,
                           help="the file has a user field (default: yes for /etc/crontab and /etc/cron.d/*)")
            q.add_argument("--timezone", default=None, metavar="ZONE",
                           help="the crontab's time zone (default: this machine's)")
        elif name == "systemd-timer":
            q.add_argument("--timezone", default=None, metavar="ZONE",
                           help="the zone of calendar times that name none (default: this machine's)")
        else:
            q.add_argument("--timezone", default=None, metavar="ZONE",
                           help="the panel's time zone (default: its settings', else Asia/Shanghai)")
            q.add_argument("--scripts-dir", default="/ql/data/scripts", metavar="DIR",
                           help="where the panel's scripts are on this machine (default /ql/data/scripts)")
        q.set_defaults(func=cmd_import)
