"""The ``qinglong`` command line.

Every error maps to one exit code through the table of :mod:`qinglong.contracts.errors`
(``EXIT_CODES``, ``ExitCode``): 0 success; 1 an internal error (a bug: the traceback is printed);
2 a usage error (argparse); 3 a user error (settings, plugins, input, a missing database); 4 a check
failed (closure, schema, migrations); 5 the store is unavailable (unreachable, read-only, full,
locked); 130 a second signal forced the exit; 141 standard output was closed by its reader
(``qinglong runs | head -1``: the rest of the output is dropped quietly). Every error the product
raises on purpose is one paragraph ``qinglong: ...`` on stderr, never a traceback.

Only the standard library's ``argparse`` is used, so the edge ``run`` path loads no UI library.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Mapping, Sequence

from qinglong import __version__
from qinglong.contracts.errors import (
    AlreadyExists,
    CheckFailed,
    ExitCode,
    NotFound,
    PluginLoadError,
    QinglongError,
    RecoveryRequired,
    SchemaNotReady,
    SettingsError,
    StoreUnavailable,
    UserError,
    exit_code_for,
)
from qinglong.contracts.records import DEFAULT_MISFIRE_GRACE_MS, MisfirePolicy, TriggerDefinition
from qinglong.contracts.providers import TriggerCliOptions
from qinglong.contracts.store import MAX_PAYLOAD_BYTES, MAX_SPEC_BYTES, check_command, check_json_value

#: Upper bound of ``--limit`` and ``--count``: a listing is for people, not a bulk export.
MAX_LISTING = 100_000


# --------------------------------------------------------------------------- boot helpers


def _load(args: argparse.Namespace, profile: str | None = None):
    from ..settings import load_settings

    return load_settings(getattr(args, "settings", None), profile=profile or getattr(args, "profile", None))


def _container(args: argparse.Namespace):
    from ..containers import build_container

    return build_container(_load(args))


def boot_for_closure(profile: str, settings_path: str | None) -> list[str]:
    """Boot ``profile`` as ``qinglong run`` would, without starting or connecting; list modules.

    Used by ``check closure`` in a fresh interpreter.
    """
    from ..containers import build_container
    from ..settings import load_settings

    container = build_container(load_settings(settings_path, profile=profile))
    container.lifecycle()  # resolves plugins, providers, diagnostics, backend (created, not opened)
    return list(sys.modules)


@asynccontextmanager
async def _opened_backend(container: Any, *, readiness: bool = True, create: bool = True) -> AsyncIterator[Any]:
    import inspect

    backend = container.backend()
    # Commands that only read open with create=False, so a mistyped path is reported, not created.
    # A backend written before that keyword existed is opened as it always was.
    if "create" in inspect.signature(backend.open).parameters:
        await backend.open(create=create)
    else:
        await backend.open()
    try:
        if readiness:
            if getattr(backend, "auto_migrate", False):
                await backend.migrate()
            await backend.check_readiness()
        yield backend
    finally:
        await backend.close()


def _on_backend(container: Any, action: Any, *, readiness: bool = True, create: bool = True) -> Any:
    """Open the profile's backend, ``await action(backend)``, close it; return the result.

    ``create=False`` for commands that only read: they never create or migrate a store.
    """

    async def body() -> Any:
        async with _opened_backend(container, readiness=readiness, create=create) as backend:
            return await action(backend)

    return asyncio.run(body())


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms >= 2**62:
        return "never"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


# --------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    """Start the profile's lifecycle and run until SIGTERM/SIGINT (or ``--for-seconds``)."""
    container = _container(args)
    lifecycle = container.lifecycle()
    return asyncio.run(_run_lifecycle(lifecycle, container.diagnostics(), args.for_seconds))


async def _run_lifecycle(lifecycle: Any, diagnostics: Any, for_seconds: float | None) -> int:
    from qinglong.contracts.diagnostics import DiagnosticEvent

    stop = asyncio.Event()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) == 1:
            diagnostics.emit(DiagnosticEvent("info", "lifecycle.stop_requested",
                                             f"{signal.Signals(signum).name} received; stopping in order "
                                             "(send it again to force the exit)"))
            stop.set()
        else:
            sys.stderr.write("qinglong: second signal, exiting at once\n")
            sys.stderr.flush()
            os._exit(ExitCode.INTERRUPTED)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await lifecycle.start()
        try:
            if for_seconds is not None:
                try:
                    await asyncio.wait_for(stop.wait(), for_seconds)
                except asyncio.TimeoutError:
                    pass
            else:
                await stop.wait()
        finally:
            await lifecycle.stop()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    stats = lifecycle.last_stats
    if stats is not None:
        diagnostics.emit(DiagnosticEvent("info", "lifecycle.stopped", "stopped",
                                         {"rounds": stats.rounds, "admitted": stats.admitted,
                                          "failed_rounds": stats.failed_rounds}))
    return ExitCode.OK


