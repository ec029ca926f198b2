"""``qinglong plugins`` and ``qinglong profiles``: what is installed and what ships."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qinglong.contracts.errors import ExitCode, PluginLoadError, QinglongError, SettingsError

from .boot import settings_of
from .output import print_json, print_table, yes_no
from .parsing import add_command, add_json_flag


def cmd_plugins(args: argparse.Namespace) -> int:
    """List installed plugins, whatever the profile and whatever extras are installed.

    The profile's plugins and the enabled ones are loaded one by one, so one that cannot be loaded
    hides none of the others; the listing says which profile could not be loaded and why. A profile
    whose extra is missing is a fact about this installation (exit 0); a plugin the settings name
    that is unknown or broken is a mistake to fix (the listing is printed, then exit 3).
    """
    from ..assembly import check_profile_extra
    from ..plugins import PluginHost

    host = PluginHost()
    problems: list[tuple[QinglongError, bool]] = []  # (error, whether it is the user's to fix)
    profile_name: str | None = None
    wanted: set[str] = set()
    try:
        loaded = settings_of(args)
    except SettingsError as exc:
        problems.append((exc, True))
    else:
        profile_name = loaded.profile.name
        wanted = set(loaded.profile.plugins) | set(loaded.settings.plugins.enable)
        try:
            check_profile_extra(loaded)
        except PluginLoadError as exc:
            problems.append((exc, False))
        for names, required_by in (
            (loaded.profile.plugins, f"the {loaded.profile.name} profile"),
            (loaded.settings.plugins.enable, loaded.origin(("plugins", "enable"))),
        ):
            for name in names:
                try:
                    host.load([name], required_by=required_by)
                except PluginLoadError as exc:
                    problems.append((exc, True))
    infos = host.infos()
    profile_error = " ".join(dict.fromkeys(str(exc) for exc, _ in problems)) or None
    if args.json:
        print_json({"profile": profile_name, "profile_loadable": not problems, "profile_error": profile_error,
                     "plugins": [dict(i.as_json(), selected=i.name in wanted) for i in infos]})
    else:
        if profile_name is None:
            print("profile: none (the settings could not be read)")
        elif problems:
            print(f"profile: {profile_name} (cannot be loaded here: {profile_error})")
        else:
            print(f"profile: {profile_name}")
        print_table(
            ["name", "distribution", "version", "loaded", "hooks"],
            [[i.name, i.distribution, i.version, yes_no(i.loaded), ", ".join(i.hooks) or "-"] for i in infos],
        )
    users = [exc for exc, own in problems if own]
    if users:
        sys.stdout.flush()
        raise users[0]
    return ExitCode.OK


def cmd_profiles(args: argparse.Namespace) -> int:
    """List the shipped profiles."""
    from ..profiles import available_profiles, load_profile

    profiles = [load_profile(name) for name in available_profiles()]
    if args.json:
        print_json([{"name": p.name, "description": p.description, "plugins": list(p.plugins),
                      "backend": p.backend, "extra": p.extra, "page_size_cap": p.page_size_cap,
                      "claim_budget_cap": p.claim_budget_cap,
                      "forbidden_modules": list(p.forbidden_modules),
                      "forbidden_distributions": list(p.forbidden_distributions)} for p in profiles])
        return ExitCode.OK
    print_table(["name", "backend", "plugins", "install", "description"],
                 [[p.name, p.backend, ", ".join(p.plugins), f"pip install 'qinglong[{p.extra}]'", p.description]
                  for p in profiles])
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``plugins`` and ``profiles``."""
    add_json_flag(add_command(sub, common, "plugins", "list installed plugins; loaded ones show their hooks",
                              cmd_plugins))
    add_json_flag(add_command(sub, common, "profiles", "list the shipped profiles", cmd_profiles))
