"""Fixtures of the host tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from host_helpers import SitePath, run_cli


@pytest.fixture
def site(tmp_path: Path) -> SitePath:
    """A fresh folder for throwaway plugin distributions."""
    return SitePath(tmp_path / "site")


@pytest.fixture
def cli(tmp_path: Path):
    """``cli(*args, env=None)`` runs the CLI in a fresh working directory."""
    workdir = tmp_path / "work"
    workdir.mkdir()

    def call(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
        return run_cli(list(args), cwd=workdir, env=env, timeout=timeout)

    def python(code: str, timeout: float = 120):
        """``python -c CODE`` in the same directory and environment as ``qinglong``."""
        return run_cli([], cwd=workdir, timeout=timeout, module_args=["-c", code])

    call.cwd = workdir  # type: ignore[attr-defined]
    call.python = python  # type: ignore[attr-defined]
    return call
