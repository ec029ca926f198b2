"""This plugin's named SQL blocks, loaded from ``sql/*.sql`` by the contracts' one loader.

Blocks use sqlite3's ``:name`` placeholders; see :mod:`qinglong.contracts.sqlfiles` for the file
format and what it refuses.
"""

from __future__ import annotations

from typing import Mapping

from qinglong.contracts.sqlfiles import SqlFiles

SQL = SqlFiles(__package__)


def queries() -> Mapping[str, str]:
    """Every named block of this package by name."""
    return {name: block.sql for name, block in SQL.blocks().items()}


def query(name: str) -> str:
    """The SQL of block ``name``."""
    return SQL.query(name)
