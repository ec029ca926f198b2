"""Rows the edge store reads by column name: every such query names each column once."""

from __future__ import annotations

import re
import sqlite3

import pytest

from qinglong.plugins.edge_sqlite import migrations
from qinglong.plugins.edge_sqlite.queries import query

#: The blocks whose rows are read by column name (scheduler page, recovery, publisher, reader).
NAMED_ROW_BLOCKS = ["claim_uninitialized_page", "claim_due_page", "in_flight_summary",
                    "in_flight_not_pristine", "in_flight_of_pin",
                    "project_by_id", "task_head", "trigger_by_id", "trigger_revision_mark",
                    "list_triggers", "list_triggers_of_project"]


@pytest.fixture
def conn(tmp_path):
    connection = sqlite3.connect(tmp_path / "rows.db", isolation_level=None)
    migrations.apply_pending(connection, migrations.load_migrations(), "rows.db", 0)
    connection.execute(query("create_held_table"))
    yield connection
    connection.close()


@pytest.mark.parametrize("name", NAMED_ROW_BLOCKS)
def test_rows_read_by_name_have_one_column_per_name(conn, name):
    """Two columns of one name (a trigger's and a task's content_digest) would make a by-name read
    return the wrong one: a Run would pin the trigger's digest as its task's."""
    sql = query(name)
    params = ({key: 0 for key in re.findall(r":([a-z_]+)", sql)} if ":" in sql
              else (0,) * sql.count("?"))
    columns = [d[0] for d in conn.execute(sql, params).description]
    assert len(columns) == len(set(columns)), columns
    assert all(re.fullmatch(r"[a-z_]+", c) for c in columns), columns
