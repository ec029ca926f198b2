"""The built-in ``after`` trigger kind: Runs started by the end of another task's Run.

Registered by entry point ``chain`` like any other plugin. The provider only validates and
describes specs (``{"task": "<upstream task>", "on": "success" | "failure" | "any"}``); it has
no clock (no occurrence in time), and the stores admit the downstream Run in the transaction that
records the upstream outcome (:mod:`qinglong.contracts.chain`).
"""

from __future__ import annotations

from typing import Any, Mapping

from qinglong.contracts.chain import AFTER_KIND, CHAIN_ON
from qinglong.contracts.errors import TriggerSpecError
from qinglong.contracts.hookspecs import hookimpl
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
    return [AfterProvider()]


@hookimpl
def qinglong_trigger_cli_options():
    """``trigger add --after TASK [--on success|failure|any]``."""
    return [AFTER_CLI_OPTIONS]
