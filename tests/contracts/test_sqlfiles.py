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


FRAGMENTS = ("-- fragment: same\n-- The shared check.\na = 1\n  AND b = 2\n"
             "-- name: first\n-- Uses it.\nSELECT 1 WHERE {{same}}\n"
             "-- name: second\n-- Uses it too.\nSELECT 2\nWHERE x AND ({{same}})\n")


def test_a_fragment_is_the_same_text_in_every_statement_that_includes_it():
    """A check written twice can drift (one copy fixed, the other not); written once as a
    fragment, every statement that includes it must run exactly its text."""
    from qinglong.contracts.sqlfiles import expand_fragments

    blocks = expand_fragments(parse_blocks(FRAGMENTS, "f.sql"))
    # continuation lines keep their indentation, under the column of the placeholder
    assert blocks["first"].sql == "SELECT 1 WHERE a = 1\n" + " " * len("SELECT 1 WHERE ") + "  AND b = 2"
    assert blocks["second"].sql == "SELECT 2\nWHERE x AND (a = 1\n" + " " * len("WHERE x AND (") + "  AND b = 2)"
    assert blocks["same"].fragment and not blocks["first"].fragment


@pytest.mark.parametrize(("text", "words"), [
    ("-- name: q\n-- Uses a fragment.\nSELECT {{nothing}}\n", "no fragment of that name"),
    ("-- name: p\n-- One row.\nSELECT 1\n-- name: q\n-- Includes a statement.\nSELECT {{p}}\n",
     "no fragment of that name"),
    ("-- fragment: a\n-- A.\n{{b}}\n-- fragment: b\n-- B.\n{{a}}\n-- name: q\n-- Q.\nSELECT {{a}}\n",
     "includes itself"),
    ("-- fragment: spare\n-- Never used.\ntrue\n-- name: q\n-- Q.\nSELECT 1\n", "included by no block"),
], ids=["unknown", "statement-not-fragment", "cycle", "unused"])
def test_a_fragment_fault_is_refused_naming_file_and_block(text, words):
    """An include that names nothing would reach the server as '{{x}}' text; a cycle would never
    end; an unused fragment is a check that guards nothing."""
    from qinglong.contracts.sqlfiles import expand_fragments

    with pytest.raises(PackagingError, match=words) as refused:
        expand_fragments(parse_blocks(text, "demo/sql/x.sql"))
    assert "demo/sql/x.sql" in str(refused.value)


def test_a_fragment_is_never_handed_out_as_a_statement():
    """A fragment alone is a piece of a WHERE clause: running it would be a syntax error at best."""
    sql = SqlFiles("qinglong.plugins.cluster_postgres")
    fragments = [name for name, block in sql.blocks().items() if block.fragment]
    assert fragments
    for name in fragments:
        assert name not in sql.names()
        with pytest.raises(PackagingError, match="is a fragment"):
            sql.query(name)
