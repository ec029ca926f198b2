"""Store and scheduler-backend protocols that the SQLite and PostgreSQL plugins implement.

A scheduler backend owns one profile's database: its schema and migrations, the publisher (admin
side), the reader, startup recovery and the bounded scheduler round. The host drives it through
these protocols only, so the CLI's publish and read commands are the same in every profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from .frozen import record
from .diagnostics import DiagnosticSink
from .errors import TriggerSpecError, UnknownTriggerKind, UserError, quoted
from .jitter import MAX_JITTER_MS
from .providers import TriggerProvider
from .records import (
    MAX_MISFIRE_GRACE_MS,
    MigrationState,
    canonical_json,
    MisfirePolicy,
    ProjectRecord,
    RecoveryReport,
    RoundReport,
    RunView,
    ScheduleView,
    SkipView,
    TaskRecord,
    TriggerDefinition,
    TriggerHead,
)

if TYPE_CHECKING:  # types only
    from .apply import DesiredProject, ProjectPlan, ProjectState


#: Input limits, in one place for the CLI and every publisher. A task payload or a trigger spec is
#: measured as its canonical JSON in UTF-8; a command as its argv in execve's terms (each argument
#: plus its terminating NUL). Nesting counts objects and arrays.
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_SPEC_BYTES = 4 * 1024
MAX_COMMAND_BYTES = 4 * 1024
MAX_JSON_DEPTH = 32
#: A project's display name: at most this many printable characters (its id is an identifier).
MAX_PROJECT_NAME_CHARS = 200
#: A task's description (the payload's ``description`` text): at most this many characters.
MAX_DESCRIPTION_CHARS = 4096
#: The most projects a token or a worker registration may be limited to.
MAX_GRANTED_PROJECTS = 256


@record
class SchedulerLimits:
    """Bounds of one scheduler round, from the settings after the profile's caps were applied.

    ``page_size`` bounds the SQLite scan; ``claim_budget`` bounds the cluster claim; ``lease_ms`` is
    the cluster claim lease; ``cadence_ms`` the pause between round starts. ``max_queued``
    (``[execution] max_queued``): the bound on a task's waiting Runs that a store whose Runs are
    started elsewhere writes on each Run it admits (None: no bound).
    """

    page_size: int
    claim_budget: int
    lease_ms: int
    cadence_ms: int
    max_queued: int | None = None


@record(slots=False)
class BackendContext:
    """Everything a backend's factory receives from the host. Built by the composition root.

    ``settings`` is the backend's own settings model, already validated from the ``[backend]``
    section. ``clock_ms`` is the process clock; a backend whose database has a clock (PostgreSQL)
    must use that instead for every fence. ``owner`` identifies this replica in claims.
    """

    settings: Any
    limits: SchedulerLimits
    providers: Mapping[str, TriggerProvider]
    diagnostics: DiagnosticSink
    clock_ms: Callable[[], int]
    owner: str
    #: seals and opens task env values at rest (:mod:`qinglong.contracts.secrets`); the host
    #: always gives one. None (a store built by hand, in a plugin's own tests) stores values as
    #: given and refuses to run a sealed one.
    sealer: Any = None


@runtime_checkable
class Publisher(Protocol):
    """The admin side: every call is one transaction; bad input writes nothing."""

    async def create_project(self, project_id: str, name: str | None = None) -> ProjectRecord:
        """Create an active project."""
        ...

    async def put_task(self, project_id: str, task_id: str, payload: Mapping[str, Any]) -> TaskRecord:
        """Create a task, or publish a new revision of it when the payload changed."""
        ...

    async def put_trigger(self, definition: TriggerDefinition) -> TriggerHead:
        """Add a trigger or publish a new revision of it (which resets its schedule cursor).

        Validates the spec with its provider first; upserts the schedule row in the same transaction.
        Publishing an unchanged definition returns the current head without a new revision.
        """
        ...

    async def set_trigger_enabled(self, project_id: str, trigger_id: str, enabled: bool) -> TriggerHead:
        """Enable or disable a trigger. A change is a new revision (the cursor is reset)."""
        ...

    async def delete_trigger(self, project_id: str, trigger_id: str) -> None:
        """Delete a trigger and its schedule row; its Runs stay."""
        ...

    async def delete_task(self, project_id: str, task_id: str) -> None:
        """Delete a task: its head is gone (``task show``, ``task run`` and new triggers no longer
        find it) while every revision stays, so its Runs keep their history and a Run still
        queued or running finishes on the revision it pinned. Refused (``UserError``) while a
        trigger of the project runs it, naming the triggers. Publishing the task again continues
        its revisions (they never repeat)."""
        ...

    async def project_state(self, project_id: str) -> "ProjectState":
        """The project's name, task heads (payloads, env values included) and trigger heads; a
        project the store does not have (or deleted) is ``ProjectState.absent``."""
        ...

    async def apply_project(self, desired: "DesiredProject", *, prune: bool = False,
                            dry_run: bool = False) -> "ProjectPlan":
        """Take one project to ``desired`` in ONE transaction and return the plan that did it.

        The project's state is read inside the transaction and planned with
        :func:`~qinglong.contracts.apply.plan_project`; then, in plan order, the project is
        created (or revived, or renamed), pruned triggers deleted, tasks and triggers published
        (an unchanged one gets no new revision), pruned tasks deleted. Any refusal rolls back the
        whole project (:class:`~qinglong.contracts.apply.PlanRefused` names the object and key).
        ``dry_run`` plans in the same transaction and rolls it back: the plan is exactly what
        applying would do now, and nothing is written.
        """
        ...

    async def delete_project(self, project_id: str, *, dry_run: bool = False) -> "ProjectPlan":
        """Delete a project in one transaction: its triggers, its tasks (as :meth:`delete_task`),
        then the project, whose Runs stay. Creating it again starts it empty. A project the store
        does not have is an empty plan."""
        ...


@runtime_checkable
class Reader(Protocol):
    """Read-only views for the CLI and for tests.

    A reader that can tell whether a scheduler works its store is also a
    :class:`~qinglong.contracts.capabilities.StatusReader` (``scheduler_status()``).
    """

    async def list_projects(self, limit: int | None = None) -> Sequence[ProjectRecord]:
        """Projects by id, at most ``limit`` rows (:func:`listing_bound`; a bad limit is a
        ``UserError`` on every backend)."""
        ...

    async def list_triggers(self, project_id: str | None = None, limit: int | None = None,
                            kind: str | None = None) -> Sequence[TriggerHead]:
        """Current trigger heads by project and id, optionally of one project and of one ``kind``
        (filtered in the store, so a caller looking for a few triggers of a kind never holds every
        head), at most ``limit``."""
        ...

    async def list_schedules(self, limit: int | None = None,
                             after: ScheduleView | tuple | None = None) -> Sequence[ScheduleView]:
        """Every trigger's schedule, ordered like the due scan, at most ``limit``.

        ``after``: a keyset cursor, the last schedule of the previous page (a
        :class:`ScheduleView`, or its ``(next_fire_at_ms or None, project_id, trigger_id)``): the
        page starts right after it, so paging costs each page its own rows."""
        ...

    async def recent_runs(self, limit: int = 20, trigger_id: str | None = None) -> Sequence[RunView]:
        """The newest Runs first."""
        ...

    async def recent_skips(self, limit: int = 20) -> Sequence[SkipView]:
        """The newest recorded misfires first."""
        ...


@runtime_checkable
class SchedulerBackend(Protocol):
    """One profile's store and scheduler. Created by a :class:`SchedulerBackendSpec` factory.

    The lifecycle calls, in order: :meth:`open`, (:meth:`migrate` when the backend is
    :class:`~qinglong.contracts.capabilities.MigratesAtStart` with ``auto_migrate`` true),
    :meth:`check_readiness`, :meth:`recover`, then :meth:`run_round` at the cadence, and
    :meth:`close` last. What else the host may ask of a backend (executing Runs, controlling
    remotely executed ones, a store file) is in :mod:`qinglong.contracts.capabilities`.
    """

    name: str

    async def open(self, *, create: bool = True) -> None:
        """Connect. Settings were validated before; nothing is written here.

        ``create=False`` is passed by commands that only read (listings, ``db status``): a store
        that does not exist is :class:`~qinglong.contracts.errors.StoreMissing` and is not
        created, and :meth:`migrate` then applies nothing. ``run``, ``db migrate`` and publishing
        open with ``create=True``, the default. A backend whose store is never created by opening
        (a server) accepts the keyword and may ignore it.
        """
        ...

    async def migrate(self) -> Sequence[MigrationState]:
        """Apply pending migrations in order; return the state after."""
        ...

    async def migration_status(self) -> Sequence[MigrationState]:
        """Every known or applied migration with its status."""
        ...

    async def check_readiness(self) -> None:
        """Raise :class:`~qinglong.contracts.errors.SchemaNotReady` unless the schema is exact."""
        ...

    async def recover(self) -> RecoveryReport:
        """Startup recovery; pristine queued attempts are left alone."""
        ...

    async def run_round(self) -> RoundReport:
        """One bounded scheduler round. Never called concurrently with itself."""
        ...

    def publisher(self) -> Publisher:
        """The admin side of this store."""
        ...

    def reader(self) -> Reader:
        """The read side of this store."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent."""
        ...


