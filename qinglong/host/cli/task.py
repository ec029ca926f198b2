"""Tasks: ``qinglong task put``, ``task show`` and ``task run``.

A task's payload holds its execution spec (:mod:`qinglong.contracts.execution`): ``task put``
builds it from the options and the words after ``--``, checks it against the profile's limits
before anything is written, and stores every execution value explicitly, so the timeout a
revision runs with is the one ``task show`` prints, whatever a later default says. Environment
values may be secrets: no command here prints one (``task show`` masks them, refusals never echo).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import uuid
from typing import Any, Mapping

from qinglong.contracts.errors import ExitCode, NotFound, UserError, quoted
from qinglong.contracts.store import MAX_PAYLOAD_BYTES, check_command, check_identifier, check_json_value

from .boot import container_of, need_execution, on_backend
from .output import format_duration_ms, format_size, now_ms, print_json, print_table, yes_no
from .parsing import add_json_flag, parse_duration_ms, parse_size_bytes, positive_count

#: Which option sets which payload key: a refusal of the key names the option the user typed.
OPTION_KEYS: tuple[tuple[str, str], ...] = (
    ("--env", "env"),
    ("--workdir", "working_dir"),
    ("--timeout", "timeout_ms"),
    ("--concurrency", "concurrency.mode"),
    ("--max-running", "concurrency.max_running"),
    ("--retries", "retry.max_attempts"),
    ("--retry-exit-code", "retry.exit_codes"),
    ("--idempotent", "idempotent"),
    ("--log-limit", "log_limit_bytes"),
    ("--executor", "executor"),
    ("--label", "labels"),
    ("--notify", "notify.when"),
    ("--notify-channel", "notify.channels"),
)


def execution_limits(loaded: Any) -> Any:
    """The :class:`~qinglong.contracts.execution.ExecutionLimits` of the settings: ``[execution]``'s
    defaults and maximum timeout, capped log limit from the profile."""
    from qinglong.contracts.execution import ExecutionLimits

    e, profile = loaded.settings.execution, loaded.profile
    return ExecutionLimits(
        default_timeout_ms=e.default_timeout_ms,
        max_timeout_ms=min(e.max_timeout_ms, profile.timeout_cap_ms),
        default_log_limit_bytes=e.log_limit_bytes,
        max_log_limit_bytes=profile.log_limit_cap_bytes,
    )


def _env_option(values: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE ...`` as a mapping; a refusal names the variable, never its value."""
    env: dict[str, str] = {}
    for position, item in enumerate(values, start=1):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UserError(f"--env: expected NAME=VALUE, but --env number {position} has "
                            f"{'no NAME' if sep else 'no ='} (its text is not shown: it may hold a secret)")
        if name in env:
            raise UserError(f"--env {name}: given twice; give each variable once")
        env[name] = value
    return env