def cmd_demo(args: argparse.Namespace) -> int:
    """Publish a demo trigger firing every second, run for a few seconds, show the Runs."""
    container = _container(args)

    async def publish(backend: Any) -> None:
        pub = backend.publisher()
        try:
            await pub.create_project("demo", "Demo project")
        except AlreadyExists:
            pass
        await pub.put_task("demo", "hello", {"command": ["echo", "hello from qinglong"]})
        await pub.put_trigger(TriggerDefinition(
            project_id="demo", trigger_id="demo-every-second", task_id="hello", kind="cron",
            spec={"expression": "* * * * * *", "timezone": "UTC"},
        ))

    _on_backend(container, publish)
    print(f"published trigger demo-every-second (cron '* * * * * *'); running for {args.seconds:g} s ...",
          flush=True)
    code = asyncio.run(_run_lifecycle(container.lifecycle(), container.diagnostics(), args.seconds))
    if code != ExitCode.OK:
        return code
    return _show_runs(container, limit=args.limit, trigger="demo-every-second", as_json=False)


def cmd_plugins(args: argparse.Namespace) -> int:
    """List installed plugins, whatever the profile and whatever extras are installed.

    The profile's plugins and the enabled ones are loaded one by one, so one that cannot be loaded
    hides none of the others; the listing says which profile could not be loaded and why. A profile
    whose extra is missing is a fact about this installation (exit 0); a plugin the settings name
    that is unknown or broken is a mistake to fix (the listing is printed, then exit 3).
    """
    from ..containers import check_profile_extra
    from ..plugins import PluginHost

    host = PluginHost()
    problems: list[tuple[QinglongError, bool]] = []  # (error, whether it is the user's to fix)
    profile_name: str | None = None
    wanted: set[str] = set()
    try:
        loaded = _load(args)
    except SettingsError as exc:
        problems.append((exc, True))
    else:
        profile_name = loaded.profile.name
        wanted = set(loaded.profile.plugins) | set(loaded.settings.plugins.enable)
        try:
            check_profile_extra(loaded)
        except PluginLoadError as exc:
            problems.append((exc, False))
        for names, required_by in (
            (loaded.profile.plugins, f"the {loaded.profile.name} profile"),
            (loaded.settings.plugins.enable, loaded.origin(("plugins", "enable"))),
        ):
            for name in names:
                try:
                    host.load([name], required_by=required_by)
                except PluginLoadError as exc:
                    problems.append((exc, True))
    infos = host.infos()
    profile_error = " ".join(dict.fromkeys(str(exc) for exc, _ in problems)) or None
    if args.json:
        _print_json({"profile": profile_name, "profile_loadable": not problems, "profile_error": profile_error,
                     "plugins": [dict(i.as_json(), selected=i.name in wanted) for i in infos]})
    else:
        if profile_name is None:
            print("profile: none (the settings could not be read)")
        elif problems:
            print(f"profile: {profile_name} (cannot be loaded here: {profile_error})")
        else:
            print(f"profile: {profile_name}")
        _print_table(
            ["name", "distribution", "version", "loaded", "hooks"],
            [[i.name, i.distribution, i.version, _yes_no(i.loaded), ", ".join(i.hooks) or "-"] for i in infos],
        )
    users = [exc for exc, own in problems if own]
    if users:
        sys.stdout.flush()
        raise users[0]
    return ExitCode.OK


def cmd_profiles(args: argparse.Namespace) -> int:
    """List the shipped profiles."""
    from ..profiles import available_profiles, load_profile

    profiles = [load_profile(name) for name in available_profiles()]
    if args.json:
        _print_json([{"name": p.name, "description": p.description, "plugins": list(p.plugins),
                      "backend": p.backend, "extra": p.extra, "page_size_cap": p.page_size_cap,
                      "claim_budget_cap": p.claim_budget_cap,
                      "forbidden_modules": list(p.forbidden_modules),
                      "forbidden_distributions": list(p.forbidden_distributions)} for p in profiles])
        return ExitCode.OK
    _print_table(["name", "backend", "plugins", "install", "description"],
                 [[p.name, p.backend, ", ".join(p.plugins), f"pip install 'qinglong[{p.extra}]'", p.description]
                  for p in profiles])
    return ExitCode.OK


def cmd_config_show(args: argparse.Namespace) -> int:
    """Print the effective settings, secrets masked, with the backend section validated."""
    from ..settings import masked_dump

    loaded = _load(args)
    data = masked_dump(loaded.settings)
    data["backend"] = masked_dump(_container(args).backend_settings())
    result = {"profile": loaded.profile.name, "settings_file": str(loaded.file) if loaded.file else None,
              "settings": data}
    if args.json:
        _print_json(result)
    else:
        print(f"# profile: {loaded.profile.name}")
        print(f"# settings file: {loaded.file or '(none: profile defaults and environment only)'}")
        _print_toml(data)
    return ExitCode.OK


def _print_toml(data: dict[str, Any], prefix: str = "") -> None:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    if prefix and (scalars or not tables):
        print(f"\n[{prefix}]")
    for key, value in scalars.items():
        if value is None:
            print(f"# {key} is not set")
        else:
            print(f"{key} = {json.dumps(value)}")
    for key, value in tables.items():
        _print_toml(value, f"{prefix}.{key}" if prefix else key)


