"""docs/cluster.md says what the code does: the bootstrap SQL is the code's own."""

from __future__ import annotations

import re
from pathlib import Path

from qinglong.plugins.cluster_postgres.roles import bootstrap_statements
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def test_documented_bootstrap_sql_is_exactly_bootstrap_statements():
    """An operator following a hand-kept copy of the set-up SQL (one that left CREATE on the public
    schema to everyone, as PostgreSQL before 15 does) gets a database readiness refuses."""
    text = DOC.read_text("utf-8")
    section = text[text.index("## One-time database set-up"):]
    block = re.search(r"```sql\n(.*?)```", section, re.S)[1]
    expected = bootstrap_statements(ClusterPostgresSettings().roles(), "qinglong")
    assert block.splitlines() == expected
    assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC;" in expected