def _options_payload(args: argparse.Namespace, limits: Any) -> tuple[dict[str, Any], list[str]]:
    """The payload keys the execution options give, and the options given."""
    given: list[str] = []
    keys: dict[str, Any] = {}
    if args.env:
        keys["env"] = _env_option(args.env)
        given.append("--env")
    if args.workdir is not None:
        keys["working_dir"] = args.workdir
        given.append("--workdir")
    if args.timeout is not None:
        timeout = parse_duration_ms("--timeout", args.timeout)
        if not 1_000 <= timeout <= limits.max_timeout_ms:
            raise UserError(f"--timeout {args.timeout}: expected from 1s to "
                            f"{format_duration_ms(limits.max_timeout_ms)} (this profile's maximum, "
                            "[execution] max_timeout_ms)")
        keys["timeout_ms"] = timeout
        given.append("--timeout")
    if args.concurrency is not None or args.max_running is not None:
        concurrency: dict[str, Any] = {"mode": args.concurrency or "allow"}
        if args.max_running is not None:
            if concurrency["mode"] != "allow":
                raise UserError(f"--max-running: only with --concurrency allow ({concurrency['mode']} "
                                "runs one at a time)")
            concurrency["max_running"] = args.max_running
            given.append("--max-running")
        if args.concurrency is not None:
            given.append("--concurrency")
        keys["concurrency"] = concurrency
    if args.retries is not None or args.retry_exit_code:
        retries = 0 if args.retries is None else args.retries
        if not 0 <= retries < limits.max_attempts_cap:
            raise UserError(f"--retries {retries}: expected from 0 to {limits.max_attempts_cap - 1} "
                            f"(at most {limits.max_attempts_cap} attempts in all)")
        if args.retry_exit_code and not retries:
            raise UserError("--retry-exit-code: only with --retries N (N >= 1): without retries no "
                            "exit code retries")
        retry: dict[str, Any] = {"max_attempts": retries + 1}
        if args.retry_exit_code:
            retry["exit_codes"] = list(args.retry_exit_code)
            given.append("--retry-exit-code")
        if args.retries is not None:
            given.append("--retries")
        keys["retry"] = retry
    if args.idempotent:
        keys["idempotent"] = True
        given.append("--idempotent")
    if args.log_limit is not None:
        size = parse_size_bytes("--log-limit", args.log_limit)
        if size > limits.max_log_limit_bytes:
            raise UserError(f"--log-limit {args.log_limit}: over this profile's cap of "
                            f"{format_size(limits.max_log_limit_bytes)}")
        keys["log_limit_bytes"] = size
        given.append("--log-limit")
    if args.executor is not None:
        keys["executor"] = args.executor
        given.append("--executor")
    if args.label:
        keys["labels"] = list(args.label)
        given.append("--label")
    if args.notify is not None or args.notify_channel:
        notify: dict[str, Any] = {}
        if args.notify is not None:
            notify["when"] = args.notify
            given.append("--notify")
        if args.notify_channel:
            notify["channels"] = list(args.notify_channel)
            given.append("--notify-channel")
        keys["notify"] = notify
    return keys, given


def _root(key: str) -> str:
    return key.split(".", 1)[0]


def _flag_for(key: str, given: list[str]) -> str | None:
    """The option the user gave that set payload key ``key`` (``env.NAME``: ``--env``), if any."""
    exact = next((flag for flag, k in OPTION_KEYS if k == key and flag in given), None)
    return exact or next((flag for flag, k in OPTION_KEYS if _root(k) == _root(key) and flag in given), None)


def build_task_payload(args: argparse.Namespace, task_id: str, limits: Any,
                       json_object: Any) -> dict[str, Any]:
    """The payload ``task put`` stores: the user's other keys, then every execution value stated.

    Every refusal happens here, before the store is opened; it names the option (or the
    ``--payload`` key) and what was expected, never an environment value.
    """
    from qinglong.contracts.execution import EXECUTION_KEYS, parse_execution_spec, spec_to_payload

    check_identifier("task_id", task_id)
    payload = json_object("--payload", args.payload, MAX_PAYLOAD_BYTES) if args.payload is not None else {}
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
    options, given = _options_payload(args, limits)
    for key, value in options.items():
        if key in payload:
            flags = [flag for flag, k in OPTION_KEYS if _root(k) == key and flag in given]
            raise UserError(f"{', '.join(flags)} and the --payload key {key!r} both set {key}; give it once")
        payload[key] = value
    if "command" not in payload and given:
        raise UserError(f"{given[0]}: given without a command (add '-- PROGRAM [ARG ...]')")
    try:
        spec = parse_execution_spec(task_id, payload, limits)
    except UserError as exc:
        prefix = f"task {task_id!r}: "
        text = str(exc)
        rest = text[len(prefix):] if text.startswith(prefix) else text
        flag = _flag_for(rest.split(":", 1)[0], given)
        if flag is None:
            where = "--payload" if args.payload is not None else "the task"
            raise UserError(f"{where}: {rest}") from None
        raise UserError(f"{flag}: {rest}") from None
    if spec is None:
        return payload
    stated = {key: value for key, value in payload.items() if key not in EXECUTION_KEYS}
    stated.update(spec_to_payload(spec))
    check_json_value("the task payload", stated, MAX_PAYLOAD_BYTES)
    return stated