def cmd_check_closure(args: argparse.Namespace) -> int:
    """Boot a profile in a fresh interpreter and fail on any forbidden module (or distribution)."""
    from ..closure import check_closure
    from ..profiles import load_profile

    profile = load_profile(args.check_profile)
    report = check_closure(profile, getattr(args, "settings", None), installed=args.installed)
    if args.json:
        _print_json(report.as_json())
    elif report.ok:
        extra = ", no forbidden distribution installed" if report.checked_installed else ""
        print(f"closure of profile {profile.name}: OK ({report.modules} modules loaded, none of "
              f"{', '.join(profile.forbidden_modules)}{extra})")
    if report.boot_error:
        raise CheckFailed(f"profile {profile.name} could not boot: {report.boot_error}")
    if not report.ok:
        lines = [f"closure of profile {profile.name}: FAILED"]
        for v in report.violations:
            also = f" (and {len(v.submodules)} of its submodules)" if v.submodules else ""
            lines.append(f"  forbidden module {v.module}{also} imported via: {' -> '.join(v.chain)}")
        for d in report.installed_violations:
            lines.append(f"  forbidden distribution installed: {d}")
        if not args.json:
            print("\n".join(lines))
        raise CheckFailed(f"profile {profile.name} loads or installs what it must not")
    return ExitCode.OK


def cmd_db(args: argparse.Namespace) -> int:
    """``db migrate`` applies pending migrations; ``db status`` lists them."""
    container = _container(args)

    async def go(backend: Any) -> list[Any]:
        if args.db_command == "migrate":
            return list(await backend.migrate())
        return list(await backend.migration_status())

    states = _on_backend(container, go, readiness=False, create=args.db_command == "migrate")
    if args.json:
        _print_json([{"version": s.version, "name": s.name, "checksum": s.checksum, "status": s.status}
                     for s in states])
    else:
        _print_table(["version", "name", "status", "checksum"],
                     [[s.version, s.name, s.status, s.checksum[:19]] for s in states])
    bad = [s for s in states if s.status in ("drifted", "unknown")]
    if bad:
        raise CheckFailed(f"{len(bad)} migration(s) drifted or unknown: "
                          + ", ".join(f"{s.version} {s.name} ({s.status})" for s in bad))
    return ExitCode.OK


