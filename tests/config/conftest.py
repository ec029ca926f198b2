"""Fixtures of the configuration-as-code tests: the CLI in a subprocess, in a fresh directory
whose ``qinglong.db`` is the edge profile's store."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.host.host_helpers import run_cli  # noqa: E402

FIXTURES = Path(__file__).with_name("fixtures")


@pytest.fixture
def cli(tmp_path: Path):
    """``cli(*args, env=None, stdin=None)``: ``python -m qinglong ARGS`` in ``tmp_path/work``."""
    workdir = tmp_path / "work"
    workdir.mkdir()

    def call(*args: str, env: dict[str, str] | None = None, extra_env: dict[str, str] | None = None):
        if env is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
            env["PYTHONPATH"] = str(ROOT)
        env = {**env, **(extra_env or {})}
        return run_cli(list(args), cwd=workdir, env=env)

    call.cwd = workdir  # type: ignore[attr-defined]
    return call


def store_rows(db: Path) -> dict[str, list]:
    """Every row of the tables publishing writes, for before/after comparisons."""
    conn = sqlite3.connect(db)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
                for table in ("projects", "tasks", "task_revisions", "triggers", "trigger_schedules",
                              "trigger_revision_marks")}
    finally:
        conn.close()
