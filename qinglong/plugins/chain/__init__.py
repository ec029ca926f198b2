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
from qinglong.contracts.errors import TriggerSpecError, quoted
from qinglong.contracts.event_sources import AT_START_KIND, EventSourceContext
from qinglong.contracts.hookspecs import ComponentPhase, hookimpl
from qinglong.contracts.hooks import (DEFAULT_PER_MINUTE, DEFAULT_WINDOW_S, HOOK_KIND, MAX_SECRET_CHARS,
                                      MIN_SECRET_CHARS)
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
    return [AfterProvider(), AtStartProvider(), HookProvider()]


@hookimpl
def qinglong_trigger_cli_options():
    """``trigger add --after TASK [--on success|failure|any]``."""
    return [AFTER_CLI_OPTIONS, HOOK_CLI_OPTIONS]


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


class HookProvider:
    """``hook``: an incoming webhook (``POST /api/v1/hooks/{project}/{trigger}``) admits a Run
    per delivery; no occurrence in time. Spec: ``secret`` (the HMAC key, at least
    ``MIN_SECRET_CHARS`` characters), ``window_s`` (10-3600) and ``per_minute`` (1-10000)."""

    kind = HOOK_KIND

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(spec, Mapping):
            raise TriggerSpecError(self.kind, "spec", "expected a table with secret")
        unknown = sorted(str(k) for k in spec if k not in ("secret", "window_s", "per_minute"))
        if unknown:
            raise TriggerSpecError(self.kind, unknown[0], "unknown key (expected secret, window_s, per_minute)")
        secret = spec.get("secret")
        if (not isinstance(secret, str) or not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS
                or not secret.isascii() or not secret.isprintable()):
            # never the value: it is a secret
            raise TriggerSpecError(self.kind, "secret", f"expected {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} "
                                   "printable ASCII characters")
        out: dict[str, Any] = {"secret": secret}
        for key, default, low, high in (("window_s", DEFAULT_WINDOW_S, 10, 3600),
                                        ("per_minute", DEFAULT_PER_MINUTE, 1, 10_000)):
            value = spec.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise TriggerSpecError(self.kind, key, f"expected an integer from {low} to {high}")
            out[key] = value
        return out

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        return None  # deliveries admit, not a clock

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        return None

    def describe(self, spec: Mapping[str, Any]) -> str:
        return f"on each signed delivery (window {spec['window_s']}s, {spec['per_minute']}/min)"


def _hook_spec(given: Mapping[str, str], current: Mapping[str, Any] | None) -> Mapping[str, Any]:
    import os

    from qinglong.contracts.cli import whole_number
    from qinglong.contracts.errors import UserError

    spec = dict(current or {})
    if "hook_secret_env" in given:
        name = given["hook_secret_env"]
        value = os.environ.get(name)
        if value is None:
            raise UserError(f"--hook-secret-env: the environment has no variable {name!r}")
        spec["secret"] = value
    for key in ("window_s", "per_minute"):
        text = given.get("hook_" + key)
        if text is not None:
            value = whole_number(text)
            if value is None:
                raise UserError(f"--hook-{key.replace('_', '-')}: expected a whole number, got {quoted(text)}")
            spec[key] = value
    return spec


HOOK_CLI_OPTIONS = TriggerCliOptions(
    HOOK_KIND,
    (TriggerCliOption("--hook-secret-env", "an incoming webhook: its HMAC secret from this variable", "NAME"),
     TriggerCliOption("--hook-window-s", "with --hook-secret-env: timestamp window (default 300)", "SECONDS"),
     TriggerCliOption("--hook-per-minute", "with --hook-secret-env: deliveries per minute", "N")),
    _hook_spec, "--hook-secret-env NAME")
