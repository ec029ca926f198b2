"""The ``qinglong`` command line.

Every error maps to one exit code through the table of :mod:`qinglong.contracts.errors`
(``EXIT_CODES``, ``ExitCode``): 0 success; 1 an internal error (a bug: the traceback is printed);
2 a usage error (argparse); 3 a user error (settings, plugins, input, a missing database); 4 a check
failed (closure, schema, migrations, a store call failing with no outage); 5 the store is unavailable (unreachable, read-only, full,
locked); 130 a second signal forced the exit; 141 standard output was closed by its reader
(``qinglong runs | head -1``: the rest of the output is dropped quietly). Every error the product
raises on purpose is one paragraph ``qinglong: ...`` on stderr, never a traceback.

Only the standard library's ``argparse`` is used, so the edge ``run`` path loads no UI library.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Mapping, Sequence

from qinglong import __version__
from qinglong.contracts.errors import (
    CheckFailed,
    ExitCode,
    QinglongError,
    SchemaNotReady,
    StoreFailed,
    StoreUnavailable,
    UserError,
    exit_code_for,
    quoted,
)
from qinglong.contracts.providers import TriggerCliOptions

from .output import drop_stdout, stdout_reader_gone
from .parsing import command_words, split_command_argv

#: The command groups in the order ``qinglong --help`` lists them: each is a module of this package
#: whose ``register(sub, common)`` adds these commands (``publish`` also takes the trigger kinds' options).
COMMAND_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run", ("run", "demo")),
    ("worker", ("worker",)),
    ("plugins", ("plugins", "profiles")),
    ("config", ("config",)),
    ("check", ("check",)),
    ("db", ("db",)),
    ("publish", ("project", "task", "trigger")),
    ("apply", ("apply", "export", "import")),
    ("runs", ("runs", "logs")),
    ("read", ("schedules", "skips")),
    ("events", ("notifications",)),
    ("status", ("status",)),
    ("tokens", ("token", "audit", "console")),
    ("secrets", ("secrets",)),
    ("api", ("api",)),
)

#: Every command of the host itself; a plugin command of one of these names is refused.
HOST_COMMANDS: frozenset[str] = frozenset(command for _, commands in COMMAND_GROUPS for command in commands)


def command_groups_for(head: Sequence[str]) -> list[str]:
    """The command groups to load: only the named command's, so a command imports no other's module.

    All of them when there is no command, an unknown one (argparse then lists every choice), or a
    help option (``qinglong -h run`` prints the full help).
    """
    words = command_words(head)
    everything = [group for group, _ in COMMAND_GROUPS]
    if not words or "-h" in head or "--help" in head:
        return everything
    return next(([group] for group, commands in COMMAND_GROUPS if words[0] in commands), everything)


def plugin_commands_wanted(head: Sequence[str]) -> bool:
    """Whether to load the plugins' commands (hook ``qinglong_cli_commands``): only when the
    command line names a command that is not the host's, or asks for the top-level help (which
    lists them); a host command, and its own ``--help``, never load them."""
    words = command_words(head)
    if words and words[0] not in HOST_COMMANDS:
        return True
    before_command = head[:head.index(words[0])] if words else head
    return "-h" in before_command or "--help" in before_command


def build_parser(trigger_options: Mapping[str, TriggerCliOptions] | None = None,
                 groups: Sequence[str] | None = None, plugin_commands: Any = None) -> argparse.ArgumentParser:
    """The argument parser (``--settings`` and ``--profile`` work before or after the command).

    ``trigger_options`` are the options trigger kinds declared (``trigger add --cron``); without
    them ``trigger add`` and ``update`` take only ``--kind K --spec JSON``. ``groups`` limits the
    commands to those of the named :data:`COMMAND_GROUPS` (default: all). ``plugin_commands``
    (:class:`~qinglong.host.cli.extensions.PluginCommands`) adds the plugins' commands after them.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--settings", metavar="PATH", default=argparse.SUPPRESS,
                        help="settings file (TOML); default: $QINGLONG_SETTINGS, else profile defaults only")
    common.add_argument("--profile", metavar="NAME", default=argparse.SUPPRESS,
                        help="profile to use (edge, standalone, cluster); overrides the file's 'profile'")
    common.add_argument("--api", metavar="URL", default=argparse.SUPPRESS,
                        help="run the command through the management API at URL instead of the store "
                             "(default: $QINGLONG_API_URL); the token from $QINGLONG_API_TOKEN or --token-file")
    common.add_argument("--token-file", metavar="PATH", default=argparse.SUPPRESS,
                        help="file holding the API token (with --api)")

    parser = BoundedArgumentParser(
        prog="qinglong",
        parents=[common],
        description="Turn scheduled Triggers into durable Runs (edge, standalone and cluster profiles).",
        epilog="Exit codes: 0 ok, 1 internal error (a bug), 2 usage, 3 user error (settings, plugin, input), "
               "4 check failed, 5 store unavailable, 130 forced stop, 141 output closed by its reader.",
    )
    parser.add_argument("--version", action="version", version=f"qinglong {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    wanted = set(dict(COMMAND_GROUPS) if groups is None else groups)
    for group, _ in COMMAND_GROUPS:
        if group in wanted:
            module = importlib.import_module(f"{__package__}.{group}")
            if group == "publish":
                module.register(sub, common, trigger_options)
            else:
                module.register(sub, common)
    if plugin_commands is not None:
        plugin_commands.register(sub, common)
    return parser


class BoundedArgumentParser(argparse.ArgumentParser):
    """argparse, quoting the word it refuses through :func:`~qinglong.contracts.errors.quoted`
    like every other error (its own wording repeats a 5,000-character argument whole). The
    subcommands' parsers are of the same class."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {quoted(value)} (choose from {choices})")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            if repr(arg_string) not in exc.message:
                raise
            raise argparse.ArgumentError(action, exc.message.replace(repr(arg_string), quoted(arg_string))) from None


def _refuse_undecodable(argv: Sequence[str]) -> None:
    """Refuse an argument that holds undecodable bytes (a lone surrogate after decoding).

    Such text cannot be stored as UTF-8; refusing it here names the argument by position instead of
    failing deep in a store. A ``--settings`` path is exempt: a file name may be any bytes.
    """
    previous = ""
    for position, arg in enumerate(argv, start=1):
        if previous != "--settings" and not arg.startswith("--settings="):
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(f"argument {position} is not valid UTF-8 text (it holds undecodable bytes); "
                                "Qinglong stores only UTF-8") from None
        previous = arg


_PREFIXES: tuple[tuple[type[BaseException], str], ...] = (
    (CheckFailed, "check failed"),
    (SchemaNotReady, "not ready"),
    (StoreFailed, "store failed"),
    (StoreUnavailable, "unavailable"),
)


def error_paragraph(exc: QinglongError) -> str:
    """``qinglong: <what>: <message>`` as one line, DSN passwords masked as a last defence."""
    from qinglong.contracts.diagnostics import redact

    what = next((label for kind, label in _PREFIXES if isinstance(exc, kind)), "error")
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return f"qinglong: {what}: {redact(message)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qinglong`` script. Returns the exit code (an :class:`ExitCode`)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        _refuse_undecodable(arguments)
        head, command = split_command_argv(arguments)
        groups = command_groups_for(head)
        trigger_options = (importlib.import_module(f"{__package__}.publish").trigger_options_for(head)
                           if "publish" in groups else {})
        plugin_commands = (importlib.import_module(f"{__package__}.extensions").load_plugin_commands(
            head, HOST_COMMANDS) if plugin_commands_wanted(head) else None)
        args = build_parser(trigger_options, groups, plugin_commands).parse_args(head)
        if command is not None:
            args.argv = command
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows up here at the latest, not at interpreter exit
        return int(code)
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise  # some other pipe: a bug, with its traceback
        return int(drop_stdout())
    except QinglongError as exc:
        sys.stderr.write(error_paragraph(exc) + "\n")
        return int(exit_code_for(exc))
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
