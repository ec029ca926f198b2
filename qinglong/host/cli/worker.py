"""``qinglong worker``: run cluster Runs on this machine until SIGTERM/SIGINT.

The first signal drains (no new claims; running jobs may finish for ``[worker] drain_timeout_ms``,
then they are stopped and reported ``cancelled``; the session is closed; exit 0). A second signal
KILLs every job's process group first, so no job outlives the session that fences it, and exits
130 at once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from .boot import settings_of
from .parsing import add_command
from .signals import two_stage_signals


def cmd_worker(args: argparse.Namespace) -> int:
    """Check ``[worker]``, load the executors, connect to the gateway, and serve until a signal."""
    from qinglong.contracts.execution import ExecutorContext, minimal_environment

    from qinglong.worker import worker_config

    loaded = settings_of(args)
    config = worker_config(loaded.settings.worker)
    home = config.run_as[3] if config.run_as is not None else os.environ.get("HOME")
    context = ExecutorContext(log_dir=config.log_dir, base_env=minimal_environment(home),
                              kill_grace_ms=config.kill_grace_ms, orphan_drain_ms=config.orphan_drain_ms,
                              orphans=config.orphans,
                              run_as=(config.run_as[1], config.run_as[2]) if config.run_as is not None else None)
    # nothing of the store is loaded (no driver, no credential, no store contracts), nor the
    # control plane's containers: qinglong[worker]
    from ..assembly import GatewayWorkerContainer
    from qinglong.worker import read_token_file

    worker_container = GatewayWorkerContainer(loaded=loaded, executor_context=context)
    diagnostics = worker_container.diagnostics()
    read_token_file(config.token_file)  # a missing or readable token file: exit 3 before anything runs
    executors = worker_container.executors()

    async def connect() -> Any:
        from qinglong.worker import connect_http_protocol

        return await connect_http_protocol(config.url, config.token_file, config.application_name,
                                           config.ca_file)

    return asyncio.run(serve(connect, executors, config, diagnostics))


async def serve(connect: Any, executors: Any, config: Any, diagnostics: Any) -> int:
    """Connect (a store unreachable at start is retried by the worker; one that refuses the login
    is exit 5 at once), run, drain on a signal."""
    from qinglong.contracts.diagnostics import DiagnosticEvent
    from qinglong.contracts.errors import StoreAuthFailed, StoreUnavailable

    from qinglong.worker import Worker

    from ..assembly import release_freed_memory

    try:
        protocol = await connect()
    except StoreAuthFailed:
        raise  # permanent until the settings change: exit at once with its code
    except StoreUnavailable as exc:
        diagnostics.emit(DiagnosticEvent("warning", "worker.store_unavailable",
                                         f"the store is unavailable at start; retrying: {exc}"))
        protocol = None
    release_freed_memory()  # the boot's garbage, before the worker idles for hours
    worker = Worker(connect, executors, config, diagnostics, protocol=protocol)
    with two_stage_signals(diagnostics, "worker.stop_requested",
                           "draining (send it again to kill the jobs and exit at once)", worker.request_stop,
                           lambda: f"{worker.kill_all()} job(s) killed, exiting at once"):
        return await worker.run()


def cmd_worker_install_token(args: argparse.Namespace) -> int:
    """``qinglong worker install-token SOURCE``: copy a token from a file this user may only read
    (a mounted Secret, owned by root) to ``[worker] token_file``, mode 0600, this user's own."""
    import tempfile

    from qinglong.contracts.errors import SettingsError, UserError
    from qinglong.contracts.worker import WORKER_TOKEN_PREFIX

    loaded = settings_of(args)
    target = loaded.settings.worker.token_file
    if not target:
        raise SettingsError("[worker] token_file is required: where the token is installed")
    try:
        with open(args.source, encoding="utf-8") as f:
            token = f.read(1024).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"worker install-token: cannot read {args.source}: {exc.__class__.__name__}") from None
    if not token.startswith(WORKER_TOKEN_PREFIX) or len(token) > 512 or any(c.isspace() for c in token):
        raise UserError(f"worker install-token: {args.source} holds no worker token (one line starting with "
                        f"{WORKER_TOKEN_PREFIX}, as `qinglong worker register` prints it)")
    folder = os.path.dirname(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".token-")
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    return 0


