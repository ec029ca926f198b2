"""Named SQL blocks, loaded by name from ``sql/*.sql``.

A block starts with ``-- name: <block_name>``, followed by at least one comment line saying what
it does, then the statement. Names are unique across files. Blocks use psycopg's ``%(name)s``
placeholders and always qualify tables with the ``qinglong`` schema, so no ``search_path`` is
trusted.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.M)


def parse_blocks(text: str, origin: str = "<text>") -> dict[str, str]:
    """Split ``text`` into ``{name: statement}``; refuse duplicates and undocumented blocks."""
    blocks: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end():end].strip("\n")
        lines = body.splitlines()
        if not lines or not lines[0].lstrip().startswith("--"):
            raise ValueError(f"{origin}: block {match[1]!r} needs a comment line saying what it does")
        name = match[1]
        if name in blocks:
            raise ValueError(f"{origin}: block {name!r} defined twice")
        blocks[name] = body.strip()
    return blocks


@lru_cache(maxsize=1)
def _all_blocks() -> dict[str, str]:
    blocks: dict[str, str] = {}
    folder = resources.files(__package__).joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, body in parse_blocks(entry.read_text("utf-8"), entry.name).items():
            if name in blocks:
                raise ValueError(f"SQL block {name!r} is defined in two files")
            blocks[name] = body
    return blocks


def query(name: str) -> str:
    """The statement of the block ``name``; KeyError names the unknown block."""
    try:
        return _all_blocks()[name]
    except KeyError:
        raise KeyError(f"no SQL block named {name!r} in cluster_postgres/sql/*.sql") from None


def names() -> list[str]:
    """Every block name, sorted (for tests)."""
    return sorted(_all_blocks())
