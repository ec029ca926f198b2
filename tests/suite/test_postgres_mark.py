"""``-m "not postgres"`` selects no test that talks to PostgreSQL: the mark is set by the suite
(tests/support/markers.py), not remembered by each author."""

from __future__ import annotations

import pytest

from suite_helpers import collect
from tests.support import pg
from tests.support.markers import PG_BUILDS

#: Fixtures of the suite's conftests that start, or stand on, a PostgreSQL server.
SERVER_FIXTURES = {"pg_server", "migrated_template", "fresh_db", "failure_server", "failure_template",
                   "failure_db", "wf_server", "wf_db", "servers"}


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    """Everything, and what ``-m "not postgres"`` selects of it, from one collection: the items
    it selected and those it left out."""
    selected = collect(tmp_path_factory.mktemp("not_pg"), "-m", "not postgres")
    return {"items": selected["items"] + selected["deselected"]}, selected


def test_not_postgres_selects_no_test_that_talks_to_postgresql(collections):
    """If a PostgreSQL test escaped the mark, ``-m "not postgres"`` (a machine without the
    servers, a quick local run) would start servers anyway or fail for want of them, and the
    mark would lie about what the selection covers."""
    everything, selected = collections
    leaked = [i["nodeid"] for i in selected["items"]
              if SERVER_FIXTURES & set(i["fixtures"])
              or any(v.strip("'") in PG_BUILDS for v in i["params"].values())]
    assert not leaked, leaked
    marked = {i["nodeid"] for i in everything["items"] if "postgres" in i["marks"]}
    assert {i["nodeid"] for i in selected["items"]} == {
        i["nodeid"] for i in everything["items"]} - marked
    # the marking reaches what no author marked: the PostgreSQL side of a test parametrized over
    # every backend, a module's own server fixture, and a test body that starts a server
    assert any(n.startswith("tests/conformance/") and "pg15" in n for n in marked), marked
    assert any(n.startswith("tests/host/test_http_cluster.py::") for n in marked)
    assert any(n.startswith("tests/host/test_status_command.py::test_a_cluster_store_reads_attention")
               for n in marked), "a test whose body starts its server"
    assert not any(n.startswith("tests/conformance/") and "[sqlite" in n and "pg1" not in n
                   for n in marked)


def test_a_test_the_marking_missed_cannot_start_a_server():
    """A test that starts a server through a helper the marking cannot see must fail at once
    with what to do, not run under ``-m "not postgres"`` as if it needed no server."""
    start = pg.start_server  # called through a name the source scan does not look for
    with pytest.raises(RuntimeError, match="is not marked postgres"):
        start("pg18")