def cmd_task_put(args: argparse.Namespace) -> int:
    """Create a task, or publish a new revision of it."""
    from .publish import json_object

    container = container_of(args)
    payload = build_task_payload(args, args.task_id, execution_limits(container.loaded()), json_object)
    task = on_backend(container, lambda backend: backend.publisher().put_task(
        args.project_id, args.task_id, payload), create=True)
    print(f"task {task.project_id}/{task.task_id} at revision {task.task_revision} ({task.content_digest[:19]})")
    missing = missing_program(payload)
    if missing is not None:
        sys.stderr.write(f"qinglong: warning: {missing} on this machine; the task is published, and its Runs "
                         "fail to start wherever it is missing (it may exist on the machine that runs them, "
                         "a cluster worker)\n")
    return ExitCode.OK


def missing_program(payload: Mapping[str, Any]) -> str | None:
    """Why the program of a task's command would not be found here, or None when it is found.

    Looked up as the executor starts it: a name without a slash on the job's ``PATH`` (the
    task's own ``PATH``, else the minimal one), a relative path from its working directory."""
    import os
    import shutil

    from qinglong.contracts.execution import minimal_environment

    command = payload.get("command")
    if not isinstance(command, list) or not command or not isinstance(command[0], str):
        return None
    program = command[0]
    env = payload.get("env") if isinstance(payload.get("env"), dict) else {}
    if "/" not in program:
        path = env.get("PATH") or minimal_environment(None)["PATH"]
        if shutil.which(program, path=path) is None:
            return f"the program {program!r} is not on the job's PATH ({path})"
        return None
    workdir = payload.get("working_dir") or os.environ.get("HOME") or "/"
    full = os.path.join(workdir, program)
    if not os.path.exists(full):
        return f"the program {program!r} does not exist"
    if not os.access(full, os.X_OK) or os.path.isdir(full):
        return f"the program {program!r} is not executable"
    return None


def cmd_task_list(args: argparse.Namespace) -> int:
    """Every task head of a project (or of every project): revision, digest, command."""
    container = container_of(args)

    async def go(backend: Any) -> list[Any]:
        if args.project_id is not None:
            projects = [args.project_id]
        else:
            projects = [p.project_id for p in await backend.reader().list_projects()]
        publisher = backend.publisher()
        tasks = []
        for project_id in projects:
            state = await publisher.project_state(project_id)
            if not state.exists and args.project_id is not None:
                raise NotFound(f"project {quoted(project_id)} does not exist")
            tasks += [state.tasks[task_id] for task_id in sorted(state.tasks)]
        return tasks

    tasks = on_backend(container, go, read_only=True)
    if args.limit is not None:
        tasks = tasks[:args.limit]

    def command_of(task: Any) -> list[str] | None:
        command = task.payload.get("command")
        return list(command) if isinstance(command, list) else None

    if args.json:
        from ..views import task_list_json

        print_json([task_list_json(t) for t in tasks])
    else:
        print_table(["project", "task", "rev", "digest", "command"],
                    [[t.project_id, t.task_id, t.task_revision, t.content_digest[:19],
                      shlex.join(command_of(t)) if command_of(t) else "-"] for t in tasks])
    return ExitCode.OK


def cmd_task_delete(args: argparse.Namespace) -> int:
    """Delete a task (its revisions and Runs stay); refused while a trigger runs it."""
    container = container_of(args)
    on_backend(container, lambda backend: backend.publisher().delete_task(args.project_id, args.task_id),
               create=False)
    print(f"deleted task {args.project_id}/{args.task_id} (its Runs stay)")
    return ExitCode.OK


def _spec_view(spec: Any) -> dict[str, Any]:
    """The execution spec as ``task show --json`` prints it: env values masked."""
    from qinglong.contracts.execution import masked_payload, spec_to_payload

    return masked_payload(spec_to_payload(spec))


