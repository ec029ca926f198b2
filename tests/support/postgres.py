"""PostgreSQL fixtures for every test folder (loaded through ``pytest_plugins``): a server of
each build (``pg18``, ``pg15``) with the four roles, a migrated template per server, and a fresh
database per test.

Every test that takes ``cluster`` or ``fresh_db`` runs once per server build; a test that needs
one build parametrizes ``pg_server`` indirectly. A server that cannot start makes the tests error
out; nothing here skips.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests.support.cluster import ClusterDb, migrate
from tests.support.pg import create_database, create_roles, drop_database, start_server

_db_counter = itertools.count(1)


def fresh_name(prefix: str = "ql") -> str:
    """A database name no other test process of this run uses."""
    return f"{prefix}_{os.getpid()}_{next(_db_counter)}"


@pytest.fixture(scope="session")
def _pg_servers():
    """The servers this test process started, by build: kept here rather than in ``pg_server``
    itself, because pytest tears a parametrized session fixture down whenever the next test
    wants its other param, which with the suite's ordering (each file's pg18 tests, then its
    pg15 ones) initialized, migrated and deleted both servers again for every file."""
    servers: dict[str, tuple] = {}
    yield servers
    for server, _template in servers.values():
        server.destroy()


@pytest.fixture(scope="session", params=["pg18", "pg15"])
def pg_server(request, _pg_servers):
    """A running server of each build, with the four roles; stopped at the end of the session."""
    if request.param not in _pg_servers:
        server = start_server(request.param)
        _pg_servers[request.param] = (server, None)
        create_roles(server)
    return _pg_servers[request.param][0]


@pytest.fixture
def fresh_db(pg_server):
    """A new, empty database owned by the owner role (not migrated)."""
    name = fresh_name()
    create_database(pg_server, name)
    db = ClusterDb(pg_server, name)
    yield db
    drop_database(pg_server, name)


@pytest.fixture(scope="session")
def migrated_template(pg_server, _pg_servers):
    """A database migrated once per server, copied for each test (CREATE DATABASE ... TEMPLATE):
    every test still starts from a freshly migrated schema, without paying for the migration."""
    name = "ql_migrated_template"
    server, template = _pg_servers[pg_server.label]
    if template is None:
        create_database(pg_server, name)
        migrate(ClusterDb(pg_server, name))
        _pg_servers[pg_server.label] = (server, name)
    return name


@pytest.fixture
def cluster(pg_server, migrated_template):
    """A fresh database with every migration applied as the owner role."""
    name = fresh_name()
    create_database(pg_server, name, template=migrated_template)
    db = ClusterDb(pg_server, name)
    yield db
    drop_database(pg_server, name)
