"""Fixtures of the configuration-as-code tests: the CLI in a subprocess, in a fresh directory
whose ``qinglong.db`` is the edge profile's store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.config.config_helpers import FIXTURES, store_rows  # noqa: F401 (their old home)
from tests.host.host_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]


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
