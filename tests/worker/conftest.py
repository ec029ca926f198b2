"""Fixtures of the worker tests: the cluster tests' real PostgreSQL servers (18 and 15) and a
freshly migrated database per test. Nothing here skips."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repository is used from the tree
    sys.path.insert(0, str(ROOT))

from tests.cluster.conftest import cluster, migrated_template, pg_server  # noqa: E402,F401
