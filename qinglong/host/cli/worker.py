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
    """Check ``[worker]``, load the plugins, connect, and serve until a signal."""
    from qinglong.contracts.errors import UserError
    from qinglong.contracts.execution import ExecutorContext, minimal_environment

    from ..containers import build_container, create_executors
    from qinglong.worker import worker_config

    loaded = settings_of(args)
    config = worker_config(loaded.settings.worker)
    dsn = loaded.settings.worker.dsn.get_secret_value()
    container = build_container(loaded)
    host = container.plugin_host()
    protocols = host.worker_protocol_specs()
    spec = protocols.get(loaded.profile.backend)
    if spec is None:
        raise UserError(f"`qinglong worker` needs a profile whose store offers a worker protocol; the "
                        f"{loaded.profile.name} profile's backend {loaded.profile.backend!r} offers none "
                        f"(worker protocols of the loaded plugins: {', '.join(sorted(protocols)) or 'none'}); "
                        "use the cluster profile")
    context = ExecutorContext(log_dir=config.log_dir, base_env=minimal_environment(os.environ.get("HOME")),
                              kill_grace_ms=config.kill_grace_ms, orphan_drain_ms=config.orphan_drain_ms,
                              orphans=config.orphans)
    executors = create_executors(host, context)
    diagnostics = container.diagnostics()

    async def connect() -> Any:
        return await spec.create(dsn, config.application_name)

    return asyncio.run(serve(connect, executors, config, diagnostics))


async def serve(connect: Any, executors: Any, config: Any, diagnostics: Any) -> int:
    """Connect (a store unreachable at start is retried by the worker; one that refuses the login
    is exit 5 at once), run, drain on a signal."""
    from qinglong.contracts.diagnostics import DiagnosticEvent
    from qinglong.contracts.errors import StoreAuthFailed, StoreUnavailable

    from qinglong.worker import Worker

    try:
        protocol = await connect()
    except StoreAuthFailed:
        raise  # permanent until the settings change: exit at once with its code
    except StoreUnavailable as exc:
        diagnostics.emit(DiagnosticEvent("warning", "worker.store_unavailable",
                                         f"the store is unavailable at start; retrying: {exc}"))
        protocol = None
    worker = Worker(connect, executors, config, diagnostics, protocol=protocol)
    with two_stage_signals(diagnostics, "worker.stop_requested",
                           "draining (send it again to kill the jobs and exit at once)", worker.request_stop,
                           lambda: f"{worker.kill_all()} job(s) killed, exiting at once"):
        return await worker.run()


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``worker``."""
    add_command(sub, common, "worker",
                "run the cluster's Runs on this machine until SIGTERM/SIGINT (drains; a second signal "
                "kills the jobs and exits)", cmd_worker)