def _describe_retry(retry: Mapping[str, Any]) -> str:
    attempts = retry["max_attempts"]
    if attempts == 1:
        return "none (1 attempt)"
    codes = retry.get("exit_codes")
    return (f"up to {attempts} attempts, backoff {format_duration_ms(retry['initial_backoff_ms'])} to "
            f"{format_duration_ms(retry['max_backoff_ms'])} (jitter {retry['jitter']:g}), on "
            f"{'exit codes ' + ', '.join(map(str, codes)) if codes else 'any non-zero exit'}"
            f"{', and on timeout' if retry['on_timeout'] else ''}")


def cmd_task_show(args: argparse.Namespace) -> int:
    """A task's head revision: digest and execution spec, env values masked."""
    from qinglong.contracts.execution import EXECUTION_KEYS, parse_execution_spec

    container = container_of(args)
    limits = execution_limits(container.loaded())

    async def go(backend: Any) -> Any:
        reader = backend.reader()
        if not hasattr(reader, "task_head"):
            raise UserError(f"the {container.loaded().profile.name} profile's store cannot show a task")
        return await reader.task_head(args.project_id, args.task_id)

    task = on_backend(container, go, read_only=True)
    problem = None
    try:
        spec = parse_execution_spec(task.task_id, task.payload, limits, allow_sealed=True)
    except UserError as exc:
        spec, problem = None, str(exc)
    other = {k: v for k, v in task.payload.items() if k not in EXECUTION_KEYS}
    if args.json:
        from ..views import task_show_json

        print_json(task_show_json(task, limits))
        return ExitCode.OK
    print(f"task {task.project_id}/{task.task_id} at revision {task.task_revision} ({task.content_digest})")
    if spec is None:
        print(f"execution: {problem or 'none: the task has no command (its Runs fail)'}")
    else:
        view = _spec_view(spec)
        concurrency = view["concurrency"]
        rows = [
            ["command", shlex.join(spec.command)],
            ["env", ", ".join(f"{name}=(set)" for name in spec.env) or "-"],
            ["working_dir", spec.working_dir or "-"],
            ["timeout", f"{format_duration_ms(spec.timeout_ms)} ({spec.timeout_ms} ms)"],
            ["concurrency", concurrency["mode"] + (f", max_running {concurrency['max_running']}"
                                                   if "max_running" in concurrency else "")],
            ["retry", _describe_retry(view["retry"])],
            ["idempotent", yes_no(spec.idempotent)],
            ["log limit", f"{format_size(spec.log_limit_bytes)} ({spec.log_limit_bytes} bytes)"],
            ["executor", spec.executor],
            ["labels", ", ".join(spec.labels) or "-"],
        ]
        print_table(["key", "value"], rows)
    if other:
        print("other payload keys: " + json.dumps(other, sort_keys=True))
    return ExitCode.OK


def cmd_task_run(args: argparse.Namespace) -> int:
    """Admit a manual Run of the task now (once per idempotency key)."""
    from qinglong.contracts.execution import check_manual_key

    key = args.idempotency_key if args.idempotency_key is not None else str(uuid.uuid4())
    check_manual_key("--idempotency-key", key)
    container = container_of(args)

    async def go(backend: Any) -> tuple[str, bool]:
        store = need_execution(backend, container, "task run")
        return await store.admit_manual_run(args.project_id, args.task_id, key, now_ms())

    run_id, created = on_backend(container, go)
    if args.json:
        from ..views import manual_run_json

        print_json(manual_run_json(run_id, created, key))
    elif created:
        print(f"run {run_id} admitted (idempotency key {key})")
    else:
        print(f"run {run_id} exists already for idempotency key {key}; nothing admitted")
    return ExitCode.OK


