"""The low-sensitivity diagnostic channel.

Scheduler loops, lifecycle steps and plugins report problems as :class:`DiagnosticEvent` values with
a stable ``code`` and a few scalar fields. Never put DSNs, passwords or payloads in one: every text
passes through :func:`redact` before a sink sees it, as a second line of defence.
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import Mapping, Protocol, runtime_checkable

from .frozen import record

Scalar = str | int | float | bool | None

LEVELS = ("debug", "info", "warning", "error")

_URI_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]*)@")
_KV_PASSWORD = re.compile(r"(?P<key>\b(?:password|passwd|pwd|secret|token)\s*=\s*)(?P<q>['\"]?)[^\s'\"]*(?P=q)", re.I)


def redact(text: str) -> str:
    """Mask passwords in URIs (``user:***@``) and in ``password=...`` pairs of a conninfo string."""
    text = _URI_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _KV_PASSWORD.sub(lambda m: f"{m['key']}***", text)


class RoundEvent:
    """Diagnostic codes a scheduler round emits, the same on every backend.

    A backend may add codes of its own (``cluster_postgres.round_timed_out``) for what only it can
    meet; a condition the contract knows is reported under one of these, so an alert written for
    one backend holds on every other.
    """

    UNKNOWN_TRIGGER_KIND = "scheduler.unknown_trigger_kind"
    """A stored trigger's kind has no loaded provider: it is not decided (never fires) here.
    Fields: ``kind``; the backend may add where it was seen (``trigger_id``) or how many."""

    DECIDE_FAILED = "scheduler.decide_failed"
    """A provider raised while deciding one trigger; that trigger is set aside, the round goes on."""

    COMMIT_FAILED = "scheduler.commit_failed"
    """The store refused one occurrence's commit (a constraint); nothing of it was written."""

    TASK_CHANGED = "scheduler.task_changed"
    """The trigger's task was republished between the decision and its commit; nothing was
    written and the occurrence is decided again (against the new task revision)."""


@record
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
