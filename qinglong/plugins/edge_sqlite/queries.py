"""Named SQL blocks loaded from ``sql/*.sql``.

Each block starts with ``-- name: <name>`` followed by a comment line saying what it does; the SQL
runs until the next ``-- name:`` line. Keeping statements in files lets a reader review the SQL as
SQL, and lets the PostgreSQL backend's files be compared side by side.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Mapping

SQL_DIR = Path(__file__).with_name("sql")
_MARKER = "-- name:"


def parse_blocks(text: str, source: str) -> dict[str, str]:
    """Split ``text`` into ``{name: sql}``; a duplicate or empty block is a packaging error."""
    blocks: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if name is None:
            return
        body = "\n".join(line for line in lines if not line.lstrip().startswith("--")).strip()
        if not body:
            raise RuntimeError(f"{source}: SQL block {name!r} is empty")
        if name in blocks:
            raise RuntimeError(f"{source}: SQL block {name!r} is defined twice")
        blocks[name] = body.rstrip(";")

    for line in text.splitlines():
        if line.startswith(_MARKER):
            flush()
            name = line[len(_MARKER):].strip()
            lines = []
        else:
            lines.append(line)
    flush()
    return blocks


@lru_cache(maxsize=1)
def queries() -> Mapping[str, str]:
    """Every named block of every ``sql/*.sql`` file of this package."""
    found: dict[str, str] = {}
    for path in sorted(SQL_DIR.glob("*.sql")):
        for name, sql in parse_blocks(path.read_text(encoding="utf-8"), path.name).items():
            if name in found:
                raise RuntimeError(f"{path.name}: SQL block {name!r} is defined in two files")
            found[name] = sql
    return found


def q(name: str) -> str:
    """The SQL of block ``name``."""
    return queries()[name]
