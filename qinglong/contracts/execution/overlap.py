"""Overlap: may a Run of a task start while others of the same task are active
(:func:`overlap_decision`, by the task's concurrency policy)."""

from __future__ import annotations

import enum
from typing import Sequence

from ..frozen import record
from ..reasons import reason
from .spec import ConcurrencyMode, ConcurrencyPolicy


@record
class ActiveRun:
    """A Run of the same task that holds a process (dispatching or running)."""

    run_id: str
    scheduled_for_ms: int
    cancel_requested: bool = False


class OverlapAction(str, enum.Enum):
    START = "start"
    WAIT = "wait"
    SKIP = "skip"        # end the candidate cancelled, with ``reason``
    REPLACE = "replace"  # request cancel of ``cancel`` and wait until they are gone


@record
class OverlapDecision:
    action: OverlapAction
    reason: str = ""
    cancel: tuple[str, ...] = ()


def overlap_decision(policy: ConcurrencyPolicy, active: Sequence[ActiveRun],
                     waiting_ahead: int = 0, *, slot_free: bool = True,
                     max_queued: int | None = None) -> OverlapDecision:
    """Whether a dispatchable Run may start now.

    ``active``: the task's Runs holding a process. ``waiting_ahead``: dispatchable Runs of the
    same task scheduled before this one that have not started (``queue`` keeps that order; the
    other modes consider only what is active, since the dispatcher already visits in order).
    The global ``max_running`` is the dispatcher's, not the policy's: ``slot_free`` False makes a
    Run that could start wait. ``max_queued``: a Run that would wait behind that many waiting
    Runs of its task is skipped instead (the task's backlog is bounded; the oldest stay). The
    reason names at most ``max_queued`` waiting Runs, so a caller may stop counting there.
    """
    decision = _by_mode(policy, active, waiting_ahead)
    if decision.action is OverlapAction.START and not slot_free:
        decision = OverlapDecision(OverlapAction.WAIT)
    if (decision.action is OverlapAction.WAIT and max_queued is not None
            and waiting_ahead >= max_queued):
        return OverlapDecision(OverlapAction.SKIP, reason("overlap_queue_full",
                                                          waiting=min(waiting_ahead, max_queued),
                                                          max_queued=max_queued))
    return decision


def decided_beside_pending_starts(policy: ConcurrencyPolicy, decision: OverlapDecision) -> bool:
    """Whether ``decision``, taken while starts of the same task were still under way and counted
    as active, may be acted on before they are known. Only ``allow``'s START and WAIT: a start
    counted that then fails can only have turned a START into a WAIT (the Run waits a pass, the
    task's ``max_running`` holds), and an ``allow`` START does not depend on the Runs waiting.
    Any other answer (a SKIP of a full queue, ``forbid``'s SKIP, ``replace``'s cancel, ``queue``'s
    order) could be caused by a start that never happened: decide again once the starts are known."""
    return policy.mode is ConcurrencyMode.ALLOW and decision.action in (OverlapAction.START, OverlapAction.WAIT)


def _by_mode(policy: ConcurrencyPolicy, active: Sequence[ActiveRun], waiting_ahead: int) -> OverlapDecision:
    mode = policy.mode
    if mode is ConcurrencyMode.ALLOW:
        if policy.max_running is not None and len(active) >= policy.max_running:
            return OverlapDecision(OverlapAction.WAIT, reason(
                "overlap_max_running", active=len(active), max_running=policy.max_running))
        return OverlapDecision(OverlapAction.START)
    if mode is ConcurrencyMode.FORBID:
        if active:
            return OverlapDecision(OverlapAction.SKIP, reason("overlap_forbid", run_id=active[0].run_id))
        return OverlapDecision(OverlapAction.START)
    if mode is ConcurrencyMode.REPLACE:
        if waiting_ahead:
            # an older Run of this task is visited first: it replaces what runs, this one it
            return OverlapDecision(OverlapAction.WAIT, reason("overlap_replace_older"))
        to_cancel = tuple(a.run_id for a in active if not a.cancel_requested)
        if to_cancel:
            return OverlapDecision(OverlapAction.REPLACE, reason("overlap_replacing"), to_cancel)
        if active:
            # every cancel is requested already: start only once the replaced runs are gone
            return OverlapDecision(OverlapAction.WAIT, reason("overlap_replace_waiting",
                                                              run_id=active[0].run_id))
        return OverlapDecision(OverlapAction.START)
    # QUEUE
    if active or waiting_ahead:
        return OverlapDecision(OverlapAction.WAIT, reason("overlap_queue"))
    return OverlapDecision(OverlapAction.START)


__all__ = ["ActiveRun", "OverlapAction", "OverlapDecision", "decided_beside_pending_starts", "overlap_decision"]
