"""Publishing: ``qinglong project``, ``task`` (put, show, run: :mod:`.task`) and ``trigger`` (add, update,
enable, disable, delete, list)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Mapping, Sequence

from qinglong.contracts.errors import (
    AlreadyExists,
    ExitCode,
    NotFound,
    PluginLoadError,
    QinglongError,
    UserError,
    quoted,
)
from qinglong.contracts.providers import TriggerCliOptions
from qinglong.contracts.records import DEFAULT_MISFIRE_GRACE_MS, MisfirePolicy, TriggerDefinition
from qinglong.contracts.store import MAX_SPEC_BYTES, check_json_value

from .boot import container_of, limited, on_backend, settings_of
from .output import format_duration_ms, print_json, print_table, yes_no
from .parsing import add_command, add_json_flag, command_words, parse_duration_ms, positive_count
from .task import register_task


def cmd_project(args: argparse.Namespace) -> int:
    """Create, list or delete projects."""
    container = container_of(args)
    sub = args.project_command

    async def go(backend: Any) -> Any:
        if sub == "create":
            return await backend.publisher().create_project(args.project_id, args.name)
        if sub == "delete":
            plan = await backend.publisher().delete_project(args.project_id, dry_run=args.dry_run)
            if not plan.changes:
                raise NotFound(f"project {quoted(args.project_id)} does not exist")
            return plan
        return await backend.reader().list_projects()

    result = on_backend(container, go, create=sub == "create", read_only=sub == "list")
    if sub == "create":
        print(f"created project {result.project_id}")
    elif sub == "delete":
        from qinglong.contracts.apply import ObjectKind

        deleted = [c for c in result.changes if c.kind is not ObjectKind.PROJECT]
        if args.json:
            print_json({"project_id": args.project_id, "dry_run": args.dry_run,
                        "deleted": [c.to_json() for c in result.changes]})
        else:
            what = ", ".join(f"{c.kind.value} {c.object_id}" for c in deleted) or "nothing in it"
            verb = "would delete" if args.dry_run else "deleted"
            print(f"{verb} project {args.project_id} and {what} (its Runs stay)")
    elif args.json:
        from ..views import project_json

        print_json([project_json(p) for p in result])
    else:
        print_table(["project", "name", "active"], [[p.project_id, p.name, yes_no(p.active)] for p in result])
    return ExitCode.OK


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_object(option: str, text: str, max_bytes: int) -> dict[str, Any]:
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
        return kind, json_object("--spec", args.spec, MAX_SPEC_BYTES)
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
    container = container_of(args)
    sub = args.trigger_command

    async def go(backend: Any) -> Any:
        pub, reader = backend.publisher(), backend.reader()
        if sub == "list":
            return await limited(reader.list_triggers, args.limit, args.project_id)
        if sub in ("enable", "disable"):
            return await pub.set_trigger_enabled(args.project_id, args.trigger_id, sub == "enable")
        if sub == "delete":
            await pub.delete_trigger(args.project_id, args.trigger_id)
            return None
        existing = {t.trigger_id: t for t in await reader.list_triggers(args.project_id)}
        current = existing.get(args.trigger_id)
        if sub == "add" and current is not None:
            raise AlreadyExists(f"trigger {quoted(args.trigger_id)} exists in project {quoted(args.project_id)}; "
                                "use 'qinglong trigger update'")
        if sub == "update" and current is None:
            raise NotFound(f"trigger {quoted(args.trigger_id)} does not exist in project {quoted(args.project_id)}; "
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
            jitter_ms=parse_duration_ms("--jitter", args.jitter) if args.jitter is not None else
            (current.jitter_ms if current else 0),
        )
        return await pub.put_trigger(definition)

    # Only adding publishes something new: update, enable, disable, delete need a stored trigger.
    result = on_backend(container, go, create=sub == "add", read_only=sub == "list")
    if sub == "list":
        if args.json:
            print_json([_head_json(t) for t in result])
        else:
            providers = container.trigger_providers()
            print_table(["project", "trigger", "rev", "task", "enabled", "misfire", "grace_ms", "jitter",
                         "schedule"],
                         [[t.project_id, t.trigger_id, t.trigger_revision, t.task_id, yes_no(t.enabled),
                           t.misfire_policy.value, t.misfire_grace_ms,
                           format_duration_ms(t.jitter_ms) if t.jitter_ms else "-",
                           providers[t.kind].describe(t.spec) if t.kind in providers else t.kind]
                          for t in result])
    elif sub == "delete":
        print(f"deleted trigger {args.project_id}/{args.trigger_id}")
    else:
        state = "enabled" if result.enabled else "disabled"
        print(f"trigger {result.project_id}/{result.trigger_id} at revision {result.trigger_revision} ({state})")
    return ExitCode.OK


def _head_json(t: Any) -> dict[str, Any]:
    from ..views import trigger_json  # shared with the API

    return trigger_json(t)


#: The options of ``trigger add`` and ``update`` themselves; a trigger kind cannot declare these.
TRIGGER_COMMAND_FLAGS = ("--task", "--kind", "--spec", "--misfire", "--grace-ms", "--jitter", "--disabled",
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


def trigger_options_for(head: Sequence[str]) -> dict[str, TriggerCliOptions]:
    """For ``trigger add`` and ``update`` only: the trigger kinds' options from the loaded plugins.

    They are needed before the command line can be parsed, so the settings named by ``--settings``
    and ``--profile`` are read first; every other command parses without loading a plugin.
    """
    if command_words(head)[:2] not in (["trigger", "add"], ["trigger", "update"]):
        return {}
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--settings", default=None)
    pre.add_argument("--profile", default=None)
    known, _ = pre.parse_known_args(list(head))
    from ..containers import load_plugins

    return load_plugins(settings_of(known)).trigger_cli_options(reserved=TRIGGER_COMMAND_FLAGS)


def register(sub: Any, common: argparse.ArgumentParser,
             trigger_options: Mapping[str, TriggerCliOptions] | None = None) -> None:
    """Add ``project``, ``task`` and ``trigger``; ``trigger add``/``update`` take the kinds' declared options."""
    prj = add_command(sub, common, "project", "create, list or delete projects", None)
    prj_sub = prj.add_subparsers(dest="project_command", metavar="SUBCOMMAND", required=True)
    p = prj_sub.add_parser("create", parents=[common], help="create a project")
    p.add_argument("project_id")
    p.add_argument("--name", default=None)
    p.set_defaults(func=cmd_project)
    p = prj_sub.add_parser("list", parents=[common], help="list projects")
    add_json_flag(p)
    p.set_defaults(func=cmd_project)
    text = ("delete a project with its triggers and tasks, in one transaction (its Runs stay; creating "
            "it again starts it empty)")
    p = prj_sub.add_parser("delete", parents=[common], help=text, description=text)
    p.add_argument("project_id")
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted; change nothing")
    add_json_flag(p)
    p.set_defaults(func=cmd_project)

    tsk = add_command(sub, common, "task", "tasks: put (publish), show, list, delete, run (a manual Run now)",
                      None)
    tsk_sub = tsk.add_subparsers(dest="task_command", metavar="SUBCOMMAND", required=True)
    register_task(tsk_sub, common)

    trg = add_command(sub, common, "trigger", "publish triggers: add, update, enable, disable, delete, list", None)
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
        p.add_argument("--jitter", default=None, metavar="DURATION",
                       help="start each occurrence up to this much later (5m, 30s; at most 1d), the "
                            "same delay on every reading; 0s for none (default: none, or kept on update)")
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
    add_json_flag(p)
    p.set_defaults(func=cmd_trigger)
