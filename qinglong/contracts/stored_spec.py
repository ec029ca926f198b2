"""Whether a stored execution spec can be run by a cluster worker, and how its Runs route to a
worker's claim: the rules the cluster's ``qinglong._spec_problem`` and ``qinglong._claim_routing``
apply in SQL (a test holds each pair equal).

The spec is key ``execution`` of a task revision's pinned ``remote_worker`` execution revision:
the normalised spec (:func:`~qinglong.contracts.execution.spec_to_payload`, every default written
out), JSON ``null`` when the task has no command, or absent when the revision predates it. No
default lives in SQL, so every key the worker functions read must be there with its JSON type.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from .execution import RetryPolicy
from .reasons import reason

#: Stands for SQL NULL: the revision has no ``execution`` key at all.
MISSING = object()

#: Concurrency modes a stored spec may name.
_MODES = ("allow", "forbid", "replace", "queue")


def _json_type(value: Any) -> str | None:
    """``jsonb_typeof`` of a decoded JSON value (None for an absent key)."""
    if value is MISSING:
        return None
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _get(value: Any, key: str) -> Any:
    """``value -> key``: the member of an object, else absent."""
    return value.get(key, MISSING) if isinstance(value, dict) else MISSING


def stored_spec_problem(spec: Any) -> str | None:
    """Why ``spec`` (decoded JSON, or :data:`MISSING`) cannot be run, or None when it can."""
    if spec is MISSING:
        return reason("spec_missing")
    if spec is None:
        return reason("spec_no_command")
    concurrency, retry = _get(spec, "concurrency"), _get(spec, "retry")
    mode = _get(concurrency, "mode")
    required = {"command": "array", "timeout_ms": "number", "log_limit_bytes": "number",
                "idempotent": "boolean"}
    required_retry = {"max_attempts": "number", "initial_backoff_ms": "number",
                      "max_backoff_ms": "number", "jitter": "number", "on_timeout": "boolean"}
    optional = ((_get(concurrency, "max_running"), "number"), (_get(retry, "exit_codes"), "array"),
                (_get(spec, "labels"), "array"))
    if (_json_type(spec) != "object"
            or any(_json_type(_get(spec, k)) != t for k, t in required.items())
            or not isinstance(mode, str) or mode not in _MODES
            or any(_json_type(_get(retry, k)) != t for k, t in required_retry.items())
            # an absent optional key is fine; JSON null means "none"
            or any(v is not MISSING and _json_type(v) not in (t, "null") for v, t in optional)):
        return reason("spec_invalid")
    return None


def stored_retry_policy(spec: Any) -> tuple[RetryPolicy, bool]:
    """``(retry policy, idempotent)`` of a stored spec as the cluster reads it: a spec with a
    problem has no policy to read and is never retried (one attempt, not idempotent)."""
    if stored_spec_problem(spec) is not None:
        return RetryPolicy(max_attempts=1), False
    retry = spec["retry"]
    codes = retry.get("exit_codes")
    return RetryPolicy(max_attempts=int(retry["max_attempts"]),
                       initial_backoff_ms=retry["initial_backoff_ms"],
                       max_backoff_ms=retry["max_backoff_ms"], jitter=float(retry["jitter"]),
                       exit_codes=None if codes is None else tuple(codes),
                       on_timeout=retry["on_timeout"]), spec["idempotent"]


def _jsonb_text(value: Any) -> str:
    """A decoded JSON value as PostgreSQL's jsonb prints it: numbers as numeric does (no
    exponent, no negative zero), ``", "`` and ``": "`` between items, object keys shortest first."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        number = Decimal(json.dumps(value))
        return format(abs(number) if number == 0 else number, "f")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_jsonb_text(v) for v in value) + "]"
    keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_jsonb_text(value[k])}" for k in keys) + "}"


def _element_text(value: Any) -> str | None:
    """An array element as ``jsonb_array_elements_text`` gives it: a string as itself, null as
    NULL, anything else as its jsonb text."""
    if value is None or isinstance(value, str):
        return value
    return _jsonb_text(value)


def stored_claim_routing(spec: Any) -> tuple[frozenset[str | None], bool]:
    """``(required labels, start gated)`` of a stored spec: the two fields a cluster Run carries
    so a worker's claim seeks it through an index (``qinglong._claim_routing`` in SQL, held equal
    by a test). Total: a spec that cannot be read routes as gated with no labels, and the claim
    then fails it through :func:`stored_spec_problem`. Labels are a set, as the claim compares
    them by containment; a JSON null element stands as None, as SQL keeps it as NULL."""
    labels = _get(spec, "labels")
    required = frozenset(_element_text(label) for label in labels) if _json_type(labels) == "array" \
        else frozenset()
    concurrency = _get(spec, "concurrency")
    free = (_json_type(spec) == "object" and _get(concurrency, "mode") == "allow"
            and _json_type(_get(concurrency, "max_running")) != "number")
    return required, not free


__all__ = ["MISSING", "stored_claim_routing", "stored_retry_policy", "stored_spec_problem"]
