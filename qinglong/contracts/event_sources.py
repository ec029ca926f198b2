"""Event sources: Runs admitted by something that happened (a start of the scheduler, a file, a
message), through one contract function.

A source is a lifecycle component (hook ``qinglong_event_sources``) that watches what it watches
and calls :attr:`EventSourceContext.admit` with ``(kind, trigger id, event id, payload)`` for each
occurrence. The store admits at most one Run per key :func:`occurrence_key`, in one transaction
that also checks, as cron admission does, that the trigger is still there, of that kind, enabled,
in an active project, with a live task (its current revision is pinned): the same event twice is
one Run, and an event for a trigger that was disabled or changed kind admits nothing.

The built-in ``at_start`` source admits each enabled ``at_start`` trigger once per start identity
(:func:`start_identity`). ``after`` triggers are admitted by the stores themselves in the
transaction that ends the upstream Run (:mod:`.chain`), under the same key shape rules.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence, runtime_checkable

from .frozen import record

AT_START_KIND = "at_start"
#: The longest event id a source may give.
MAX_EVENT_ID_CHARS = 200
#: The largest payload an occurrence may carry (canonical JSON).
MAX_OCCURRENCE_PAYLOAD_BYTES = 65_536


def occurrence_key(kind: str, trigger_id: str, event_id: str) -> str:
    """``ql3:<kind>:v1:<trigger>:<event id>``: one Run per trigger and event."""
    check_event_id(event_id)
    if not kind or ":" in kind:
        raise ValueError("a trigger kind is non-empty and has no ':'")
    return f"ql3:{kind}:v1:{trigger_id}:{event_id}"


def check_event_id(event_id: Any) -> str:
    """An event id: 1 to :data:`MAX_EVENT_ID_CHARS` printable characters."""
    from .errors import UserError

    if (not isinstance(event_id, str) or not 0 < len(event_id) <= MAX_EVENT_ID_CHARS
            or not event_id.isprintable()):
        raise UserError(f"event id: expected 1 to {MAX_EVENT_ID_CHARS} printable characters")
    return event_id


def payload_json(payload: Mapping[str, Any] | None) -> str | None:
    """The payload as canonical JSON (bounded), or None."""
    from .errors import UserError

    if payload is None:
        return None
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        raise UserError("occurrence payload: expected a JSON object") from None
    if not isinstance(payload, Mapping) or len(text.encode()) > MAX_OCCURRENCE_PAYLOAD_BYTES:
        raise UserError(f"occurrence payload: expected a JSON object of at most "
                        f"{MAX_OCCURRENCE_PAYLOAD_BYTES} bytes")
    return text


@record
class AdmitResult:
    """What one admission did: ``run_id`` of the Run of this key (new or earlier) and whether
    this call created it; None and the reason when the trigger admits nothing."""

    run_id: str | None
    created: bool
    refused: str | None = None


@runtime_checkable
class OccurrenceAdmission(Protocol):
    """The store side (a backend's ``occurrences()``)."""

    async def admit_occurrence(self, kind: str, trigger_id: str, event_id: str,
                               payload: Mapping[str, Any] | None, now_ms: int) -> AdmitResult:
        """Admit one Run of the trigger for this event, in one transaction (see the module)."""
        ...


@record(slots=False)
class EventSourceContext:
    """What ``qinglong_event_sources`` receives.

    ``admit(kind, trigger_id, event_id, payload)`` is the one way a source admits a Run;
    ``triggers(kind)`` lists the enabled triggers of a kind (their heads); ``start_id`` is this
    scheduler start's identity (:func:`start_identity`)."""

    settings: Any
    diagnostics: Any
    clock_ms: Callable[[], int]
    start_id: str
    admit: Callable[[str, str, str, Mapping[str, Any] | None], Awaitable[AdmitResult]]
    triggers: Callable[[str], Awaitable[Sequence[Any]]]


def start_identity(owner: str, boot_id: str | None) -> str:
    """A start of the scheduler as an ``at_start`` event id: the scheduler's owner name and the
    machine's boot id. A stable owner (edge, standalone, ``[scheduler] owner``) fires each
    ``at_start`` trigger once per boot, whatever restarts of ``qinglong run`` follow (as cron's
    ``@reboot``); a generated owner (a cluster replica) once per replica start."""
    ident = f"{owner}@{boot_id or 'unknown-boot'}"
    return ident[:MAX_EVENT_ID_CHARS]


__all__ = ["AT_START_KIND", "MAX_EVENT_ID_CHARS", "MAX_OCCURRENCE_PAYLOAD_BYTES", "occurrence_key",
           "check_event_id", "payload_json", "AdmitResult", "OccurrenceAdmission",
           "EventSourceContext", "start_identity"]
