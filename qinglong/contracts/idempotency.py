"""Idempotency keys of admitted occurrences. Unique in every store."""

from __future__ import annotations


def idempotency_key(trigger_id: str, trigger_revision: int, scheduled_for_ms: int, kind: str) -> str:
    """``ql3:<kind>:v1:<triggerId>:<triggerRevision>:<scheduledForMs>``.

    ``kind`` is the trigger's kind as stored with its revision (``ql3:cron:v1:...`` for a cron
    trigger, as the decision record fixes it); there is no default, so a store cannot give a
    plugin's kind the key of another. The same occurrence of the same revision always gets the same
    key, so a store's UNIQUE constraint turns any second admission of it into an error instead of a
    duplicate Run.
    """
    if not isinstance(scheduled_for_ms, int) or isinstance(scheduled_for_ms, bool):
        raise TypeError("scheduled_for_ms must be an integer epoch millisecond value")
    # A bool or float revision would print as 'True' or '1.0' and never collide with the key of
    # revision 1, so the store's UNIQUE constraint could no longer catch a duplicate Run.
    if not isinstance(trigger_revision, int) or isinstance(trigger_revision, bool):
        raise TypeError("trigger_revision must be an integer")
    if trigger_revision < 1:
        raise ValueError("trigger_revision starts at 1")
    if not isinstance(kind, str) or not kind:
        raise TypeError("kind must be the trigger kind, a non-empty string")
    if ":" in kind:
        raise ValueError("a trigger kind cannot contain ':'")
    return f"ql3:{kind}:v1:{trigger_id}:{trigger_revision}:{scheduled_for_ms}"
