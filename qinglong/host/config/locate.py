"""Where each key of a TOML document is written: the line a refusal names.

``tomllib`` parses but keeps no positions, so this scanner reads the same text once more and
records, for every table header and every ``key = value``, the path of the key and its line.
It understands what can hide a ``key =`` from a line-based reading: basic and literal strings,
multi-line strings, arrays and inline tables spanning lines, comments. Keys inside an inline
table are recorded with the line they are on. A path that was not recorded is found through its
nearest recorded ancestor, so every refusal names a line.
"""

from __future__ import annotations

from typing import Sequence

Path = tuple[str, ...]


class KeyLines:
    """The line (1-based) of each key path of one document."""

    def __init__(self, lines: dict[Path, int]) -> None:
        self._lines = lines

    def line_of(self, path: Sequence[str]) -> int:
        """The line of ``path``, else of its nearest recorded ancestor, else 1."""
        key = tuple(str(p) for p in path)
        while key:
            if key in self._lines:
                return self._lines[key]
            key = key[:-1]
        return 1


def _read_key(text: str, i: int) -> tuple[list[str], int]:
    """A (dotted) key starting at ``i``; returns its parts and the index after it."""
    parts: list[str] = []
    n = len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] in "\"'":
            quote = text[i]
            j = i + 1
            buf = []
            while j < n and text[j] != quote and text[j] != "\n":
                if quote == '"' and text[j] == "\\" and j + 1 < n:
                    buf.append(text[j:j + 2].encode("utf-8").decode("unicode_escape", "replace"))
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            parts.append("".join(buf))
            i = j + 1
        else:
            j = i
            while j < n and (text[j].isalnum() or text[j] in "-_"):
                j += 1
            parts.append(text[i:j])
            i = j
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == ".":
            i += 1
            continue
        return parts, i


def locate_keys(text: str) -> KeyLines:
    """Scan a TOML document (already parsed without error) for the line of every key."""
    lines: dict[Path, int] = {}
    n = len(text)
    i = 0
    line = 1
    table: Path = ()
    # each open inline table or array: (kind, path of the value)
    stack: list[tuple[str, Path]] = []
    expect_key = True   # at the start of a line (top level) or after '{' / ',' in an inline table
    pending: Path | None = None  # the key whose value comes next

    def skip_string(pos: int) -> tuple[int, int]:
        """Skip the string starting at ``pos``; return the index after it and lines crossed."""
        crossed = 0
        if text.startswith('"""', pos) or text.startswith("'''", pos):
            delim = text[pos:pos + 3]
            end = pos + 3
            while True:
                k = text.find(delim, end)
                if k < 0:
                    return n, text.count("\n", pos)
                if delim == '"""':
                    backslashes = 0
                    b = k - 1
                    while b >= pos + 3 and text[b] == "\\":
                        backslashes += 1
                        b -= 1
                    if backslashes % 2:
                        end = k + 1
                        continue
                while text.startswith(delim[0], k + 3):  # up to two quotes may end the content
                    k += 1
                return k + 3, text.count("\n", pos, k + 3)
        quote = text[pos]
        j = pos + 1
        while j < n and text[j] != quote and text[j] != "\n":
            if quote == '"' and text[j] == "\\":
                j += 1
            j += 1
        return j + 1, crossed

    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
            if not stack:
                expect_key = True
            continue
        if ch in " \t\r":
            i += 1
            continue
        if ch == "#":
            k = text.find("\n", i)
            i = n if k < 0 else k
            continue
        if not stack and expect_key and ch == "[":
            double = text.startswith("[[", i)
            parts, j = _read_key(text, i + (2 if double else 1))
            table = tuple(parts)
            lines.setdefault(table, line)
            k = text.find("\n", j)
            i = n if k < 0 else k
            continue
        if expect_key and (ch.isalnum() or ch in "-_\"'"):
            parts, j = _read_key(text, i)
            base = stack[-1][1] if stack else table
            path = base + tuple(parts)
            lines.setdefault(path, line)
            pending = path
            i = j
            if i < n and text[i] == "=":
                i += 1
            expect_key = False
            continue
        if ch in "\"'":
            i, crossed = skip_string(i)
            line += crossed
            continue
        if ch == "{":
            stack.append(("table", pending or ()))
            expect_key = True
            i += 1
            continue
        if ch == "[":
            stack.append(("array", pending or ()))
            expect_key = False
            i += 1
            continue
        if ch in "}]":
            if stack:
                stack.pop()
            expect_key = False
            i += 1
            continue
        if ch == ",":
            expect_key = bool(stack) and stack[-1][0] == "table"
            i += 1
            continue
        i += 1
    return KeyLines(lines)