@record
class SchedulerBackendSpec:
    """What a scheduler plugin offers through ``qinglong_scheduler_backends``.

    ``settings_model`` is a pydantic model class for the ``[backend]`` settings section (unknown keys
    must be forbidden); ``create`` builds the backend from a :class:`BackendContext` without
    connecting. Heavy imports (the database driver) belong inside ``create``'s module, not in the
    plugin package's ``__init__``.
    """

    name: str
    settings_model: type
    create: Callable[[BackendContext], SchedulerBackend]
    description: str = ""


def validate_definition(
    definition: TriggerDefinition, providers: Mapping[str, TriggerProvider]
) -> tuple[Mapping[str, Any], str]:
    """Validate a trigger definition before a publisher writes anything.

    Returns the normalised spec and the provider kind. Raises :class:`UnknownTriggerKind` or
    :class:`TriggerSpecError` with a message naming the field.
    """
    provider = providers.get(definition.kind)
    if provider is None:
        raise UnknownTriggerKind(definition.kind, list(providers))
    if not isinstance(definition.misfire_grace_ms, int) or isinstance(definition.misfire_grace_ms, bool):
        raise TriggerSpecError(definition.kind, "misfire_grace_ms", "expected an integer number of milliseconds")
    if not 0 <= definition.misfire_grace_ms <= MAX_MISFIRE_GRACE_MS:
        raise TriggerSpecError(
            definition.kind, "misfire_grace_ms",
            f"must be between 0 and {MAX_MISFIRE_GRACE_MS} (366 days), got {definition.misfire_grace_ms}",
        )
    if not isinstance(definition.jitter_ms, int) or isinstance(definition.jitter_ms, bool):
        raise TriggerSpecError(definition.kind, "jitter_ms", "expected an integer number of milliseconds")
    if not 0 <= definition.jitter_ms <= MAX_JITTER_MS:
        raise TriggerSpecError(
            definition.kind, "jitter_ms",
            f"must be between 0 and {MAX_JITTER_MS} (1 day), got {definition.jitter_ms}",
        )
    for label, value in (("project_id", definition.project_id), ("trigger_id", definition.trigger_id),
                         ("task_id", definition.task_id)):
        check_identifier(label, value)
    check_json_value(f"trigger {quoted(definition.trigger_id)}: spec", definition.spec, MAX_SPEC_BYTES)
    return provider.validate(definition.spec), provider.kind


