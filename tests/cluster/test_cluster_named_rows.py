"""Rows the cluster store reads by column name: every such statement names each column once."""

from __future__ import annotations

import re

import psycopg
import pytest

from qinglong.plugins.cluster_postgres import roles
from qinglong.plugins.cluster_postgres.sql import query

#: The blocks whose rows are read by column name (claim, recovery, publisher, admission, expiry).
NAMED_ROW_BLOCKS = ["claim_due_schedules", "scan_in_flight_runs", "enabled_trigger_kinds",
                    "insert_project", "lock_task_head", "lock_trigger_head",
                    "next_trigger_revision", "admit_page", "control_expired_attempts"]

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _positional(sql: str) -> str:
    """``%(name)s`` placeholders as ``$n`` in order of first appearance, as the server takes them."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return _PLACEHOLDER.sub(number, sql)


def _result_columns(cluster, sql: str) -> list[str]:
    """The result column names of ``sql`` as the server describes it (prepared, never run)."""
    with psycopg.connect(cluster.dsn("qinglong_owner"), autocommit=True) as conn:
        pgconn = conn.pgconn
        prepared = pgconn.prepare(b"named_rows_probe", _positional(sql).encode())
        assert prepared.status == psycopg.pq.ExecStatus.COMMAND_OK, prepared.error_message
        described = pgconn.describe_prepared(b"named_rows_probe")
        assert described.status == psycopg.pq.ExecStatus.COMMAND_OK, described.error_message
        return [described.fname(i).decode() for i in range(described.nfields)]


@pytest.mark.parametrize("name", NAMED_ROW_BLOCKS)
def test_rows_read_by_name_have_one_column_per_name(cluster, name):
    """Two result columns of one name would make a by-name read (dict_row, or the admission's
    names from the cursor description) silently keep only the last: an admission could read the
    wrong flag and admit, or refuse, an occurrence on another check's answer, and a trigger head
    could carry another column's value."""
    columns = _result_columns(cluster, query(name))
    assert columns, f"{name} returns no columns"
    assert len(columns) == len(set(columns)), columns
    assert all(re.fullmatch(r"[a-z_]+", c) for c in columns), columns


def test_role_attributes_read_by_name_have_one_column_per_name(cluster):
    """The readiness check reads each role's attributes by name: a duplicated or unnamed column
    would let a SUPERUSER or BYPASSRLS role pass as harmless."""
    columns = _result_columns(cluster, roles._ROLES_SQL)
    assert len(columns) == len(set(columns)), columns
    assert all(re.fullmatch(r"[a-z_]+", c) for c in columns), columns
