"""Fixtures of the worker failure tests: a PostgreSQL server of each build (18 and 15; a test
that needs one build only parametrizes ``wf_server`` indirectly), a freshly migrated database per
test and a :class:`~tests.worker_failure.harness.Cluster` around it. Nothing here skips."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest


from tests.support.cluster import ClusterDb, migrate
from tests.support.pg import create_database, create_roles, drop_database, start_server
from tests.worker_failure.harness import Cluster

_counter = itertools.count(1)


@pytest.fixture(scope="session")
def _wf_servers():
    """The servers of this test process by build, kept for the session: pytest tears the
    parametrized ``wf_server`` down each time the next test wants the other build, which (each
    file's pg18 tests run before its pg15 ones) started both servers again for every file."""
    servers: dict = {}
    yield servers
    for server in servers.values():
        server.destroy()


@pytest.fixture(scope="session", params=["pg18", "pg15"])
def wf_server(request, _wf_servers):
    """A running server of each build with the four roles and a migrated template database."""
    if request.param not in _wf_servers:
        server = start_server(request.param)
        _wf_servers[request.param] = server
        create_roles(server)
        create_database(server, "ql_wf_template")
        migrate(ClusterDb(server, "ql_wf_template"))
    return _wf_servers[request.param]


@pytest.fixture
def wf_db(wf_server):
    name = f"qlw_{os.getpid()}_{next(_counter)}"
    create_database(wf_server, name, template="ql_wf_template")
    db = ClusterDb(wf_server, name)
    yield db
    drop_database(wf_server, name)


@pytest.fixture
def cluster(wf_db, tmp_path):
    """Replicas, workers, proxies and the job watcher of one test; all stopped at its end."""
    c = Cluster(wf_db, tmp_path)
    yield c
    c.close()
