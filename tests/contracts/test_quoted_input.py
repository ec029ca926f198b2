"""How every error quotes a value the user gave (``qinglong.contracts.errors.quoted``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qinglong.contracts.errors import QUOTE_LIMIT, quoted


@given(st.text(max_size=400))
def test_a_quoted_value_is_whole_when_short_and_cut_with_its_length_when_long(text):
    """A refusal that echoed its input whole printed a page for a 5,000-character argument; one
    that cut it without saying so would show a different value than the one given."""
    shown = quoted(text)
    if len(text) <= QUOTE_LIMIT:
        assert shown == repr(text)
    else:
        assert shown == f"{text[:QUOTE_LIMIT]!r}... ({len(text)} characters)"
        assert len(shown) <= 10 * QUOTE_LIMIT + 40  # 80 characters, each at most \U000xxxxx in repr


def test_a_value_that_is_not_text_is_cut_the_same_way():
    assert quoted(42) == "42"
    assert quoted(["x"] * 100).endswith("... (500 characters)")