def check_json_value(label: str, value: Any, max_bytes: int) -> str:
    """Refuse a value that cannot be stored as plain, bounded JSON; return its canonical JSON.

    Refused, naming ``label`` and the place (``$.a[2]``) but never the value (payloads may hold
    secrets): NaN and infinities (not JSON), text that is not valid Unicode (a lone surrogate, from
    undecodable bytes or a ``\\udc80`` escape), keys that are not strings, nesting deeper than
    :data:`MAX_JSON_DEPTH`, and more than ``max_bytes`` of canonical UTF-8 JSON. The walk is
    iterative, so no input can exhaust the interpreter's stack.
    """
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, (Mapping, list, tuple)):
            if depth >= MAX_JSON_DEPTH:
                raise UserError(f"{label}: nested deeper than {MAX_JSON_DEPTH} levels at {where}")
            if isinstance(node, Mapping):
                for key, child in node.items():
                    if not isinstance(key, str):
                        raise UserError(f"{label}: key {type(key).__name__} at {where}: keys must be strings")
                    _check_text(label, key, f"{where} (a key)")
                    shown = key if len(key) <= 40 else key[:37] + "..."
                    stack.append((child, f"{where}.{shown}" if key.isidentifier() else f"{where}[{shown!r}]",
                                  depth + 1))
            else:
                stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(node))
        elif isinstance(node, float):
            if node != node or node in (float("inf"), float("-inf")):
                raise UserError(f"{label}: NaN and infinities are not JSON numbers (at {where})")
        elif isinstance(node, str):
            _check_text(label, node, where)
        elif node is not None and not isinstance(node, (bool, int)):
            raise UserError(f"{label}: a {type(node).__name__} at {where} is not a JSON value")
    text = canonical_json(value)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise UserError(f"{label}: {size} bytes of JSON, over the limit of {max_bytes} bytes")
    return text


