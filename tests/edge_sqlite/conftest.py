"""Fixtures of the edge_sqlite tests (their ``async def`` tests run through tests/support/aio.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from edge_helpers import Clock


@pytest.fixture
def clock() -> Clock:
    """The injected clock, starting at :data:`T0`."""
    return Clock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A database path in a fresh directory."""
    return tmp_path / "qinglong.db"


@pytest.fixture
def small_filesystem():
    """A real 4 MiB tmpfs, for the disk-full tests (mounting needs root, which CI has);
    unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    mountpoint = Path(tempfile.mkdtemp(prefix="qinglong-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        mountpoint.rmdir()
