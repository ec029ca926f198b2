"""Named SQL blocks in a package's ``.sql`` files: the one loader every backend plugin uses.

A file holds blocks. Each block starts with a marker line ``-- name: <block_name>``, then at least
one comment line saying what the block does, then the statement, which runs until the next marker::

    -- name: delete_schedule
    -- Remove a trigger's cursor.
    DELETE FROM schedules WHERE trigger_id = :trigger_id;

Comments before the first marker describe the file. Keeping statements in files lets a reader
review the SQL as SQL, and lets the two backends' files be compared side by side.

A part that several statements must repeat exactly is written once, as a fragment: a block whose
marker is ``-- fragment: <name>`` (described like any block), which statements (and other
fragments) of the same package include as ``{{name}}``. The statement handed out holds the
fragment's text in place of each ``{{name}}``, its continuation lines indented to the
placeholder's column, so every copy is the same text. A fragment is never handed out alone.

Every fault of the files themselves (a block without its description line, an empty block, a
name defined twice in one package, text outside any block, an unknown, unused or circular
fragment) and a lookup of a name no file defines raise
:class:`~qinglong.contracts.errors.PackagingError`, naming the file and the block.

The statement handed out has its whole-line comments and a trailing ``;`` removed, so a comment
can never carry a placeholder into the driver.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Mapping

from .frozen import record
from .errors import PackagingError

_MARKER = re.compile(r"^--\s*(name|fragment):(.*)$")
_INCLUDE = re.compile(r"\{\{([a-z_][a-z0-9_]*)\}\}")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@record
class SqlBlock:
    """One named block: where it came from, what it does, and its statement."""

    name: str
    origin: str
    description: str
    sql: str
    #: A fragment: included by other blocks as ``{{name}}``, never handed out alone.
    fragment: bool = False


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("--")


def parse_blocks(text: str, origin: str = "<text>") -> dict[str, SqlBlock]:
    """Split ``text`` into ``{name: block}``; refuse what :mod:`this module <.sqlfiles>` refuses."""
    blocks: dict[str, SqlBlock] = {}
    name: str | None = None
    fragment = False
    lines: list[str] = []

    def flush() -> None:
        if name is None:
            stray = [line for line in lines if line.strip() and not _is_comment(line)]
            if stray:
                raise PackagingError(f"{origin}: SQL outside any named block: {stray[0].strip()!r}")
            return
        description = []
        for line in lines:
            if not _is_comment(line):
                break
            description.append(line.lstrip()[2:].strip())
        if not " ".join(description).strip():
            raise PackagingError(
                f"{origin}: SQL block {name!r} needs a comment line saying what it does "
                "right after its '-- name:' line")
        body = "\n".join(line for line in lines if not _is_comment(line)).strip().rstrip(";").strip()
        if not body:
            raise PackagingError(f"{origin}: SQL block {name!r} is empty")
        if name in blocks:
            raise PackagingError(f"{origin}: SQL block {name!r} is defined twice")
        blocks[name] = SqlBlock(name, origin, " ".join(description).strip(), body, fragment)

    for line in text.splitlines():
        marker = _MARKER.match(line)
        if marker:
            flush()
            fragment = marker[1] == "fragment"
            name = marker[2].strip()
            if not _NAME.match(name):
                raise PackagingError(
                    f"{origin}: SQL block name {name!r} must be lower case letters, digits and '_'")
            lines = []
        else:
            lines.append(line)
    flush()
    return blocks


@lru_cache(maxsize=None)
def load_blocks(package: str, folder: str = "sql") -> Mapping[str, SqlBlock]:
    """Every named block of every ``<package>/<folder>/*.sql`` resource; names are unique across
    the files of one package. Read once per process."""
    found: dict[str, SqlBlock] = {}
    directory = resources.files(package).joinpath(folder)
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        origin = f"{package.rsplit('.', 1)[-1]}/{folder}/{entry.name}"
        for name, block in parse_blocks(entry.read_text("utf-8"), origin).items():
            if name in found:
                raise PackagingError(
                    f"SQL block {name!r} is defined in both {found[name].origin} and {origin}")
            found[name] = block
    return expand_fragments(found)


def expand_fragments(blocks: Mapping[str, SqlBlock]) -> dict[str, SqlBlock]:
    """``blocks`` with every ``{{fragment}}`` replaced by that fragment's (expanded) text."""
    used: set[str] = set()

    def expand(block: SqlBlock, trail: tuple[str, ...]) -> str:
        def include(match: re.Match) -> str:
            name = match[1]
            target = blocks.get(name)
            if target is None or not target.fragment:
                raise PackagingError(f"{block.origin}: SQL block {block.name!r} includes "
                                     f"{{{{{name}}}}}, but no fragment of that name is defined")
            if name in trail:
                raise PackagingError(f"{block.origin}: SQL fragment {name!r} includes itself "
                                     f"(through {' -> '.join(trail + (name,))})")
            used.add(name)
            column = match.start() - (match.string.rfind("\n", 0, match.start()) + 1)
            return expand(target, trail + (name,)).replace("\n", "\n" + " " * column)

        return _INCLUDE.sub(include, block.sql)

    expanded = {name: SqlBlock(b.name, b.origin, b.description, expand(b, (name,)), b.fragment)
                for name, b in blocks.items()}
    unused = sorted(name for name, b in blocks.items() if b.fragment and name not in used)
    if unused:
        raise PackagingError(f"{blocks[unused[0]].origin}: SQL fragment {unused[0]!r} is included "
                             "by no block")
    return expanded


class SqlFiles:
    """The named blocks of one package, looked up by name: ``SqlFiles(__package__).query(name)``.

    Nothing is read until the first lookup, so importing a plugin costs no file access.
    """

    def __init__(self, package: str, folder: str = "sql") -> None:
        self.package = package
        self.folder = folder

    def blocks(self) -> Mapping[str, SqlBlock]:
        """Every block of the package by name."""
        return load_blocks(self.package, self.folder)

    def query(self, name: str) -> str:
        """The statement of block ``name``; :class:`PackagingError` names an unknown block."""
        block = self.blocks().get(name)
        if block is not None and block.fragment:
            raise PackagingError(
                f"SQL block {name!r} of {self.package.rsplit('.', 1)[-1]}/{self.folder}/*.sql is a "
                "fragment: it is included by other blocks as {{" + name + "}}, never run alone")
        if block is None:
            raise PackagingError(
                f"no SQL block named {name!r} in {self.package.rsplit('.', 1)[-1]}/{self.folder}/*.sql")
        return block.sql

    def names(self) -> list[str]:
        """Every statement's name (fragments left out), sorted."""
        return sorted(name for name, block in self.blocks().items() if not block.fragment)
