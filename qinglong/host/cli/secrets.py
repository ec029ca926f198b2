"""``qinglong secrets generate`` and ``qinglong secrets rotate``: the key task env values and
trigger secrets are sealed under at rest."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qinglong.contracts.errors import ExitCode

from .boot import container_of, on_backend
from .output import print_json
from .parsing import add_command, add_json_flag


def cmd_generate(args: argparse.Namespace) -> int:
    """Print a fresh key (base64 of 32 random bytes) for ``[secrets] key_file``."""
    from ..secrets import new_key_text

    sys.stdout.write(new_key_text())
    return ExitCode.OK


def cmd_rotate(args: argparse.Namespace) -> int:
    """Seal every stored env value and trigger secret under the current key (``[secrets]``),
    opening values under the ``--old-key-file`` keys; values in clear are sealed too. One
    transaction; a second run finds nothing left to do."""
    from dependency_injector import providers

    from qinglong.contracts.errors import SecretsError, UserError

    from ..secrets import host_sealer

    container = container_of(args)
    if not hasattr(container, "sealer"):
        raise UserError("`secrets rotate` runs against the store itself, not through --api")
    sealer = host_sealer(container.loaded(), container.backend_settings(), older=args.old_key_file)
    container.sealer.override(providers.Object(sealer))
    keys_loaded = False

    async def go(backend: Any) -> int:
        nonlocal keys_loaded
        reseal = getattr(backend, "reseal_secrets", None)
        if reseal is None:
            raise UserError(f"the {container.loaded().profile.name} profile's store does not seal secrets")
        # Only once the store is open: the default key beside a mistyped path is never created.
        sealer.load()
        keys_loaded = True
        return await reseal(sealer)

    try:
        rewritten = on_backend(container, go, create=False)
    except SecretsError as exc:
        if not keys_loaded:  # a key that cannot be read is reported as it is
            raise
        raise SecretsError(f"{exc} (give the key it was sealed with as --old-key-file; nothing was "
                           "changed)") from None
    if args.json:
        print_json({"key_id": sealer.key_id, "rewritten": rewritten})
    else:
        print(f"sealed under key {sealer.key_id}: {rewritten} stored payload(s) rewritten")
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``secrets generate`` and ``secrets rotate``."""
    group = add_command(sub, common, "secrets", "the key env values and trigger secrets are sealed "
                        "under", None)
    group_sub = group.add_subparsers(dest="secrets_command", metavar="SUBCOMMAND", required=True)
    text = "print a new key (base64 of 32 random bytes) for [secrets] key_file"
    p = group_sub.add_parser("generate", parents=[common], help=text, description=text)
    p.set_defaults(func=cmd_generate)
    text = ("seal every stored env value and trigger secret under the current key ([secrets] key_file "
            "or key_env), opening values under the old keys; in one transaction, idempotent (admin)")
    p = group_sub.add_parser("rotate", parents=[common], help=text, description=text)
    p.add_argument("--old-key-file", action="append", default=[], metavar="PATH",
                   help="a key values may still be sealed under (repeatable)")
    add_json_flag(p)
    p.set_defaults(func=cmd_rotate)
