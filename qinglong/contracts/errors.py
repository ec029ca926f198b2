"""Error types shared by the host and every plugin.

Each error carries a message a user can act on. ``QinglongError`` subclasses that describe a user's
mistake (bad settings, a bad trigger spec, an unknown plugin) are shown as one paragraph by the CLI,
never as a stack trace.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Every exit code of the ``qinglong`` command. :func:`exit_code_for` maps errors onto them."""

    OK = 0
    """The command did what it was asked."""

    INTERNAL_ERROR = 1
    """A bug: an exception that is not a :class:`QinglongError`. Printed with its traceback."""

    USAGE_ERROR = 2
    """The command line could not be parsed (argparse's own code)."""

    USER_ERROR = 3
    """A mistake the user can fix: settings, plugins, input, a missing database file."""

    CHECK_FAILED = 4
    """A check failed: closure violated, schema not ready, drifted, corrupted or not ours, or the
    store failed a call with an error that is no outage (:class:`StoreFailed`)."""

    UNAVAILABLE = 5
    """The store cannot be used right now: unreachable, read-only, full, or locked by another process."""

    SECRETS = 6
    """The secrets key is missing, unreadable, or not the key the store's sealed values need."""

    INTERRUPTED = 130
    """A second SIGINT/SIGTERM forced the exit before the orderly stop finished."""

    BROKEN_PIPE = 141
    """Standard output was closed by its reader (``qinglong runs | head -1``): the rest of the output
    is dropped quietly, with the code a shell reports for a process ended by SIGPIPE (128 + 13)."""


