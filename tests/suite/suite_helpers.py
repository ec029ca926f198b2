"""Collecting the whole suite in a child pytest, for the tests of the suite's own rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collect(tmp_path: Path, *args: str) -> dict:
    """Collect the suite (``pytest --co`` in one process, with ``args``) and return what
    :mod:`tests.suite.collection_dump` wrote: ``timeout_ini``, the selected ``items`` and the
    ``deselected`` ones."""
    dump = tmp_path / "collection.json"
    env = {**os.environ, "QINGLONG_COLLECTION_DUMP": str(dump)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-n", "0", "-p", "no:cacheprovider",
         "-p", "tests.suite.collection_dump", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(dump.read_text())
