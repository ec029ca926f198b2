"""Booting a command: its settings, its container (plugins, providers, backend), its opened backend."""

from __future__ import annotations

import argparse
import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from qinglong.contracts.capabilities import ExecutingBackend, MigratesAtStart, RemoteExecutionBackend


def settings_of(args: argparse.Namespace, profile: str | None = None):
    """The settings the command line names (``--settings``, ``--profile``), loaded and validated."""

    from ..settings import load_settings

    return load_settings(getattr(args, "settings", None), profile=profile or getattr(args, "profile", None))


def container_of(args: argparse.Namespace):
    """The container (plugins, providers, diagnostics, backend) of the command line's settings."""

    from ..containers import build_container

    container = build_container(settings_of(args))
    from ..remote import api_target

    target = api_target(args)
    if target is not None:  # qinglong --api URL: the management API stands where the store stood
        from ..remote import RemoteContainer

        return RemoteContainer(container, *target)
    return container


@asynccontextmanager
async def opened_backend(container: Any, *, readiness: bool = True, create: bool = False,
                         read_only: bool = False) -> AsyncIterator[Any]:
    """The container's backend, opened (and, with ``readiness``, migrated if it may and checked ready).

    Only ``run``, ``db migrate`` and publishing pass ``create=True``: any other command on a
    missing store says so and leaves nothing behind. ``read_only`` for commands that only read:
    a backend that can opens its store read-only (a read-only or full file system still reads)."""

    import inspect

    backend = container.backend()
    # Commands that do not publish open with create=False, so a mistyped path is reported, not created.
    # A backend written before that keyword existed is opened as it always was.
    parameters = inspect.signature(backend.open).parameters
    if "read_only" in parameters:
        await backend.open(create=create, read_only=read_only)
    elif "create" in parameters:
        await backend.open(create=create)
    else:
        await backend.open()
    try:
        if readiness:
            if isinstance(backend, MigratesAtStart) and backend.auto_migrate:
                await backend.migrate()
            await backend.check_readiness()
            check_secrets = getattr(backend, "check_secrets", None)
            if create and check_secrets is not None:  # publishing never mixes in another key
                await check_secrets()
        yield backend
    finally:
        await backend.close()


def on_backend(container: Any, action: Any, *, readiness: bool = True, create: bool = False,
               read_only: bool = False) -> Any:
    """Open the profile's backend, ``await action(backend)``, close it; return the result.

    ``create=True`` only for publishing (and ``db migrate``): every other command never creates
    or migrates a store.
    """

    async def body() -> Any:
        async with opened_backend(container, readiness=readiness, create=create,
                                  read_only=read_only) as backend:
            return await action(backend)

    return asyncio.run(body())


def limited(method: Any, limit: int | None, *args: Any) -> Any:
    """``await``-able ``method(*args, limit=limit)``; a reader without ``limit`` is sliced here."""
    import inspect

    if limit is None:
        return method(*args)
    if "limit" in inspect.signature(method).parameters:
        return method(*args, limit=limit)

    async def sliced() -> list[Any]:
        return list(await method(*args))[:limit]

    return sliced()


def execution_of(backend: Any) -> Any:
    """The backend's :class:`~qinglong.contracts.execution.ExecutionStore`, or None when its
    Runs are not executed by this host (not an
    :class:`~qinglong.contracts.capabilities.ExecutingBackend`: the cluster's workers are remote)."""
    return backend.execution() if isinstance(backend, ExecutingBackend) else None


def need_execution(backend: Any, container: Any, command: str) -> Any:
    """The execution store, or a UserError saying the profile does not run Runs here."""
    from qinglong.contracts.errors import UserError

    store = execution_of(backend)
    if store is None:
        raise UserError(f"`{command}` needs a profile that runs Runs locally (edge or standalone); the "
                        f"{container.loaded().profile.name} profile's store does not execute them here")
    return store


def run_control_of(backend: Any) -> Any:
    """The backend's :class:`~qinglong.contracts.execution.RunControl` (Runs executed elsewhere,
    such as by the cluster's remote workers, read and cancelled from here), or None when it is
    not a :class:`~qinglong.contracts.capabilities.RemoteExecutionBackend`."""
    return backend.run_control() if isinstance(backend, RemoteExecutionBackend) else None


def runs_of(backend: Any) -> Any:
    """What reads the backend's Runs (:func:`qinglong.contracts.capabilities.runs_of`, which the
    status page uses too)."""
    from qinglong.contracts.capabilities import runs_of as of

    return of(backend)


def need_runs(backend: Any, container: Any, command: str) -> Any:
    """:func:`runs_of`, or a UserError saying the profile's store does not record how Runs ran."""
    from qinglong.contracts.errors import UserError

    found = runs_of(backend)
    if found is None:
        raise UserError(f"`{command}` needs a profile whose store records how Runs ran; the "
                        f"{container.loaded().profile.name} profile's store does not")
    return found