#: How many characters of a value the user gave an error quotes: enough to recognise it.
QUOTE_LIMIT = 80


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``value`` (the user's text) as every error quotes it: its ``repr``, cut after ``limit``
    characters with ``... (N characters)``, so a 5,000-character argument is one line, not a page."""
    if not isinstance(value, str):  # a number or a list from a file: its repr, cut the same way
        shown = repr(value)
        return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(shown)} characters)"
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


#: A path is quoted whole up to this length; a longer one keeps both ends.
PATH_QUOTE_LIMIT = 240


def quoted_path(path: object) -> str:
    """A file's path as errors quote it: whole up to PATH_QUOTE_LIMIT characters, else its first and
    last 100 with ``...`` between, so the file's own name (the end) is always shown."""
    text = str(path)
    if len(text) <= PATH_QUOTE_LIMIT:
        return repr(text)
    return f"{text[:100]!r}...{text[-100:]!r} ({len(text)} characters)"


class QinglongError(Exception):
    """Base of every error Qinglong raises on purpose."""


class UserError(QinglongError):
    """A mistake the user can fix (input, settings, installation). Shown without a traceback."""


class TriggerSpecError(UserError):
    """A trigger spec that its provider refuses: names the field and what was expected."""

    def __init__(self, kind: str, field: str, problem: str) -> None:
        self.kind = kind
        self.field = field
        self.problem = problem
        super().__init__(f"invalid {kind} trigger: {field}: {problem}")


class UnknownTriggerKind(UserError):
    """No loaded plugin provides this trigger kind."""

    def __init__(self, kind: str, available: list[str]) -> None:
        self.kind = kind
        self.available = sorted(available)
        listed = ", ".join(self.available) or "none"
        super().__init__(
            f"unknown trigger kind {quoted(kind)}; kinds provided by the loaded plugins: {listed}"
        )


class NotFound(UserError):
    """A project, task or trigger named by the user does not exist."""


class AlreadyExists(UserError):
    """A project or task with this identifier exists already."""


class SettingsError(UserError):
    """The settings file, a profile or an environment override is invalid."""


class PluginLoadError(UserError):
    """A plugin could not be found, imported or registered."""


class SchemaNotReady(QinglongError):
    """The database schema is missing, behind, ahead of or drifted from this version.

    Readiness fails closed: nothing is started on a database in this state.
    """


class SchemaCorrupt(SchemaNotReady):
    """The database file or schema is damaged: unreadable pages, a missing table, a changed column."""


class NotOurDatabase(SchemaNotReady):
    """The database holds another application's data; Qinglong refuses to take it over."""


class StoreUnavailable(QinglongError):
    """The store exists but cannot be used now: unreachable, refused, read-only, full or locked.

    The message names the store (a file path, or a DSN's host and database, never its password)
    and what is wrong, so an operator can act without a traceback.
    """


class StoreUnreachable(StoreUnavailable):
    """The store's server cannot be reached now: down, restarting, shutting down or not yet
    accepting connections. An outage that ends by itself, so it is waited out (see
    :func:`outage`), unlike a refused login or a store that is read-only, full or locked."""


class StoreAuthFailed(StoreUnavailable):
    """The store refused the credentials (a wrong password, an unknown role, no access rule for
    this client): it will not change until the settings do, so it is not retried as an outage."""


class StoreFailed(StoreUnavailable):
    """The store answered a call with an error that is neither a refusal nor an outage: a
    violated constraint, an error in its SQL or its functions. A defect of the store, never an
    outage: it is reported as an error (naming the call) and a call is tried again only after a
    growing pause, since the same call fails the same way until the defect is fixed. Exit code 4,
    as a store that is not what this version expects (never 5, which callers wait out)."""


class StoreNotReady(StoreFailed):
    """The store behind a worker gateway is not what this version expects (a worker function
    missing, its EXECUTE revoked, the schema gone): the gateway's ``503 schema_not_ready``, as a
    worker receives it. Like :class:`StoreFailed`, the same call fails the same way until an
    operator fixes the store: an error, and a call tried again only after a growing pause."""


class StoreReadOnly(StoreUnavailable):
    """The store can be read but not written (a read-only file, directory or server)."""


class StoreFull(StoreUnavailable):
    """A write failed because the disk or the database is full."""


class StoreLocked(StoreUnavailable):
    """Another process owns the store (the edge/standalone owner lock); names the holder's pid."""


class StoreMissing(UserError):
    """A read command named a database that does not exist; only ``run``, ``db migrate`` and
    publishing create one."""


class SecretsError(QinglongError):
    """The secrets key is missing or unreadable, or a sealed value does not open with the keys
    loaded. The message names the setting or key id, never a value or a key."""


class FenceLost(QinglongError):
    """A compare-and-set or claim fence no longer matches: someone else owns the occurrence now.

    Never retried: the occurrence belongs to whoever moved the fence.
    """


class CheckFailed(QinglongError):
    """A check command found a violation: a closure broken, migrations drifted or unknown."""


class PackagingError(Exception):
    """The installed package itself is malformed: an SQL file with an undocumented or duplicated
    named block, a lookup of a block no file defines, a migration file misnamed or out of order.

    A bug, not a user's mistake: deliberately not a :class:`QinglongError`, so it exits with
    ``INTERNAL_ERROR`` and its traceback. The message names the file and the block or migration.
    """


def outage(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage worth waiting out: the one rule of every wait for the store
    (``qinglong run`` at start, ``qinglong db wait``). Only :class:`StoreUnreachable`; a refused
    login (:class:`StoreAuthFailed`) will not change until the settings do and ends the wait."""
    return isinstance(exc, StoreUnreachable) and not isinstance(exc, StoreAuthFailed)


#: The one table from error type to exit code. Most specific first; :func:`exit_code_for` walks
#: it in order, so a subclass listed before its base wins.
EXIT_CODES: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (SecretsError, ExitCode.SECRETS),
    (StoreMissing, ExitCode.USER_ERROR),
    (UserError, ExitCode.USER_ERROR),
    (SchemaNotReady, ExitCode.CHECK_FAILED),
    (CheckFailed, ExitCode.CHECK_FAILED),
    (StoreFailed, ExitCode.CHECK_FAILED),
    (StoreUnavailable, ExitCode.UNAVAILABLE),
    (QinglongError, ExitCode.CHECK_FAILED),
)


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code for ``exc``: its row in :data:`EXIT_CODES`, or ``INTERNAL_ERROR`` for a bug."""
    for error_type, code in EXIT_CODES:
        if isinstance(exc, error_type):
            return code
    return ExitCode.INTERNAL_ERROR



#: The one table from error type to HTTP status and error code of the management API (the error
#: shape is ``{"error": {"code", "message", "field"}}``), beside :data:`EXIT_CODES`. Most specific
#: first, like it; authentication (401), scope (403) and rate limiting (429) are the HTTP layer's.
HTTP_STATUSES: tuple[tuple[type[BaseException], int, str], ...] = (
    (SecretsError, 503, "secrets_unavailable"),
    (NotFound, 404, "unknown"),
    (AlreadyExists, 409, "conflict"),
    (StoreMissing, 503, "unavailable"),
    (UserError, 422, "invalid"),
    (SchemaNotReady, 503, "schema_not_ready"),
    (StoreNotReady, 503, "schema_not_ready"),
    (CheckFailed, 422, "invalid"),
    (StoreFailed, 500, "store_failed"),
    (StoreUnavailable, 503, "unavailable"),
    (QinglongError, 422, "invalid"),
)


def http_status_for(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and error code for ``exc``: its row in :data:`HTTP_STATUSES`, or 500
    ``internal`` for a bug."""
    for error_type, status, code in HTTP_STATUSES:
        if isinstance(exc, error_type):
            return status, code
    return 500, "internal"

# ---- the publishers' refusals, worded once ------------------------------------------------------
# Every store's publisher raises these, so a refusal reads (and exits) the same on every backend.

def project_exists(project_id: str) -> AlreadyExists:
    """A project created twice."""
    return AlreadyExists(f"project {quoted(project_id)} exists already")


def project_not_found(project_id: str) -> NotFound:
    """A task or trigger published into a project that does not exist."""
    return NotFound(f"project {quoted(project_id)} does not exist; create it first")


def task_not_found(project_id: str, task_id: str) -> NotFound:
    """A trigger naming a task its project does not have."""
    return NotFound(f"task {quoted(task_id)} does not exist in project {quoted(project_id)}; "
                    "publish the task before a trigger that runs it")


def task_in_use(project_id: str, task_id: str, trigger_ids: list[str]) -> UserError:
    """A task deleted while triggers still run it."""
    shown = ", ".join(repr(t) for t in trigger_ids[:5]) + (" ..." if len(trigger_ids) > 5 else "")
    return UserError(f"task {quoted(task_id)} of project {quoted(project_id)} is run by trigger(s) {shown}; "
                     "delete them (or point them at another task) first")


def trigger_not_found(project_id: str, trigger_id: str) -> NotFound:
    """A change to a trigger the project does not have."""
    return NotFound(f"trigger {quoted(trigger_id)} does not exist in project {quoted(project_id)}")


def trigger_id_taken(trigger_id: str, owner_project_id: str) -> AlreadyExists:
    """A trigger id another project uses (trigger ids are unique across projects); the owner is
    kept as ``owner_project_id``, so a caller that may not see it can word the refusal without it."""
    taken = AlreadyExists(f"trigger id {quoted(trigger_id)} is used by project {quoted(owner_project_id)}; "
                          "trigger ids are unique across projects")
    taken.owner_project_id = owner_project_id  # type: ignore[attr-defined]
    return taken


def bad_misfire_policy(value: object) -> UserError:
    """A misfire policy that is not one of the contract's."""
    from .records import MisfirePolicy

    allowed = ", ".join(repr(p.value) for p in MisfirePolicy)
    return UserError(f"invalid misfire_policy {quoted(value)}: expected one of {allowed}")


def bad_enabled_flag(value: object) -> UserError:
    """An enabled flag that is not a boolean."""
    return UserError(f"invalid enabled {quoted(value)}: expected true or false")


def payload_not_a_table(task_id: str, value: object) -> UserError:
    """A task payload that is not a mapping (never shows the value: payloads may hold secrets)."""
    return UserError(f"task {quoted(task_id)}: payload must be a table (mapping), got {type(value).__name__}")
