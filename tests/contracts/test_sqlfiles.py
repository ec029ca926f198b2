"""The one SQL loader: every shipped named block is documented, unique and found by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import qinglong
from qinglong.contracts.errors import PackagingError
from qinglong.contracts.sqlfiles import SqlFiles, load_blocks, parse_blocks

PACKAGE_ROOT = Path(qinglong.__file__).parent
#: Every folder of named blocks the package ships (migration folders hold scripts, not blocks).
SQL_FOLDERS = sorted(p for p in PACKAGE_ROOT.rglob("sql") if p.is_dir() and any(p.glob("*.sql")))


def _package_of(folder: Path) -> str:
    return ".".join(("qinglong", *folder.parent.relative_to(PACKAGE_ROOT).parts))


def test_both_backends_ship_named_sql_blocks():
    """Without this the shipped-file checks below could pass by finding no file at all."""
    assert {_package_of(f) for f in SQL_FOLDERS} >= {
        "qinglong.plugins.edge_sqlite", "qinglong.plugins.cluster_postgres"}


@pytest.mark.parametrize("path", [p for f in SQL_FOLDERS for p in sorted(f.glob("*.sql"))],
                         ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_shipped_sql_block_says_what_it_does(path):
    """A block without its description line is SQL a reviewer must reverse-engineer; the loader
    refuses it, so a shipped one would fail the plugin at its first query."""
    blocks = parse_blocks(path.read_text("utf-8"), path.name)
    assert blocks, f"{path} holds no named block"
    for block in blocks.values():
        assert block.description, block.name
        assert block.sql and not block.sql.lstrip().startswith("--"), block.name


@pytest.mark.parametrize("folder", SQL_FOLDERS, ids=lambda f: f.parent.name)
def test_every_block_the_code_names_is_shipped(folder):
    """A lookup of a misspelled block would fail only when that code path first runs, perhaps in
    the middle of a round."""
    package = _package_of(folder)
    shipped = set(load_blocks(package))
    named = set()
    for source in folder.parent.glob("*.py"):
        named |= set(re.findall(r"\b(?:q|query)\(\s*\"([a-z_][a-z0-9_]*)\"", source.read_text("utf-8")))
    assert named, package
    assert named <= shipped, sorted(named - shipped)


@pytest.mark.parametrize(("text", "words"), [
    ("-- name: x\nSELECT 1\n", "needs a comment line saying what it does"),
    ("-- name: x\n\n-- late description\nSELECT 1\n", "needs a comment line"),
    ("-- name: x\n-- \nSELECT 1\n", "needs a comment line"),
    ("-- name: x\n-- One row.\nSELECT 1;\n-- name: x\n-- Again.\nSELECT 2;\n", "defined twice"),
    ("-- name: x\n-- Nothing follows.\n", "is empty"),
    ("SELECT 0;\n-- name: x\n-- One row.\nSELECT 1;\n", "outside any named block"),
    ("-- name: Bad-Name\n-- One row.\nSELECT 1;\n", "must be lower case"),
], ids=["no-description", "blank-before-description", "empty-description", "duplicate", "empty",
        "stray-sql", "bad-name"])
def test_malformed_sql_file_is_refused_naming_file_and_block(text, words):
    """An undocumented, duplicated, empty or stray block would be loaded under the wrong name, or
    silently never run; each is a packaging error naming the file."""
    with pytest.raises(PackagingError, match=words) as refused:
        parse_blocks(text, "demo/sql/x.sql")
    assert "demo/sql/x.sql" in str(refused.value)


def test_statement_drops_comments_and_trailing_semicolon():
    """A comment mentioning a placeholder would otherwise reach the driver as a parameter."""
    blocks = parse_blocks("-- File header.\n\n-- name: one\n-- Uses %(limit)s rows.\n"
                          "SELECT 1\n  -- inside, %(x)s\nFROM t;\n", "f.sql")
    assert blocks["one"].sql == "SELECT 1\nFROM t"
    assert blocks["one"].description == "Uses %(limit)s rows."


def test_unknown_block_name_is_a_packaging_error_naming_it():
    """A KeyError without the name (or a different error type per backend) hides which lookup broke."""
    with pytest.raises(PackagingError, match="no_such_block.*edge_sqlite/sql"):
        SqlFiles("qinglong.plugins.edge_sqlite").query("no_such_block")
    with pytest.raises(PackagingError, match="no_such_block.*cluster_postgres/sql"):
        SqlFiles("qinglong.plugins.cluster_postgres").query("no_such_block")
