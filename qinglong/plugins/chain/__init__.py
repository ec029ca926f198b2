"""The built-in event trigger kinds: ``after`` (Runs started by the end of another task's Run)
and ``at_start`` (a Run at each start of the scheduler), with the ``at_start`` event source.

Registered by entry point ``chain`` like any other plugin. The provider only validates and
describes specs (``{"task": "<upstream task>", "on": "success" | "failure" | "any"}``); it has
no clock (no occurrence in time), and the stores admit the downstream Run in the transaction that
records the upstream outcome (:mod:`qinglong.contracts.chain`).
"""

from __future__ import annotations

from typing import Any, Mapping

from qinglong.contracts.chain import AFTER_KIND, CHAIN_ON
from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.errors import TriggerSpecError
from qinglong.contracts.event_sources import AT_START_KIND, EventSourceContext
from qinglong.contracts.hookspecs import ComponentPhase, hookimpl
from qinglong.contracts.providers import TriggerCliOption, TriggerCliOptions


class AfterProvider:
    kind = AFTER_KIND

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(spec, Mapping):
            raise TriggerSpecError(self.kind, "spec", "expected a table with task and on")
        unknown = sorted(str(k) for k in spec if k not in ("task", "on"))
        if unknown:
            raise TriggerSpecError(self.kind, unknown[0], "unknown key (expected task, on)")
        task = spec.get("task")
        if not isinstance(task, str) or not task:
            raise TriggerSpecError(self.kind, "task", "expected the upstream task's id")
        on = spec.get("on", "success")
        if on not in CHAIN_ON:
            raise TriggerSpecError(self.kind, "on", f"expected one of {', '.join(CHAIN_ON)}")
        return {"task": task, "on": on}

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        return None  # no occurrence in time: the upstream Run's end admits

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        return None

    def describe(self, spec: Mapping[str, Any]) -> str:
        return f"after {spec['task']} on {spec['on']}"


def _to_spec(given: Mapping[str, str], current: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = dict(current or {})
    if "after" in given:
        spec["task"] = given["after"]
    if "on" in given:
        spec["on"] = given["on"]
    return spec


AFTER_CLI_OPTIONS = TriggerCliOptions(
    AFTER_KIND,
    (TriggerCliOption("--after", "start a Run when a Run of this task (same project) ends", "TASK"),
     TriggerCliOption("--on", "with --after: success (default), failure or any", "OUTCOME")),
    _to_spec, "--after TASK [--on success|failure|any]")


@hookimpl
def qinglong_trigger_providers():
    """Offer the ``after`` trigger kind."""
    return [AfterProvider(), AtStartProvider()]


@hookimpl
def qinglong_trigger_cli_options():
    """``trigger add --after TASK [--on success|failure|any]``."""
    return [AFTER_CLI_OPTIONS]


class AtStartProvider:
    """``at_start``: no occurrence in time; the ``at_start`` event source admits one Run per
    start identity (``@reboot`` of an imported crontab becomes this kind)."""

    kind = AT_START_KIND

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(spec, Mapping) or spec:
            raise TriggerSpecError(self.kind, "spec", "expected an empty table ({})")
        return {}

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        return None

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        return None

    def describe(self, spec: Mapping[str, Any]) -> str:
        return "at each start of the scheduler"


class AtStartSource:
    """The built-in event source of ``at_start`` triggers: at its start (after the scheduler's),
    one occurrence per enabled ``at_start`` trigger, whose event id is the start's identity."""

    name = "at-start"
    phase = ComponentPhase.STACK

    def __init__(self, context: EventSourceContext) -> None:
        self._context = context
        self.admitted: list[str] = []

    async def start(self) -> None:
        for head in await self._context.triggers(AT_START_KIND):
            result = await self._context.admit(AT_START_KIND, head.trigger_id,
                                               self._context.start_id, None)
            if result.created:
                self.admitted.append(result.run_id)
            self._context.diagnostics.emit(DiagnosticEvent(
                "info", "events.at_start",
                "an at_start trigger was admitted for this start" if result.created else
                "an at_start trigger had its Run for this start already",
                {"trigger_id": head.trigger_id, "run_id": result.run_id,
                 "start_id": self._context.start_id}))

    async def stop(self) -> None:
        return None


@hookimpl
def qinglong_event_sources(context: EventSourceContext):
    """The ``at_start`` source."""
    return [AtStartSource(context)]
