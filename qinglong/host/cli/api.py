"""``qinglong api``: serve the management API (and its probes and metrics) as a process of its own."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from qinglong.contracts.errors import ExitCode

from .boot import container_of, opened_backend
from .parsing import add_command


def cmd_api(args: argparse.Namespace) -> int:
    from qinglong import __version__

    from ..http.service import ApiProcess
    from .signals import two_stage_signals

    container = container_of(args)
    loaded = container.loaded()
    diagnostics = container.diagnostics()

    async def serve() -> int:
        async with opened_backend(container, create=False) as backend:
            check_secrets = getattr(backend, "check_secrets", None)
            if check_secrets is not None:  # every stored sealed value's key is loaded, or no start
                await check_secrets()
            specs = container.plugin_host().worker_protocol_specs()
            process = ApiProcess(loaded, backend, container.trigger_providers(), diagnostics, __version__,
                                 worker_spec=specs.get(loaded.profile.backend))
            stop = asyncio.Event()
            with two_stage_signals(diagnostics, "api.stop_requested", "stopping", stop.set):
                await process.start()
                try:
                    await stop.wait()
                finally:
                    await process.stop()
        return ExitCode.OK

    return asyncio.run(serve())


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``api``."""
    add_command(sub, common, "api", "serve the management API (/api/v1) with its probes and metrics "
                "on the [http] listener, until SIGTERM", cmd_api)
