"""Reading a channel's options: clear refusals naming the key, secrets from the environment."""

from __future__ import annotations

import os
from typing import Any, Mapping


def refuse_unknown(name: str, options: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(k for k in options if k not in allowed)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (expected one of {', '.join(allowed)})")


def text(options: Mapping[str, Any], key: str, *, default: str | None = None,
         required: bool = False) -> str | None:
    value = options.get(key, default)
    if value is None:
        if required:
            raise ValueError(f"key {key!r} is required")
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"key {key!r}: expected a non-empty string")
    return value


def number(options: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = options.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"key {key!r}: expected an integer from {lo} to {hi}")
    return value


def secret(options: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    """``key`` itself, or the environment variable ``<key>_env`` names (never both). The value
    is never quoted in an error."""
    env_key = f"{key}_env"
    if key in options and env_key in options:
        raise ValueError(f"give {key!r} or {env_key!r}, not both")
    if env_key in options:
        var = text(options, env_key)
        value = os.environ.get(var or "")
        if not value:
            raise ValueError(f"key {env_key!r}: environment variable {var!r} is not set or empty")
        return value
    if key in options:
        value = options[key]
        if not isinstance(value, str) or not value:
            raise ValueError(f"key {key!r}: expected a non-empty string (its value is not shown)")
        return value
    if required:
        raise ValueError(f"key {key!r} or {env_key!r} is required")
    return None
