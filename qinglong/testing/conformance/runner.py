"""The pytest side of the conformance suites: ``async def`` tests run on a fresh event loop with
the ``harness`` fixture opened before and closed after, within a bound.

Bring the hook into the ``conftest.py`` of the directory that runs the suites::

    from qinglong.testing.conformance.runner import pytest_pyfunc_call  # noqa: F401
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

#: How long one conformance test may take, harness start and stop excluded, in seconds.
TEST_BOUND_S = 120


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run ``async def`` tests on a fresh event loop, with the harness opened and closed in it."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}

    async def main():
        h = kwargs.get("harness")
        if h is not None:
            await h.start()
        try:
            await asyncio.wait_for(pyfuncitem.obj(**kwargs), TEST_BOUND_S)
        finally:
            if h is not None:
                await h.stop()

    asyncio.run(main())
    return True