def cmd_worker_admin(args: argparse.Namespace) -> int:
    """``qinglong worker register|list|revoke|rotate``: registered workers, on the store (admin)."""
    import sys
    import time

    from qinglong.contracts.errors import UserError
    from qinglong.contracts.worker import (
        BadWorkerCall, WorkerRegistration, check_registration, new_worker_token, worker_token_digest)

    from .boot import container_of, on_backend
    from .output import iso, print_json, print_table

    def registry(backend: Any) -> Any:
        found = getattr(backend, "worker_registry", None)
        if found is None:
            raise UserError(f"the {getattr(backend, 'name', 'profile')} backend registers no workers "
                            "(use the cluster profile)")
        return found()

    container = container_of(args)
    now = time.time_ns() // 1_000_000
    action = args.worker_action
    if action == "register":
        labels = tuple(sorted(set(args.label or ())))
        projects = tuple(sorted(set(args.project or ())))
        try:
            check_registration(args.name, labels, projects, args.capacity)
        except BadWorkerCall as exc:
            raise UserError(f"worker register: {exc}") from None
        secret = new_worker_token()

        async def body(backend: Any) -> None:
            await registry(backend).register_worker(
                WorkerRegistration(args.name, labels, projects, args.capacity, now), worker_token_digest(secret))

        on_backend(container, body)
        print(secret)
        sys.stderr.write(f"worker {args.name!r} registered (labels {', '.join(labels) or '-'}; projects "
                         f"{', '.join(projects) or 'all'}; capacity {args.capacity}): the token above is shown "
                         "once and stored only as a hash; write it to the worker's [worker] token_file (mode 0600)\n")
        return 0
    if action == "rotate":
        secret = new_worker_token()

        async def rotate(backend: Any) -> Any:
            return await registry(backend).rotate_worker(args.name, worker_token_digest(secret), now)

        on_backend(container, rotate)
        print(secret)
        sys.stderr.write(f"worker {args.name!r}: new token above (shown once); the old one is refused from now on\n")
        return 0
    if action == "revoke":
        async def revoke(backend: Any) -> Any:
            return await registry(backend).revoke_worker(args.name)

        handed = on_backend(container, revoke)
        print(f"worker {args.name!r} revoked: its session is closed, {handed} Attempt(s) handed over")
        return 0

    async def listing(backend: Any) -> Any:
        return await registry(backend).list_workers()

    rows = on_backend(container, listing, read_only=True)
    if args.json:
        print_json([r.as_json() for r in rows])
    else:
        print_table(("worker", "labels", "projects", "capacity", "state", "created", "rotated"), [
            (r.worker_id, ",".join(r.labels) or "-", ",".join(r.projects) or "*", str(r.capacity),
             "revoked" if r.revoked_at_ms is not None else "active", iso(r.created_at_ms), iso(r.rotated_at_ms))
            for r in rows])
    return 0


def boot_worker_for_closure(settings_path: str | None) -> list[str]:
    """Boot ``qinglong worker`` as it runs against a gateway, without connecting: the command
    line, the settings (``[worker] url`` set), the plugins, the executors, the HTTP client and
    the worker's runtime; list modules."""
    import os
    import tempfile

    from qinglong.contracts.execution import ExecutorContext, minimal_environment

    from .main import build_parser, command_groups_for
    from ..assembly import GatewayWorkerContainer
    from ..settings import load_settings

    build_parser(groups=command_groups_for(["worker"]))
    with tempfile.TemporaryDirectory() as scratch:
        if settings_path is None:
            settings_path = os.path.join(scratch, "worker.toml")
            with open(settings_path, "w") as f:
                f.write('profile = "cluster"\n[worker]\nurl = "https://gateway.invalid"\n'
                        f'token_file = "{scratch}/token"\nlog_dir = "{scratch}/logs"\n')
        loaded = load_settings(settings_path)
        from qinglong.worker import HttpWorkerProtocol, Worker, worker_config  # noqa: F401

        config = worker_config(loaded.settings.worker)
        container = GatewayWorkerContainer(loaded=loaded, executor_context=ExecutorContext(
            log_dir=config.log_dir, base_env=minimal_environment(None), kill_grace_ms=config.kill_grace_ms))
        container.diagnostics()
        container.executors()
    import sys

    return list(sys.modules)



def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``worker`` (and its ``register``, ``list``, ``revoke``, ``rotate``)."""
    from .parsing import add_json_flag

    p = add_command(sub, common, "worker",
                    "run the cluster's Runs on this machine until SIGTERM/SIGINT (drains; a second signal "
                    "kills the jobs and exits); or manage registered workers", cmd_worker)
    actions = p.add_subparsers(dest="worker_action", metavar="{register,list,revoke,rotate,install-token}")
    reg = add_command(actions, common, "register", "register a worker: prints its token once (admin)",
                      cmd_worker_admin)
    reg.add_argument("name", help="the worker's id")
    reg.add_argument("--label", action="append", help="a label it offers (repeatable)")
    reg.add_argument("--project", action="append", help="a project whose Runs it may take (repeatable; "
                     "none: every project)")
    reg.add_argument("--capacity", type=int, default=2, help="Runs it may hold at once (1-256, default 2)")
    lst = add_command(actions, common, "list", "registered workers (never a token)", cmd_worker_admin)
    add_json_flag(lst)
    rev = add_command(actions, common, "revoke", "revoke a worker: its session ends and its Runs are handed "
                      "over at once", cmd_worker_admin)
    rev.add_argument("name")
    rot = add_command(actions, common, "rotate", "give a worker a new token (printed once); the old one stops "
                      "working", cmd_worker_admin)
    rot.add_argument("name")
    ins = add_command(actions, common, "install-token", "copy this worker's token from SOURCE (a mounted "
                      "Secret) to [worker] token_file, mode 0600, this user's", cmd_worker_install_token)
    ins.add_argument("source", help="the file holding the token")
