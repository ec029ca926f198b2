"""Marks the suite sets on its own: the hang bound of long tests, and ``postgres`` on every test
that talks to a PostgreSQL server.

A hang fails through pytest-timeout (``timeout`` in pyproject.toml) with every thread's stack;
``soak`` and ``slow`` tests run for minutes by design, so they get :data:`LONG_TIMEOUT_S` unless
they name their own ``@pytest.mark.timeout``.
"""

from __future__ import annotations

import pytest

#: The hang bound of a ``soak`` or ``slow`` test (the full soak forms run for about 10 minutes on
#: an idle machine; a loaded 2-core machine is several times slower).
LONG_TIMEOUT_S = 3600


def _bound_long_tests(items) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("soak") is not None or item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))


# ---- postgres: every item that talks to a PostgreSQL server the suite starts ---------------------

#: The server builds a test may be parametrized over (tests/support/pg.py ``server_build``).
PG_BUILDS = frozenset({"pg18", "pg15"})

#: What a function's source calls when it starts a server of its own.
_STARTS_A_SERVER = ("start_server(", "PgServer(")

#: Set in the environment while a test without the ``postgres`` mark runs: starting a server
#: then fails (tests/support/pg.py), so a test the marking missed cannot hide under ``-m "not postgres"``.
UNMARKED_ENV = "QINGLONG_TEST_NOT_MARKED_POSTGRES"

_source_cache: dict = {}


def _starts_a_server(func) -> bool:
    func = getattr(func, "__wrapped__", func)
    if func not in _source_cache:
        import inspect

        try:
            source = inspect.getsource(func)
        except (OSError, TypeError):
            source = ""
        _source_cache[func] = any(call in source for call in _STARTS_A_SERVER)
    return _source_cache[func]


def uses_postgres(item) -> bool:
    """Whether ``item`` talks to PostgreSQL: it is parametrized over a server build, a fixture
    of its closure starts a server, or its own body does."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(isinstance(v, str) and v in PG_BUILDS
                                    for v in callspec.params.values()):
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in item.fixturenames:
            defs = info.name2fixturedefs.get(name)
            if defs and _starts_a_server(defs[-1].func):
                return True
    return _starts_a_server(getattr(item, "function", None))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Runs before ``-m`` deselects (tryfirst), so ``-m "not postgres"`` sees the marks."""
    for item in items:
        if item.get_closest_marker("postgres") is None and uses_postgres(item):
            item.add_marker(pytest.mark.postgres)
    _bound_long_tests(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import os

    if item.get_closest_marker("postgres") is None:
        os.environ[UNMARKED_ENV] = item.nodeid
    try:
        yield
    finally:
        os.environ.pop(UNMARKED_ENV, None)