def cmd_project(args: argparse.Namespace) -> int:
    """Create or list projects."""
    container = _container(args)

    async def go(backend: Any) -> Any:
        if args.project_command == "create":
            return await backend.publisher().create_project(args.project_id, args.name)
        return await backend.reader().list_projects()

    result = _on_backend(container, go, create=args.project_command == "create")
    if args.project_command == "create":
        print(f"created project {result.project_id}")
    elif args.json:
        _print_json([{"project_id": p.project_id, "name": p.name, "active": p.active} for p in result])
    else:
        _print_table(["project", "name", "active"], [[p.project_id, p.name, _yes_no(p.active)] for p in result])
    return ExitCode.OK


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_object(option: str, text: str, max_bytes: int) -> dict[str, Any]:
    """Parse an option's value as a bounded JSON object, or raise a UserError naming the option.

    NaN and infinities are refused (they are not JSON), and so are nesting deeper than the
    contracts' limit, text that is not Unicode, and more than ``max_bytes``; the message never
    repeats the value (a payload may hold secrets).
    """
    if len(text) > 4 * max_bytes:  # do not even parse something this far over the limit
        raise UserError(f"{option}: {len(text)} characters of JSON, over the limit of {max_bytes} bytes")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise UserError(f"{option} is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:
        raise UserError(f"{option} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UserError(f"{option}: nested too deeply to be a payload or spec") from None
    if not isinstance(value, dict):
        raise UserError(f"{option} must be a JSON object")
    check_json_value(option, value, max_bytes)
    return value


def cmd_task(args: argparse.Namespace) -> int:
    """Create a task, or publish a new revision of it."""
    payload = _json_object("--payload", args.payload, MAX_PAYLOAD_BYTES) if args.payload is not None else {}
    if args.command is not None and args.argv:
        raise UserError("give the command either after '--' or with --command, not both")
    command = args.argv or args.command
    if command:
        if "command" in payload:
            raise UserError("--payload has a 'command' key and a command is given too; give it once")
        check_command("the command", command)
        payload["command"] = list(command)
    elif args.payload is None:
        raise UserError("a task needs a command ('-- PROGRAM [ARG ...]') or --payload JSON")
    check_json_value("the task payload", payload, MAX_PAYLOAD_BYTES)
    container = _container(args)

    task = _on_backend(container, lambda backend: backend.publisher().put_task(
        args.project_id, args.task_id, payload))
    print(f"task {task.project_id}/{task.task_id} at revision {task.task_revision} ({task.content_digest[:19]})")
    return ExitCode.OK


def _trigger_spec(args: argparse.Namespace, current: Any | None,
                  declared: Mapping[str, TriggerCliOptions]) -> tuple[str, Mapping[str, Any]]:
    """The kind and spec to publish, from ``--kind``/``--spec`` or the options a kind declared.

    The host knows no kind: each plugin declares its options (``qinglong_trigger_cli_options``) and
    turns them into a spec; ``--kind K --spec JSON`` works for every kind, declared or not.
    """
    given = {option.flag: (option, getattr(args, _option_dest(option.flag)))
             for options in declared.values() for option in options.options
             if getattr(args, _option_dest(option.flag), None) is not None}
    flags = sorted(given)
    if args.spec is not None:
        if flags:
            raise UserError(f"give either --spec or {', '.join(flags)}, not both")
        kind = args.kind or (current.kind if current is not None else None)
        if kind is None:
            raise UserError("--spec needs --kind KIND for a new trigger"
                            + (f" (kinds with their own options: {', '.join(sorted(declared))})" if declared else ""))
        return kind, _json_object("--spec", args.spec, MAX_SPEC_BYTES)
    if flags:
        fitting = sorted(kind for kind, options in declared.items() if set(flags) <= set(options.flags()))
        if args.kind is not None:
            if args.kind not in declared:
                raise UserError(f"trigger kind {args.kind!r} declares no command-line options; "
                                f"{', '.join(flags)} belong to {', '.join(_owners_of(flags, declared))}; "
                                "give --kind with --spec JSON")
            kind = args.kind
            if kind not in fitting:
                stray = [f for f in flags if f not in declared[kind].flags()]
                raise UserError(f"{', '.join(stray)} is not an option of trigger kind {kind!r}, which takes "
                                f"{', '.join(declared[kind].flags())}")
        elif current is not None and current.kind in fitting:
            kind = current.kind
        elif len(fitting) == 1:
            kind = fitting[0]
        elif not fitting:
            raise UserError(f"{', '.join(flags)} belong to different trigger kinds "
                            f"({', '.join(_owners_of(flags, declared))}); give the options of one kind")
        else:
            raise UserError(f"{', '.join(flags)} fit trigger kinds {', '.join(fitting)}; say which with --kind")
        base = dict(current.spec) if current is not None and current.kind == kind else None
        values = {option.name: value for option, value in given.values() if option.flag in declared[kind].flags()}
        try:
            spec = declared[kind].to_spec(values, base)
        except QinglongError:
            raise
        except Exception as exc:
            raise PluginLoadError(f"the command-line options of trigger kind {kind!r} could not make a spec "
                                  f"(a bug in its plugin): {exc.__class__.__name__}: {exc}") from exc
        if not isinstance(spec, Mapping):
            raise PluginLoadError(f"the command-line options of trigger kind {kind!r} gave {spec!r}, not a spec")
        check_json_value("the trigger spec", dict(spec), MAX_SPEC_BYTES)
        return kind, dict(spec)
    if current is None:
        forms = [f"{d.usage or ' '.join(d.flags())} ({kind})" for kind, d in sorted(declared.items())]
        raise UserError("a new trigger needs a schedule: " + "; ".join(forms + ["--kind KIND --spec JSON"]))
    if args.kind is not None and args.kind != current.kind:
        raise UserError(f"--kind {args.kind} changes the trigger's kind (now {current.kind}): "
                        "give its spec too, with --spec JSON or that kind's options")
    return current.kind, dict(current.spec)


def _option_dest(flag: str) -> str:
    """Where argparse keeps a kind's option: apart from the command's own attributes."""
    return "kind_option_" + flag.lstrip("-").replace("-", "_")


def _owners_of(flags: Sequence[str], declared: Mapping[str, TriggerCliOptions]) -> list[str]:
    return [f"{flag} ({', '.join(k for k, d in sorted(declared.items()) if flag in d.flags())})" for flag in flags]


def cmd_trigger(args: argparse.Namespace) -> int:
    """Add, update, enable, disable, delete or list triggers."""
    container = _container(args)
    sub = args.trigger_command

    async def go(backend: Any) -> Any:
        pub, reader = backend.publisher(), backend.reader()
        if sub == "list":
            return await _limited(reader.list_triggers, args.limit, args.project_id)
        if sub in ("enable", "disable"):
            return await pub.set_trigger_enabled(args.project_id, args.trigger_id, sub == "enable")
        if sub == "delete":
            await pub.delete_trigger(args.project_id, args.trigger_id)
            return None
        existing = {t.trigger_id: t for t in await reader.list_triggers(args.project_id)}
        current = existing.get(args.trigger_id)
        if sub == "add" and current is not None:
            raise AlreadyExists(f"trigger {args.trigger_id} exists in project {args.project_id}; "
                                "use 'qinglong trigger update'")
        if sub == "update" and current is None:
            raise NotFound(f"trigger {args.trigger_id} does not exist in project {args.project_id}; "
                           "use 'qinglong trigger add'")
        kind, spec = _trigger_spec(args, current, args.trigger_options)
        if args.task is None and current is None:
            raise UserError("a new trigger needs --task TASK_ID")
        definition = TriggerDefinition(
            project_id=args.project_id,
            trigger_id=args.trigger_id,
            task_id=args.task or current.task_id,
            kind=kind,
            spec=spec,
            misfire_policy=MisfirePolicy(args.misfire) if args.misfire else
            (current.misfire_policy if current else MisfirePolicy.FIRE_ONCE),
            misfire_grace_ms=args.grace_ms if args.grace_ms is not None else
            (current.misfire_grace_ms if current else DEFAULT_MISFIRE_GRACE_MS),
            # --disabled disables; otherwise a new trigger starts enabled and an update keeps its state.
            enabled=False if args.disabled else (current.enabled if current else True),
        )
        return await pub.put_trigger(definition)

    result = _on_backend(container, go, create=sub != "list")
    if sub == "list":
        if args.json:
            _print_json([_head_json(t) for t in result])
        else:
            providers = container.trigger_providers()
            _print_table(["project", "trigger", "rev", "task", "enabled", "misfire", "grace_ms", "schedule"],
                         [[t.project_id, t.trigger_id, t.trigger_revision, t.task_id, _yes_no(t.enabled),
                           t.misfire_policy.value, t.misfire_grace_ms,
                           providers[t.kind].describe(t.spec) if t.kind in providers else t.kind]
                          for t in result])
    elif sub == "delete":
        print(f"deleted trigger {args.project_id}/{args.trigger_id}")
    else:
        state = "enabled" if result.enabled else "disabled"
        print(f"trigger {result.project_id}/{result.trigger_id} at revision {result.trigger_revision} ({state})")
    return ExitCode.OK


def _head_json(t: Any) -> dict[str, Any]:
    return {"project_id": t.project_id, "trigger_id": t.trigger_id, "trigger_revision": t.trigger_revision,
            "task_id": t.task_id, "kind": t.kind, "spec": dict(t.spec), "misfire_policy": t.misfire_policy.value,
            "misfire_grace_ms": t.misfire_grace_ms, "enabled": t.enabled, "content_digest": t.content_digest}


def _show_runs(container: Any, *, limit: int, trigger: str | None, as_json: bool) -> int:
    runs = _on_backend(container, lambda backend: backend.reader().recent_runs(limit, trigger), create=False)
    if as_json:
        _print_json([{"run_id": r.run_id, "project_id": r.project_id, "trigger_id": r.trigger_id,
                      "trigger_revision": r.trigger_revision, "scheduled_for_ms": r.scheduled_for_ms,
                      "admitted_at_ms": r.admitted_at_ms, "lag_ms": r.lag_ms, "state": r.state,
                      "idempotency_key": r.idempotency_key} for r in runs])
    else:
        _print_table(["run", "trigger", "rev", "scheduled_for", "admitted_at", "lag_ms", "state"],
                     [[r.run_id[:12], r.trigger_id, r.trigger_revision, _iso(r.scheduled_for_ms),
                       _iso(r.admitted_at_ms), r.lag_ms, r.state] for r in runs])
    return ExitCode.OK


def cmd_runs(args: argparse.Namespace) -> int:
    """Recent Runs, newest first, with their lag."""
    return _show_runs(_container(args), limit=args.limit, trigger=args.trigger, as_json=args.json)


def _limited(method: Any, limit: int | None, *args: Any) -> Any:
    """``await``-able ``method(*args, limit=limit)``; a reader without ``limit`` is sliced here."""
    import inspect

    if limit is None:
        return method(*args)
    if "limit" in inspect.signature(method).parameters:
        return method(*args, limit=limit)

    async def sliced() -> list[Any]:
        return list(await method(*args))[:limit]

    return sliced()


async def _scheduler_status(reader: Any) -> Any:
    """The reader's :class:`SchedulerStatus`, or None when this store cannot tell."""
    from qinglong.contracts.records import SchedulerStatus

    method = getattr(reader, "scheduler_status", None)
    if method is None:
        return None
    status = await method()
    return status if isinstance(status, SchedulerStatus) else None


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


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
    container = _container(args)

    async def go(backend: Any) -> tuple[Any, Any]:
        reader = backend.reader()
        schedules = await _limited(reader.list_schedules, args.limit)
        return schedules, await _scheduler_status(reader)

    schedules, status = _on_backend(container, go, create=False)
    now = _now_ms()
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
        _print_json([{"project_id": s.project_id, "trigger_id": s.trigger_id,
                      "trigger_revision": s.trigger_revision, "kind": s.kind, "spec": dict(s.spec),
                      "enabled": s.enabled, "misfire_policy": s.misfire_policy.value,
                      "next_fire_at_ms": s.next_fire_at_ms, "pending_first_fire_at_ms": preview,
                      "published_at_ms": getattr(s, "published_at_ms", None),
                      "last_scheduled_at_ms": s.last_scheduled_at_ms, "lag_ms": lag, "lag_as_of_ms": as_of,
                      "scheduler_running": None if status is None else status.running}
                     for s, preview, lag in rows])
        return ExitCode.OK
    print(_status_line(status))
    _print_table(["project", "trigger", "rev", "enabled", "next_fire_at", "last_scheduled", "lag_ms", "schedule"],
                 [[s.project_id, s.trigger_id, s.trigger_revision, _yes_no(s.enabled),
                   f"{_iso(preview)} (pending)" if preview is not None else _iso(s.next_fire_at_ms),
                   _iso(s.last_scheduled_at_ms), lag if lag is not None else "stopped",
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
        return f"scheduler: stopped; lag as of its last round at {_iso(status.last_round_at_ms)}"
    return "scheduler: stopped; no round recorded, so no lag is shown"


def cmd_cron_next(args: argparse.Namespace) -> int:
    """Preview the next fire times of a cron expression, through the cron trigger provider."""
    from zoneinfo import ZoneInfo

    from ..plugins import PluginHost

    if args.timezone is not None and not args.timezone.strip():
        raise UserError("--timezone is empty: give an IANA time zone such as 'Europe/Berlin', "
                        "or leave the option out for UTC")
    host = PluginHost()
    host.load(["cron"], required_by="'qinglong cron next'")
    provider = host.trigger_providers().get("cron")
    if provider is None:
        raise PluginLoadError("no loaded plugin provides the 'cron' trigger kind")
    spec = provider.validate({"expression": args.expression, "timezone": args.timezone or "UTC"})
    zone = ZoneInfo(spec["timezone"])
    after_ms = _now_ms() if args.after is None else _parse_time("--after", args.after, zone)
    fire_times: list[int] = []
    cursor = after_ms
    while len(fire_times) < args.count:
        nxt = provider.next_after(spec, cursor)
        if nxt is None:
            break
        fire_times.append(nxt)
        cursor = nxt

    def local(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="seconds")

    if args.json:
        _print_json({"expression": spec["expression"], "timezone": spec["timezone"],
                     "describe": provider.describe(spec), "after_ms": after_ms,
                     "fire_times": [{"at_ms": ms, "local": local(ms), "utc": _iso(ms)} for ms in fire_times]})
        return ExitCode.OK
    print(f"{provider.describe(spec)}, after {_iso(after_ms)}:")
    _print_table(["#", "local", "utc"], [[i, local(ms), _iso(ms)] for i, ms in enumerate(fire_times, start=1)])
    if len(fire_times) < args.count:
        print("(no further fire times)")
    return ExitCode.OK


def _parse_time(option: str, text: str, zone: Any) -> int:
    """An ISO 8601 time as epoch ms; without an offset it is a wall time in ``zone``."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"{option} {text!r} is not an ISO 8601 time such as 2026-03-29T01:30:00+01:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    return int(moment.timestamp() * 1000)


def cmd_skips(args: argparse.Namespace) -> int:
    """Recorded misfires: what was not admitted, and under which policy."""
    container = _container(args)

    skips = _on_backend(container, lambda backend: backend.reader().recent_skips(args.limit), create=False)
    if args.json:
        _print_json([{"project_id": s.project_id, "trigger_id": s.trigger_id, "trigger_revision": s.trigger_revision,
                      "policy": s.policy.value, "first_skipped_ms": s.first_skipped_ms,
                      "last_skipped_ms": s.last_skipped_ms, "count": s.count, "count_exact": s.count_exact,
                      "recorded_at_ms": s.recorded_at_ms} for s in skips])
    else:
        _print_table(["trigger", "rev", "policy", "first_skipped", "last_skipped", "count", "recorded_at"],
                     [[s.trigger_id, s.trigger_revision, s.policy.value, _iso(s.first_skipped_ms),
                       _iso(s.last_skipped_ms), f"{s.count}{'' if s.count_exact else '+'}", _iso(s.recorded_at_ms)]
                      for s in skips])
    return ExitCode.OK


# --------------------------------------------------------------------------- parser


def positive_count(text: str) -> int:
    """An argparse type: a whole number from 1 to :data:`MAX_LISTING` (a usage error otherwise)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_LISTING:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to {MAX_LISTING}, got {value}")
    return value


def build_parser(trigger_options: Mapping[str, TriggerCliOptions] | None = None) -> argparse.ArgumentParser:
    """The argument parser (``--settings`` and ``--profile`` work before or after the command).

    ``trigger_options`` are the options trigger kinds declared (``trigger add --cron``); without
    them ``trigger add`` and ``update`` take only ``--kind K --spec JSON``.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--settings", metavar="PATH", default=argparse.SUPPRESS,
                        help="settings file (TOML); default: $QINGLONG_SETTINGS, else profile defaults only")
    common.add_argument("--profile", metavar="NAME", default=argparse.SUPPRESS,
                        help="profile to use (edge, standalone, cluster); overrides the file's 'profile'")

    parser = argparse.ArgumentParser(
        prog="qinglong",
        parents=[common],
        description="Turn scheduled Triggers into durable Runs (edge, standalone and cluster profiles).",
        epilog="Exit codes: 0 ok, 1 internal error (a bug), 2 usage, 3 user error (settings, plugin, input), "
               "4 check failed, 5 store unavailable, 130 forced stop, 141 output closed by its reader.",
    )
    parser.add_argument("--version", action="version", version=f"qinglong {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help_text: str, func: Any, **kw: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text, **kw)
        p.set_defaults(func=func)
        return p

    def json_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print JSON")

    p = add("run", "run the scheduler until SIGTERM/SIGINT (a second signal forces the exit)", cmd_run)
    p.add_argument("--for-seconds", type=float, default=None, metavar="S", help="stop by itself after S seconds")

    p = add("demo", "publish a trigger firing every second, run a few seconds, show its Runs", cmd_demo)
    p.add_argument("--seconds", type=float, default=5.0, help="how long to run (default 5)")
    p.add_argument("--limit", type=positive_count, default=10, help="Runs to show (default 10)")

    json_flag(add("plugins", "list installed plugins; loaded ones show their hooks", cmd_plugins))
    json_flag(add("profiles", "list the shipped profiles", cmd_profiles))

    cfg = add("config", "inspect the effective settings", None)
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    p = cfg_sub.add_parser("show", parents=[common], help="print the effective settings, secrets masked")
    p.set_defaults(func=cmd_config_show)
    json_flag(p)

    chk = add("check", "checks for CI", None)
    chk_sub = chk.add_subparsers(dest="check_command", metavar="SUBCOMMAND", required=True)
    p = chk_sub.add_parser("closure", help="boot a profile in a fresh interpreter; fail on any forbidden module")
    p.set_defaults(func=cmd_check_closure)
    p.add_argument("--profile", dest="check_profile", required=True, metavar="NAME", help="profile to check")
    p.add_argument("--settings", metavar="PATH", default=argparse.SUPPRESS,
                   help="settings file to boot with (default: the profile's defaults)")
    p.add_argument("--installed", action="store_true",
                   help="also fail when a forbidden distribution is installed in this environment")
    json_flag(p)

    db = add("db", "database schema: migrate, status", None)
    db_sub = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    for name, text in (("migrate", "apply pending migrations (cluster: with the owner DSN)"),
                       ("status", "list applied, pending and drifted migrations")):
        p = db_sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=cmd_db)
        json_flag(p)

    prj = add("project", "create or list projects", None)
    prj_sub = prj.add_subparsers(dest="project_command", metavar="SUBCOMMAND", required=True)
    p = prj_sub.add_parser("create", parents=[common], help="create a project")
    p.add_argument("project_id")
    p.add_argument("--name", default=None)
    p.set_defaults(func=cmd_project)
    p = prj_sub.add_parser("list", parents=[common], help="list projects")
    json_flag(p)
    p.set_defaults(func=cmd_project)

    tsk = add("task", "publish tasks", None)
    tsk_sub = tsk.add_subparsers(dest="task_command", metavar="SUBCOMMAND", required=True)
    p = tsk_sub.add_parser(
        "put", parents=[common], help="create a task or publish a new revision of it",
        usage="qinglong task put PROJECT TASK [--payload JSON] [options] -- PROGRAM [ARG ...]",
        description="Create a task or publish a new revision of it. Everything after '--' is the command a "
                    "worker runs, as an argument list (dashes included): "
                    "qinglong task put ops backup -- /bin/sh -c 'date'. It is stored as the payload's "
                    "'command' list, beside any --payload keys.")
    p.add_argument("project_id", metavar="PROJECT")
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("--command", nargs=argparse.REMAINDER, metavar="PROGRAM [ARG ...]",
                   help="the same as '--': every argument after it is the command (so it comes last)")
    p.add_argument("--payload", metavar="JSON", help="the task payload as a JSON object (at most 64 KiB)")
    # The words after '--' are split off before argparse sees them (see _split_command_argv).
    p.set_defaults(func=cmd_task, argv=[])

    trg = add("trigger", "publish triggers: add, update, enable, disable, delete, list", None)
    trg_sub = trg.add_subparsers(dest="trigger_command", metavar="SUBCOMMAND", required=True)
    for name, text in (("add", "add a trigger"), ("update", "publish a new revision (resets the schedule)")):
        p = trg_sub.add_parser(name, parents=[common], help=text, description=text)
        p.add_argument("project_id")
        p.add_argument("trigger_id")
        p.add_argument("--task", default=None, help="task the Runs execute")
        p.add_argument("--kind", default=None,
                       help="trigger kind (a plugin's); implied by the options of a kind given below")
        p.add_argument("--spec", default=None, metavar="JSON", help="the trigger spec as a JSON object (any kind)")
        p.add_argument("--misfire", choices=[m.value for m in MisfirePolicy], default=None,
                       help="what a late occurrence does (default fire_once)")
        p.add_argument("--grace-ms", type=int, default=None, help="misfire grace in ms (default 60000)")
        p.add_argument("--disabled", action="store_true", help="publish disabled")
        _add_trigger_kind_options(p, trigger_options or {})
        p.set_defaults(func=cmd_trigger, trigger_options=dict(trigger_options or {}))
    for name in ("enable", "disable", "delete"):
        p = trg_sub.add_parser(name, parents=[common], help=f"{name} a trigger")
        p.add_argument("project_id")
        p.add_argument("trigger_id")
        p.set_defaults(func=cmd_trigger)
    p = trg_sub.add_parser("list", parents=[common], help="list triggers")
    p.add_argument("project_id", nargs="?", default=None)
    p.add_argument("--limit", type=positive_count, default=None, help="at most N triggers")
    json_flag(p)
    p.set_defaults(func=cmd_trigger)

    p = add("runs", "recent Runs, newest first, with lag (admitted - scheduled)", cmd_runs)
    p.add_argument("--limit", type=positive_count, default=20, help="Runs to show (default 20)")
    p.add_argument("--trigger", default=None, help="only this trigger")
    json_flag(p)
    p = add("schedules", "every trigger's next fire time, and its lag while a scheduler runs", cmd_schedules)
    p.add_argument("--limit", type=positive_count, default=None, help="at most N schedules")
    json_flag(p)
    p = add("skips", "recorded misfires (skipped occurrences)", cmd_skips)
    p.add_argument("--limit", type=positive_count, default=20, help="records to show (default 20)")
    json_flag(p)

    _add_cron_commands(add, common, json_flag)
    return parser


def _add_cron_commands(add: Any, common: argparse.ArgumentParser, json_flag: Any) -> None:
    """``qinglong cron next``: the one command about a trigger kind itself (see docs/plugins.md)."""
    cron = add("cron", "cron expressions: preview fire times", None)
    cron_sub = cron.add_subparsers(dest="cron_command", metavar="SUBCOMMAND", required=True)
    p = cron_sub.add_parser("next", parents=[common], help="the next fire times of a cron expression",
                            description="The next fire times of a cron expression, computed by the cron "
                                        "trigger provider exactly as the scheduler computes them "
                                        "(daylight-saving rule included).")
    p.add_argument("expression", metavar="EXPR",
                   help="5 fields, 6 with seconds first, or @hourly/@daily/@midnight/@weekly/@monthly/@yearly")
    p.add_argument("--timezone", default=None, metavar="ZONE", help="IANA time zone (default UTC)")
    p.add_argument("--count", type=positive_count, default=5, help="how many fire times (default 5)")
    p.add_argument("--after", default=None, metavar="TIME",
                   help="start after this ISO 8601 time (default now; without an offset, in --timezone)")
    json_flag(p)
    p.set_defaults(func=cmd_cron_next)


#: The options of ``trigger add`` and ``update`` themselves; a trigger kind cannot declare these.
TRIGGER_COMMAND_FLAGS = ("--task", "--kind", "--spec", "--misfire", "--grace-ms", "--disabled",
                         "--settings", "--profile", "--help")


def _add_trigger_kind_options(parser: argparse.ArgumentParser, declared: Mapping[str, TriggerCliOptions]) -> None:
    """One argument group per trigger kind, with the options its plugin declared.

    A flag two kinds share is added once, in the first kind's group, naming both.
    """
    added: set[str] = set()
    for kind in sorted(declared):
        group = parser.add_argument_group(f"options of trigger kind {kind} (plugin-declared)")
        for option in declared[kind].options:
            if option.flag in added:
                continue
            added.add(option.flag)
            kinds = [k for k in sorted(declared) if option.flag in declared[k].flags()]
            group.add_argument(option.flag, dest=_option_dest(option.flag), default=None, metavar=option.metavar,
                               help=option.help + (f" (kinds {', '.join(kinds)})" if len(kinds) > 1 else ""))


def _trigger_options_for(head: Sequence[str]) -> dict[str, TriggerCliOptions]:
    """For ``trigger add`` and ``update`` only: the trigger kinds' options from the loaded plugins.

    They are needed before the command line can be parsed, so the settings named by ``--settings``
    and ``--profile`` are read first; every other command parses without loading a plugin.
    """
    if _command_words(head)[:2] not in (["trigger", "add"], ["trigger", "update"]):
        return {}
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--settings", default=None)
    pre.add_argument("--profile", default=None)
    known, _ = pre.parse_known_args(list(head))
    from ..containers import load_plugins

    return load_plugins(_load(known)).trigger_cli_options(reserved=TRIGGER_COMMAND_FLAGS)


def _command_words(head: Sequence[str]) -> list[str]:
    """The words of the command line that are not options or values of the global options."""
    return [a for i, a in enumerate(head)
            if not a.startswith("-") and not (i and head[i - 1] in ("--settings", "--profile", "--payload"))]


def _split_command_argv(arguments: list[str]) -> tuple[list[str], list[str] | None]:
    """For ``task put``: the words after the first ``--`` are the command, whatever they look like.

    argparse alone cannot do this once options stand between the positionals and ``--`` (its
    ``nargs='*'`` positional is matched empty too early), so the command is split off first.
    """
    if "--" not in arguments:
        return arguments, None
    cut = arguments.index("--")
    head = arguments[:cut]
    if _command_words(head)[:2] != ["task", "put"]:
        return arguments, None
    return head, arguments[cut + 1:]


def _refuse_undecodable(argv: Sequence[str]) -> None:
    """Refuse an argument that holds undecodable bytes (a lone surrogate after decoding).

    Such text cannot be stored as UTF-8; refusing it here names the argument by position instead of
    failing deep in a store. A ``--settings`` path is exempt: a file name may be any bytes.
    """
    previous = ""
    for position, arg in enumerate(argv, start=1):
        if previous != "--settings" and not arg.startswith("--settings="):
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(f"argument {position} is not valid UTF-8 text (it holds undecodable bytes); "
                                "Qinglong stores only UTF-8") from None
        previous = arg


_PREFIXES: tuple[tuple[type[BaseException], str], ...] = (
    (CheckFailed, "check failed"),
    (SchemaNotReady, "not ready"),
    (RecoveryRequired, "not ready"),
    (StoreUnavailable, "unavailable"),
)


def error_paragraph(exc: QinglongError) -> str:
    """``qinglong: <what>: <message>`` as one line, DSN passwords masked as a last defence."""
    from qinglong.contracts.diagnostics import redact

    what = next((label for kind, label in _PREFIXES if isinstance(exc, kind)), "error")
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return f"qinglong: {what}: {redact(message)}"


def _stdout_reader_gone() -> bool:
    """True when standard output is a pipe or socket whose reader has closed it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True  # no poll() here, or stdout already closed: the pipe error was stdout's


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qinglong`` script. Returns the exit code (an :class:`ExitCode`)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        _refuse_undecodable(arguments)
        head, command = _split_command_argv(arguments)
        args = build_parser(_trigger_options_for(head)).parse_args(head)
        if command is not None:
            args.argv = command
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows up here at the latest, not at interpreter exit
        return int(code)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # some other pipe: a bug, with its traceback
        # As the CPython documentation recommends (signal module, "Note on SIGPIPE"): point stdout at
        # devnull so the interpreter's final flush does not fail again, and exit like a shell
        # reports a process ended by SIGPIPE.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return int(ExitCode.BROKEN_PIPE)
    except QinglongError as exc:
        sys.stderr.write(error_paragraph(exc) + "\n")
        return int(exit_code_for(exc))
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
