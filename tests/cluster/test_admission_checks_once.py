"""The admission's per-row checks (schedule state, whole claim fence, decision) are written once,
as fragments of ``sql/admission.sql``, and every place that applies them runs the same text: the
UPDATE that advances a row located by its ctid, the one that advances it by key, and the read
that says why a row did not advance."""

from __future__ import annotations

from importlib import resources

from qinglong.contracts.sqlfiles import parse_blocks
from qinglong.plugins.cluster_postgres.sql import SQL, query

CHECKS = ("schedule_ok", "fence_ok", "decision_ok")


def test_each_admission_check_is_written_once_and_applied_by_all_three_of_its_users():
    """A check fixed in one copy and not in another would let one path advance a cursor (and
    admit a Run) under a fence another path refuses, or report a refusal for the wrong reason."""
    text = resources.files("qinglong.plugins.cluster_postgres").joinpath(
        "sql/admission.sql").read_text("utf-8")
    raw = parse_blocks(text, "admission.sql")
    blocks = SQL.blocks()
    statement = query("admit_page")
    for name in CHECKS:
        assert raw[name].fragment
        # written once: the hand-written file holds the check's first line in its fragment only
        first = raw[name].sql.splitlines()[0]
        assert text.count(first) == 1, name
        # applied three times, each copy the fragment's text line for line
        lines = [line.strip() for line in blocks[name].sql.splitlines()]
        assert statement.count(lines[0]) == 3, name
        for line in lines:
            assert statement.count(line) >= 3, (name, line)
    assert raw["admit_page"].sql.count("{{advance_checks}}") == 2
    assert raw["admit_page"].sql.count("{{advance_cursor}}") == 2
    assert "{{" not in statement


def test_the_single_occurrence_admission_is_not_shipped():
    """The backend admits pages only: a second, per-occurrence statement would be one more copy
    of every check to keep equal."""
    assert "admit_occurrence" not in SQL.names()
