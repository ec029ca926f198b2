"""The suite's one runner of ``async def`` tests (loaded through ``pytest_plugins``), and the
self-closing ``backends`` fixture it serves.

An ``async def`` test runs on a fresh event loop. Every argument of the test that lives in that
loop is started before the test and stopped after it, in the same loop, failed test or not: a
conformance ``Harness`` (the plugin authors' kit) and a :class:`LoopResource` such as
:class:`Backends`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect

import pytest

from qinglong.testing.conformance.harness import Harness


class LoopResource:
    """Something a test argument holds that must be opened and closed in the test's own loop."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class Backends(LoopResource):
    """Backends an ``async def`` test opens; every one is closed at the end of the test, newest
    first, so a test needs no ``try``/``finally`` of its own."""

    def __init__(self) -> None:
        self._opened: list = []

    def track(self, backend):
        """Close ``backend`` (already opened, or opening itself lazily) at the end of the test."""
        self._opened.append(backend)
        return backend

    async def open(self, backend, **kwargs):
        """``await backend.open(**kwargs)`` and close it at the end of the test."""
        await backend.open(**kwargs)
        return self.track(backend)

    async def stop(self) -> None:
        while self._opened:
            await self._opened.pop().close()


@contextlib.asynccontextmanager
async def closing(backend):
    """Close ``backend`` when the block ends, failed or not: for a backend that must be closed
    before the test goes on (a reopen, a check of the file after close), or one opened where no
    fixture reaches (a helper, a synchronous test's coroutine)."""
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
def backends() -> Backends:
    """Backends closed at the end of the (``async def``) test that opened them."""
    return Backends()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    in_loop = [v for v in kwargs.values() if isinstance(v, (Harness, LoopResource))]

    async def main():
        started = []
        try:
            for resource in in_loop:
                await resource.start()
                started.append(resource)
            await pyfuncitem.obj(**kwargs)
        finally:
            for resource in reversed(started):
                await resource.stop()

    asyncio.run(main())
    return True
