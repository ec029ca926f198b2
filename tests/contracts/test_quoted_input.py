"""How every error quotes a value the user gave (``qinglong.contracts.errors.quoted``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qinglong.contracts.errors import PATH_QUOTE_LIMIT, QUOTE_LIMIT, quoted, quoted_path


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


@given(st.lists(st.text(alphabet="abc-_.", min_size=1, max_size=60), min_size=1, max_size=12))
def test_a_quoted_path_always_shows_the_files_own_name(parts):
    """An error naming a file must say which file: a path cut after its first 80 characters (a
    deep directory, a test's temporary path) hid the very name that was wrong."""
    path = "/" + "/".join(parts)
    shown = quoted_path(path)
    if len(path) <= PATH_QUOTE_LIMIT:
        assert shown == repr(path)
    else:
        assert shown.endswith(f"{path[-100:]!r} ({len(path)} characters)") and shown.startswith(repr(path[:100]))
    assert parts[-1][-100:] in shown
