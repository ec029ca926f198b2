"""The shape of an identifier, in a module of its own so that every program (the worker too)
checks names by the one rule without importing the store's contracts."""

from __future__ import annotations


def is_identifier(value: object) -> bool:
    """1-64 ASCII letters, digits, ``-``, ``_`` and ``.``, starting with a letter or digit (so
    ``-x`` is never read as an option, and ``.``/``..`` never as a path); no ``:``."""
    return (isinstance(value, str) and 0 < len(value) <= 64 and value.isascii()
            and all(c.isalnum() or c in "-_." for c in value) and value[0].isalnum())


__all__ = ["is_identifier"]
