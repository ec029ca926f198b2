"""``qinglong check closure``: what a profile's boot imports, for CI."""

from __future__ import annotations

import argparse
from typing import Any

from qinglong.contracts.errors import CheckFailed, ExitCode

from .output import print_json
from .parsing import add_command, add_json_flag


def cmd_check_closure(args: argparse.Namespace) -> int:
    """Boot a profile in a fresh interpreter and fail on any forbidden module (or distribution)."""
    from ..closure import WORKER_CLOSURE, check_closure, worker_closure_profile
    from ..profiles import load_profile

    profile = worker_closure_profile() if args.check_profile == WORKER_CLOSURE else load_profile(args.check_profile)
    report = check_closure(profile, getattr(args, "settings", None), installed=args.installed)
    if args.json:
        print_json(report.as_json())
    elif report.ok:
        extra = ", no forbidden distribution installed" if report.checked_installed else ""
        print(f"closure of profile {profile.name}: OK ({report.modules} modules loaded, none of "
              f"{', '.join(profile.forbidden_modules)}{extra})")
    if report.boot_error:
        raise CheckFailed(f"profile {profile.name} could not boot: {report.boot_error}")
    if not report.ok:
        lines = [f"closure of profile {profile.name}: FAILED"]
        for v in report.violations:
            also = f" (and {len(v.submodules)} of its submodules)" if v.submodules else ""
            lines.append(f"  forbidden module {v.module}{also} imported via: {' -> '.join(v.chain)}")
        for d in report.installed_violations:
            lines.append(f"  forbidden distribution installed: {d}")
        if not args.json:
            print("\n".join(lines))
        raise CheckFailed(f"profile {profile.name} loads or installs what it must not")
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``check closure``."""
    chk = add_command(sub, common, "check", "checks for CI", None)
    chk_sub = chk.add_subparsers(dest="check_command", metavar="SUBCOMMAND", required=True)
    p = chk_sub.add_parser("closure", help="boot a profile in a fresh interpreter; fail on any forbidden module")
    p.set_defaults(func=cmd_check_closure)
    p.add_argument("--profile", dest="check_profile", required=True, metavar="NAME", help="profile to check (or worker: the worker program through the API tier's gateway)")
    p.add_argument("--settings", metavar="PATH", default=argparse.SUPPRESS,
                   help="settings file to boot with (default: the profile's defaults)")
    p.add_argument("--installed", action="store_true",
                   help="also fail when a forbidden distribution is installed in this environment")
    add_json_flag(p)
