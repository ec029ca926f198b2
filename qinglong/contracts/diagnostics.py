"""The low-sensitivity diagnostic channel.

Scheduler loops, lifecycle steps and plugins report problems as :class:`DiagnosticEvent` values with
a stable ``code`` and a few scalar fields. Never put DSNs, passwords or payloads in one: every text
passes through :func:`redact` before a sink sees it, as a second line of defence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

Scalar = str | int | float | bool | None

LEVELS = ("debug", "info", "warning", "error")

_URI_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]*)@")
_KV_PASSWORD = re.compile(r"(?P<key>\b(?:password|passwd|pwd|secret|token)\s*=\s*)(?P<q>['\"]?)[^\s'\"]*(?P=q)", re.I)


def redact(text: str) -> str:
    """Mask passwords in URIs (``user:***@``) and in ``password=...`` pairs of a conninfo string."""
    text = _URI_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _KV_PASSWORD.sub(lambda m: f"{m['key']}***", text)


@dataclass(frozen=True, slots=True)
class DiagnosticEvent:
    """One diagnostic: ``code`` is stable (``scheduler.round_failed``), ``message`` is for people."""

    level: str
    code: str
    message: str
    fields: Mapping[str, Scalar] = field(default_factory=dict, hash=False)

    def redacted(self) -> "DiagnosticEvent":
        """The same event with every text passed through :func:`redact`."""
        return DiagnosticEvent(
            self.level,
            self.code,
            redact(self.message),
            {k: redact(v) if isinstance(v, str) else v for k, v in self.fields.items()},
        )


@runtime_checkable
class DiagnosticSink(Protocol):
    """Receives diagnostics. Must not raise and must not block for long (called from the loop)."""

    def emit(self, event: DiagnosticEvent) -> None:
        """Record one event."""
        ...
