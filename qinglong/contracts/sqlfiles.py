"""Named SQL blocks in a package's ``.sql`` files: the one loader every backend plugin uses.

A file holds blocks. Each block starts with a marker line ``-- name: <block_name>``, then at least
one comment line saying what the block does, then the statement, which runs until the next marker::

    -- name: delete_schedule
    -- Remove a trigger's cursor.
    DELETE FROM schedules WHERE trigger_id = :trigger_id;

Comments before the first marker describe the file. Keeping statements in files lets a reader
review the SQL as SQL, and lets the two backends' files be compared side by side. Every fault of
the files themselves (a block without its description line, an empty block, a name defined twice
in one package, text outside any block) and a lookup of a name no file defines raise
:class:`~qinglong.contracts.errors.PackagingError`, naming the file and the block.

The statement handed out has its whole-line comments and a trailing ``;`` removed, so a comment
can never carry a placeholder into the driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Mapping

from .errors import PackagingError

_MARKER = re.compile(r"^--\s*name:(.*)$")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class SqlBlock:
    """One named block: where it came from, what it does, and its statement."""

    name: str
    origin: str
    description: str
    sql: str


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("--")


def parse_blocks(text: str, origin: str = "<text>") -> dict[str, SqlBlock]:
    """Split ``text`` into ``{name: block}``; refuse what :mod:`this module <.sqlfiles>` refuses."""
    blocks: dict[str, SqlBlock] = {}
    name: str | None = None
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
        blocks[name] = SqlBlock(name, origin, " ".join(description).strip(), body)

    for line in text.splitlines():
        marker = _MARKER.match(line)
        if marker:
            flush()
            name = marker[1].strip()
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
    return found


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
        if block is None:
            raise PackagingError(
                f"no SQL block named {name!r} in {self.package.rsplit('.', 1)[-1]}/{self.folder}/*.sql")
        return block.sql

    def names(self) -> list[str]:
        """Every block name, sorted."""
        return sorted(self.blocks())
