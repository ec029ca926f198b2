"""Incoming webhook triggers (kind ``hook``): the rules shared by the kind's provider and the
API route ``POST /api/v1/hooks/{project}/{trigger}`` that receives them.

A ``hook`` trigger's spec holds its secret (``{"secret": "..."}``, at least
:data:`MIN_SECRET_CHARS` characters) and optionally ``window_s`` (how far the signed timestamp may
be from the receiver's clock) and ``per_minute`` (deliveries accepted per minute). A delivery is
signed by :mod:`.signing` (the rule the ``webhook`` notifier signs with) and names itself in
:data:`DELIVERY_HEADER`; it admits one Run keyed ``ql3:hook:v1:<trigger>:<delivery id>`` through
the event-source contract, so the same delivery twice is one Run.

Spec keys whose name ends in ``secret`` are masked wherever a trigger is shown
(:func:`masked_spec`), and sealed at rest under the control plane's key
(:func:`~qinglong.contracts.secrets.sealed_trigger_spec`): the secret is opened only to verify a
signature and never printed again.
"""

from __future__ import annotations

from typing import Any, Mapping

from .secrets import is_secret_key

HOOK_KIND = "hook"
DELIVERY_HEADER = "X-Qinglong-Delivery"
MIN_SECRET_CHARS = 32
MAX_SECRET_CHARS = 256
DEFAULT_WINDOW_S = 300
DEFAULT_PER_MINUTE = 60
#: The largest body a delivery may carry (it reaches the job).
MAX_HOOK_BODY_BYTES = 16_384
MASK = "********"


def masked_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec as shown: every key ending in ``secret`` masked."""
    return {k: (MASK if is_secret_key(k) else v) for k, v in spec.items()}


def hook_settings(spec: Mapping[str, Any]) -> tuple[str, int, int]:
    """``(secret, window_s, per_minute)`` of a validated ``hook`` spec."""
    return (str(spec["secret"]), int(spec.get("window_s", DEFAULT_WINDOW_S)),
            int(spec.get("per_minute", DEFAULT_PER_MINUTE)))


__all__ = ["HOOK_KIND", "DELIVERY_HEADER", "MIN_SECRET_CHARS", "MAX_SECRET_CHARS",
           "DEFAULT_WINDOW_S", "DEFAULT_PER_MINUTE", "MAX_HOOK_BODY_BYTES", "MASK", "masked_spec",
           "hook_settings"]
