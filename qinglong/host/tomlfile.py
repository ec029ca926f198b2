"""Reading TOML text that a user wrote (a settings file, an apply file)."""

from __future__ import annotations

import re
import tomllib
from typing import Any

#: Python's int() refuses more digits than this (sys.get_int_max_str_digits), and tomllib lets
#: that ValueError out as it is, without a line.
_LONG_NUMBER = re.compile(r"[0-9_]{4300,}")


def loads(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``; a number too long for ``int`` is a :class:`tomllib.TOMLDecodeError`
    naming its line, like every other mistake in the text."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:
        found = _LONG_NUMBER.search(text)
        if found is None:
            raise
        line = text.count("\n", 0, found.start()) + 1
        column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
        raise tomllib.TOMLDecodeError(
            f"a number of more than 4300 digits (at line {line}, column {column})") from None
