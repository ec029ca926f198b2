"""What the configuration-as-code tests share besides their fixtures."""

from __future__ import annotations

import sqlite3
from pathlib import Path

FIXTURES = Path(__file__).with_name("fixtures")


def store_rows(db: Path) -> dict[str, list]:
    """Every row of the tables publishing writes, for before/after comparisons."""
    conn = sqlite3.connect(db)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
                for table in ("projects", "tasks", "task_revisions", "triggers", "trigger_schedules",
                              "trigger_revision_marks")}
    finally:
        conn.close()
