"""Our backends under the conformance suites: every test of this directory runs on the SQLite
backend (a real file) and on the PostgreSQL backend against real PostgreSQL 18 and 15 servers
started here.

The suites and the harness they drive are the plugin authors' kit (``qinglong.testing.conformance``:
``Harness`` says what each backend implements); this file holds our two harnesses and the
``harness`` fixture parametrised over ``sqlite``, ``pg18`` and ``pg15``. The SQLite harness moves
its injected clock; the PostgreSQL one, whose clock cannot be moved, moves every stored instant.

A server that cannot start makes the tests error out; nothing here skips.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.conformance.harnesses import (  # noqa: F401 (re-exported to the tests here)
    BACKENDS,
    CLOCK_T0,
    EDGE_T0,
    LIMITS,
    TABLES,
    BrokenOtherKindProvider,
    Clock,
    CollectingSink,
    Harness,
    OtherKindProvider,
    PostgresHarness,
    SqliteHarness,
    _db_counter,
    providers,
)
from tests.support.aio import closing
from tests.support.pg import create_database, create_roles, drop_database, start_server


@pytest.fixture(scope="session")
def servers(request):
    """Started on first use, one per build, each with the roles and a migrated template."""
    started: dict = {}

    def get(label: str):
        if label not in started:
            server = start_server(label)
            request.addfinalizer(server.destroy)
            create_roles(server)
            template = "qlc_migrated_template"
            create_database(server, template)
            harness = PostgresHarness(server, template)

            async def migrate():
                backend = harness.create_backend(CollectingSink(), providers())
                async with closing(backend):
                    await backend.migrate()

            asyncio.run(migrate())
            started[label] = (server, template)
        return started[label]

    return get


@pytest.fixture(params=BACKENDS)
def harness(request, tmp_path):
    """A harness of each backend (opened in the test's own event loop by the runner below). The
    servers are asked for only by the PostgreSQL items, which alone are marked ``postgres``."""
    if request.param == "sqlite":
        yield SqliteHarness(tmp_path / "qinglong.db")
        return
    server, template = request.getfixturevalue("servers")(request.param)
    name = f"qlc_{os.getpid()}_{next(_db_counter)}"
    create_database(server, name, template=template)
    yield PostgresHarness(server, name)
    drop_database(server, name)