def _check_text(label: str, text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{label}: text at {where} is not valid Unicode (a lone surrogate: undecodable "
                        "bytes or a \\ud800-\\udfff escape)") from None


def check_command(label: str, argv: Sequence[str]) -> None:
    """Refuse a command a worker could not execute: empty, a NUL byte, not Unicode, too long."""
    if not argv or not isinstance(argv, (list, tuple)) or not all(isinstance(a, str) for a in argv):
        raise UserError(f"{label}: expected a non-empty list of arguments")
    if not argv[0]:
        raise UserError(f"{label}: the program (first argument) is empty")
    for i, arg in enumerate(argv):
        if "\0" in arg:
            raise UserError(f"{label}: argument {i} contains a NUL character, which no program can receive")
        _check_text(label, arg, f"argument {i}")
    size = sum(len(a.encode("utf-8")) + 1 for a in argv)
    if size > MAX_COMMAND_BYTES:
        raise UserError(f"{label}: {size} bytes of arguments, over the limit of {MAX_COMMAND_BYTES} bytes")


#: Most rows one reader listing returns (``None`` asks for all of them, up to this); the CLI's
#: ``--limit`` ceiling too.
MAX_LISTING_ROWS = 100_000


def schedule_cursor(after: Any) -> tuple[int | None, str, str] | None:
    """The keyset ``(next_fire_at_ms or None, project_id, trigger_id)`` of a schedule listing's
    ``after`` (the last :class:`ScheduleView` of a page, or that tuple); None from the start.
    Anything else is a :class:`~qinglong.contracts.errors.UserError`, in the same words on every
    backend."""
    if after is None:
        return None
    if isinstance(after, ScheduleView):
        return (after.next_fire_at_ms, after.project_id, after.trigger_id)
    if (isinstance(after, tuple) and len(after) == 3
            and (after[0] is None or (isinstance(after[0], int) and not isinstance(after[0], bool)))
            and isinstance(after[1], str) and isinstance(after[2], str)):
        return after
    raise UserError(f"invalid schedule cursor {quoted(after)}: expected the last schedule of a page or "
                    "(next_fire_at_ms or None, project_id, trigger_id)")


def listing_bound(limit: int | None) -> int:
    """The number of rows a reader returns for ``limit``: :data:`MAX_LISTING_ROWS` for None, else
    ``limit`` capped by it. Raises :class:`~qinglong.contracts.errors.UserError` for a limit that
    is not a whole number >= 0, on every backend alike."""
    if limit is None:
        return MAX_LISTING_ROWS
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise UserError(f"invalid listing limit {quoted(limit)}: expected a whole number >= 0")
    return min(limit, MAX_LISTING_ROWS)


def check_identifier(label: str, value: str) -> None:
    """Identifiers are 1-64 ASCII letters, digits, ``-``, ``_`` and ``.``, starting with a letter or
    digit (so ``-x`` is never read as an option, and ``.``/``..`` never as a path); no ``:``."""
    from .errors import UserError
    from .names import is_identifier

    if not is_identifier(value):
        raise UserError(
            f"invalid {label} {quoted(value)}: expected 1-64 ASCII letters, digits, '-', '_' or '.', "
            "starting with a letter or digit"
        )


def check_granted_projects(label: str, projects: Sequence[str]) -> None:
    """The projects a token or a worker registration is limited to: each an identifier, at most
    :data:`MAX_GRANTED_PROJECTS` of them (``label`` names the field in the refusal)."""
    if len(set(projects)) > MAX_GRANTED_PROJECTS:
        raise UserError(f"{label}: expected at most {MAX_GRANTED_PROJECTS} projects, got {len(set(projects))}")
    for project in projects:
        check_identifier("project_id", project)


def check_project_name(name: Any) -> str:
    """A project's display name: 1 to :data:`MAX_PROJECT_NAME_CHARS` printable characters.
    Checked by every publisher before it writes, so the CLI, the API and ``apply`` refuse it in
    the same words. (A lone surrogate is not printable.)"""
    if not isinstance(name, str) or not name or not name.isprintable():
        raise UserError(f"invalid project name {quoted(name)}: expected 1 to {MAX_PROJECT_NAME_CHARS} "
                        "printable characters")
    if len(name) > MAX_PROJECT_NAME_CHARS:  # longer than the quote: it says how long
        raise UserError(f"invalid project name {quoted(name)}: expected at most {MAX_PROJECT_NAME_CHARS} "
                        "characters")
    return name


def skip_grace_floor_ms(limits: SchedulerLimits, *, leased: bool) -> int:
    """The smallest misfire grace a ``skip`` trigger may declare under ``limits``.

    An on-time occurrence is observed up to one cadence late (edge), or one cadence plus one claim
    lease late on the cluster (a claim that dies is taken over only after its lease). A ``skip``
    trigger whose grace is at or below that would skip occurrences that were never late through
    any fault: refused at publish time.
    """
    return limits.cadence_ms + (limits.lease_ms if leased else 0)


def check_misfire_grace(definition: TriggerDefinition | TriggerHead, limits: SchedulerLimits, *,
                        leased: bool) -> None:
    """Refuse a ``skip`` trigger whose grace cannot be met (see :func:`skip_grace_floor_ms`).

    ``definition`` is what is being published, or the stored head that is being enabled (a head
    stored before this rule existed must not start skipping). Its policy may be the enum or its
    value. Raises :class:`TriggerSpecError` naming the trigger, its grace and the floor. Called by
    every publisher before it writes anything.
    """
    if misfire_policy_of(definition.misfire_policy) is not MisfirePolicy.SKIP:
        return
    floor = skip_grace_floor_ms(limits, leased=leased)
    if definition.misfire_grace_ms <= floor:
        what = (f"the scheduler cadence ({limits.cadence_ms} ms) plus the claim lease "
                f"({limits.lease_ms} ms)" if leased else f"the scheduler cadence ({limits.cadence_ms} ms)")
        raise TriggerSpecError(
            definition.kind, "misfire_grace_ms",
            f"trigger {quoted(definition.trigger_id)} uses misfire policy 'skip' with a grace of "
            f"{definition.misfire_grace_ms} ms, which is not above {what}: its on-time occurrences "
            f"would be skipped; use a grace above {floor} ms or misfire policy 'fire_once'",
        )


def check_task_payload(task_id: str, payload: Any) -> str:
    """Refuse a task payload every publisher must refuse; return its canonical JSON.

    A payload is a mapping of plain JSON (see :func:`check_json_value`) of at most
    :data:`MAX_PAYLOAD_BYTES`, its ``description`` text at most :data:`MAX_DESCRIPTION_CHARS`.
    Called by every publisher before it writes anything, so the API refuses what the CLI refuses,
    in the same words.
    """
    from .errors import payload_not_a_table

    if not isinstance(payload, Mapping):
        raise payload_not_a_table(task_id, payload)
    description = payload.get("description")
    if isinstance(description, str) and len(description) > MAX_DESCRIPTION_CHARS:
        raise UserError(f"task {quoted(task_id)}: description: expected at most {MAX_DESCRIPTION_CHARS} "
                        f"characters, got {len(description)}")
    return check_json_value(f"task {quoted(task_id)}: payload", dict(payload), MAX_PAYLOAD_BYTES)


def misfire_policy_of(value: Any) -> MisfirePolicy:
    """The :class:`MisfirePolicy` ``value`` names, or the contract's refusal."""
    from .errors import bad_misfire_policy

    try:
        return MisfirePolicy(value)
    except ValueError:
        raise bad_misfire_policy(value) from None


def check_enabled(value: Any) -> bool:
    """An enabled flag must be a boolean; refused in the contract's words otherwise."""
    from .errors import bad_enabled_flag

    if not isinstance(value, bool):
        raise bad_enabled_flag(value)
    return value
