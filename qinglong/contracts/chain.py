"""Chained Runs: a trigger of kind ``after`` admits a Run of its task when a Run of another task
of its project ends with a matching outcome.

The downstream Run is admitted by the store **in the transaction that records the upstream
outcome** (both stores: the SQLite execution store's end of a Run, the cluster's row trigger on
``runs``), keyed :func:`chain_idempotency_key`, so a crash between the two can neither lose nor
double it. A chain that would loop (a task after itself, or a cycle through others) is refused
when the trigger is published (:func:`chain_cycle`).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

AFTER_KIND = "after"
#: ``on``: which upstream outcomes start the downstream Run.
CHAIN_ON = ("success", "failure", "any")
#: The states each ``on`` matches (``failure``: the Run did not succeed and was not cancelled).
CHAIN_STATES: Mapping[str, frozenset[str]] = {
    "success": frozenset({"succeeded"}),
    "failure": frozenset({"failed", "timed_out", "lost"}),
    "any": frozenset({"succeeded", "failed", "timed_out", "cancelled", "lost"}),
}


def chain_idempotency_key(upstream_run_id: str, trigger_id: str) -> str:
    """``ql3:chain:v1:<upstream run>:<trigger>``: one downstream Run per upstream Run and trigger."""
    if not upstream_run_id or not trigger_id:
        raise ValueError("a chain key needs the upstream run and the trigger")
    return f"ql3:chain:v1:{upstream_run_id}:{trigger_id}"


def chain_fires(on: str, state: str) -> bool:
    """Whether an upstream Run that ended in ``state`` starts a trigger with ``on``."""
    return state in CHAIN_STATES.get(on, frozenset())


def chain_cycle(edges: Iterable[tuple[str, str]]) -> Sequence[str] | None:
    """A cycle of the chain graph (``(upstream task, downstream task)`` edges) as the tasks along
    it (first repeated last), or None. A task after itself is a cycle of one."""
    graph: dict[str, list[str]] = {}
    for up, down in edges:
        graph.setdefault(up, []).append(down)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> Sequence[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def check_no_cycle(project_id: str, trigger_id: str, edges: Iterable[tuple[str, str]]) -> None:
    """Refuse (:class:`~qinglong.contracts.errors.UserError`) a chain graph with a cycle, naming
    the trigger being published and the tasks of the cycle."""
    from .errors import UserError

    cycle = chain_cycle(edges)
    if cycle is not None:
        raise UserError(f"trigger {trigger_id!r} of project {project_id!r} would chain Runs in a "
                        f"loop: {' -> '.join(cycle)}; an 'after' trigger may not lead back to "
                        "its own task")


__all__ = ["AFTER_KIND", "CHAIN_ON", "CHAIN_STATES", "chain_idempotency_key", "chain_fires",
           "chain_cycle", "check_no_cycle"]
