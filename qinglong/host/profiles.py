"""Profiles: the TOML files shipped in :mod:`qinglong.profiles`, read without importing any plugin."""

from __future__ import annotations

import tomllib
from dataclasses import field
from importlib import resources
from typing import Any, Mapping

from qinglong.contracts.frozen import record
from qinglong.contracts.errors import SettingsError, quoted

PROFILE_PACKAGE = "qinglong.profiles"


@record(slots=False)
class ProfileDefinition:
    """One profile: what it loads, what it must never load, and its defaults."""

    name: str
    description: str
    plugins: tuple[str, ...]
    backend: str
    extra: str
    page_size_cap: int
    claim_budget_cap: int
    max_running_cap: int
    timeout_cap_ms: int
    log_limit_cap_bytes: int
    forbidden_modules: tuple[str, ...]
    forbidden_distributions: tuple[str, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    #: What the profile's remote worker program (``check closure --profile worker``) must never
    #: import or install; empty where the profile has no remote worker.
    worker_forbidden_modules: tuple[str, ...] = ()
    worker_forbidden_distributions: tuple[str, ...] = ()


def available_profiles() -> list[str]:
    """Names of the profiles shipped with this installation."""
    return sorted(
        entry.name[: -len(".toml")]
        for entry in resources.files(PROFILE_PACKAGE).iterdir()
        if entry.name.endswith(".toml")
    )


_REQUIRED = {
    "description": str,
    "plugins": list,
    "backend": str,
    "extra": str,
    "page_size_cap": int,
    "claim_budget_cap": int,
    "max_running_cap": int,
    "timeout_cap_ms": int,
    "log_limit_cap_bytes": int,
    "forbidden_modules": list,
    "forbidden_distributions": list,
}


def load_profile(name: str) -> ProfileDefinition:
    """Read profile ``name``; raise :class:`SettingsError` listing the known ones if it is unknown."""
    known = available_profiles()
    if name not in known:
        raise SettingsError(
            f"unknown profile {quoted(name)}; the profiles shipped are: {', '.join(known)}"
        )
    resource = resources.files(PROFILE_PACKAGE) / f"{name}.toml"
    source = f"profile file {name}.toml (package {PROFILE_PACKAGE})"
    try:
        data = tomllib.loads(resource.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:  # a broken installation, not a user mistake
        raise SettingsError(f"{source} is not valid TOML: {exc}") from None
    meta = data.get("profile")
    if not isinstance(meta, dict):
        raise SettingsError(f"{source} has no [profile] table")
    for key, kind in _REQUIRED.items():
        if not isinstance(meta.get(key), kind):
            raise SettingsError(f"{source}: [profile] {key} must be a {kind.__name__}")
    unknown = set(meta) - set(_REQUIRED)
    if unknown:
        raise SettingsError(f"{source}: unknown [profile] keys: {', '.join(sorted(unknown))}")
    worker = data.get("worker", {})
    if not isinstance(worker, dict) or set(worker) - {"forbidden_modules", "forbidden_distributions"} \
            or not all(isinstance(v, list) for v in worker.values()):
        raise SettingsError(f"{source}: [worker] may hold only the lists forbidden_modules and "
                            "forbidden_distributions")
    return ProfileDefinition(
        name=name,
        description=meta["description"],
        plugins=tuple(meta["plugins"]),
        backend=meta["backend"],
        extra=meta["extra"],
        page_size_cap=meta["page_size_cap"],
        claim_budget_cap=meta["claim_budget_cap"],
        max_running_cap=meta["max_running_cap"],
        timeout_cap_ms=meta["timeout_cap_ms"],
        log_limit_cap_bytes=meta["log_limit_cap_bytes"],
        forbidden_modules=tuple(meta["forbidden_modules"]),
        forbidden_distributions=tuple(meta["forbidden_distributions"]),
        defaults=data.get("defaults", {}),
        source=source,
        worker_forbidden_modules=tuple(worker.get("forbidden_modules", ())),
        worker_forbidden_distributions=tuple(worker.get("forbidden_distributions", ())),
    )
