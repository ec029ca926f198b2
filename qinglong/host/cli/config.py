"""``qinglong config show``: the effective settings, secrets masked."""

from __future__ import annotations

import argparse
import json
from typing import Any

from qinglong.contracts.errors import ExitCode

from .boot import container_of, settings_of
from .output import print_json
from .parsing import add_command, add_json_flag


def cmd_config_show(args: argparse.Namespace) -> int:
    """Print the effective settings, secrets masked, with the backend section validated."""
    from ..settings import masked_dump

    loaded = settings_of(args)
    data = masked_dump(loaded.settings)
    data["backend"] = masked_dump(container_of(args).backend_settings())
    result = {"profile": loaded.profile.name, "settings_file": str(loaded.file) if loaded.file else None,
              "settings": data}
    if args.json:
        print_json(result)
    else:
        print(f"# profile: {loaded.profile.name}")
        print(f"# settings file: {loaded.file or '(none: profile defaults and environment only)'}")
        _print_toml(data)
    return ExitCode.OK


def _print_toml(data: dict[str, Any], prefix: str = "") -> None:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    if prefix and (scalars or not tables):
        print(f"\n[{prefix}]")
    for key, value in scalars.items():
        if value is None:
            print(f"# {key} is not set")
        else:
            print(f"{key} = {json.dumps(value)}")
    for key, value in tables.items():
        _print_toml(value, f"{prefix}.{key}" if prefix else key)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``config show``."""
    cfg = add_command(sub, common, "config", "inspect the effective settings", None)
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    p = cfg_sub.add_parser("show", parents=[common], help="print the effective settings, secrets masked")
    p.set_defaults(func=cmd_config_show)
    add_json_flag(p)
