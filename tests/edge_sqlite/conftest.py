"""Fixtures of the edge_sqlite tests and a runner for ``async def`` tests (no asyncio plugin needed)."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from edge_helpers import Clock


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run ``async def`` tests of this directory on a fresh event loop."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None


@pytest.fixture
def clock() -> Clock:
    """The injected clock, starting at :data:`T0`."""
    return Clock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A database path in a fresh directory."""
    return tmp_path / "qinglong.db"