def register_task(tsk_sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``task put``, ``task show`` and ``task run`` under ``task``."""
    p = tsk_sub.add_parser(
        "put", parents=[common], help="create a task or publish a new revision of it",
        usage="qinglong task put PROJECT TASK [--payload JSON] [options] -- PROGRAM [ARG ...]",
        description="Create a task or publish a new revision of it. Everything after '--' is the command a "
                    "worker runs, as an argument list (dashes included): "
                    "qinglong task put ops backup --timeout 30m -- /bin/sh -c 'date'. It is stored as the "
                    "payload's 'command' list, beside any --payload keys, with every execution value "
                    "(timeout, concurrency, retry, log limit, executor) stated explicitly.")
    p.add_argument("project_id", metavar="PROJECT")
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("--command", nargs=argparse.REMAINDER, metavar="PROGRAM [ARG ...]",
                   help="the same as '--': every argument after it is the command (so it comes last)")
    p.add_argument("--payload", metavar="JSON", help="the task payload as a JSON object (at most 64 KiB)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable of the job (repeatable); values are never printed")
    p.add_argument("--timeout", metavar="DURATION",
                   help="end the job timed_out after this long: 500ms, 30s, 5m, 2h, 1d "
                        "(default [execution] default_timeout_ms)")
    p.add_argument("--concurrency", choices=["allow", "forbid", "replace", "queue"],
                   help="while a Run of this task is active: start anyway (allow), skip (forbid), cancel "
                        "it (replace) or wait (queue); default allow")
    p.add_argument("--max-running", type=int, metavar="N", help="with allow: at most N Runs of this task at once")
    p.add_argument("--retries", type=int, metavar="N", help="retry a failed Attempt up to N times (default 0)")
    p.add_argument("--retry-exit-code", type=int, action="append", default=[], metavar="C",
                   help="retry only on this exit code (repeatable; default any non-zero)")
    p.add_argument("--idempotent", action="store_true",
                   help="the job may run twice safely: an Attempt lost in a crash is retried")
    p.add_argument("--workdir", metavar="DIR", help="the job's working directory (an absolute path)")
    p.add_argument("--log-limit", metavar="SIZE",
                   help="keep at most this much output: 512, 64KiB, 4MiB (capped by the profile)")
    p.add_argument("--executor", metavar="NAME", help="the executor plugin that runs it (default local_process)")
    p.add_argument("--notify", choices=["on-failure", "always", "never"], default=None,
                   help="which of its Runs' ends reach the notification channels "
                        "(default: [notifications] default, on-failure)")
    p.add_argument("--notify-channel", action="append", default=[], metavar="CHANNEL",
                   help="send its events only to this channel (repeatable; default: every channel)")
    p.add_argument("--label", action="append", default=[], metavar="LABEL",
                   help="a label a cluster worker must offer to run it (repeatable; gpu, zone=eu-1)")
    # The words after '--' are split off before argparse sees them (see parsing.split_command_argv).
    p.set_defaults(func=cmd_task_put, argv=[])

    p = tsk_sub.add_parser("show", parents=[common], help="a task's revision, digest and execution spec",
                           description="A task's head revision, digest and execution spec (environment "
                                       "values masked).")
    p.add_argument("project_id", metavar="PROJECT")
    p.add_argument("task_id", metavar="TASK")
    add_json_flag(p)
    p.set_defaults(func=cmd_task_show)

    p = tsk_sub.add_parser("list", parents=[common], help="the tasks of a project (or of every project)",
                           description="Every task head of PROJECT (default: of every project): revision, "
                                       "digest and command. On the cluster it reads with the admin role.")
    p.add_argument("project_id", metavar="PROJECT", nargs="?", default=None)
    p.add_argument("--limit", type=positive_count, default=None, help="at most N tasks")
    add_json_flag(p)
    p.set_defaults(func=cmd_task_list)

    p = tsk_sub.add_parser("delete", parents=[common], help="delete a task (refused while a trigger runs it)",
                           description="Delete a task: its head is gone while its revisions and Runs stay. "
                                       "Refused while a trigger of the project runs it, naming the triggers.")
    p.add_argument("project_id", metavar="PROJECT")
    p.add_argument("task_id", metavar="TASK")
    p.set_defaults(func=cmd_task_delete)

    p = tsk_sub.add_parser("run", parents=[common], help="admit a manual Run of the task now",
                           description="Admit a manual Run of the task's head revision now. The same "
                                       "--idempotency-key twice admits one Run.")
    p.add_argument("project_id", metavar="PROJECT")
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("--idempotency-key", metavar="KEY", default=None,
                   help="admit at most one Run for this key (default: a fresh one)")
    add_json_flag(p)
    p.set_defaults(func=cmd_task_run)
