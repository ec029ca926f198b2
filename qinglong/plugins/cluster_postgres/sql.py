"""This plugin's named SQL blocks, loaded from ``sql/*.sql`` by the contracts' one loader.

Blocks use psycopg's ``%(name)s`` placeholders and always qualify tables with the ``qinglong``
schema, so no ``search_path`` is trusted. See :mod:`qinglong.contracts.sqlfiles` for the file
format and what it refuses.
"""

from __future__ import annotations

from qinglong.contracts.sqlfiles import SqlFiles

SQL = SqlFiles(__package__)


def query(name: str) -> str:
    """The statement of the block ``name``; an unknown name is a :class:`PackagingError`."""
    return SQL.query(name)


def names() -> list[str]:
    """Every block name, sorted."""
    return SQL.names()
