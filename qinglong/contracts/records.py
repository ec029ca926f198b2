"""Profile-neutral records that cross the boundary between host, plugins and stores.

All times are integer epoch milliseconds (UTC). Records are frozen, slotted dataclasses so a
decision computed from them cannot be changed on its way into a transaction.
"""

from __future__ import annotations

import enum
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from .frozen import record

#: Cursor value of a trigger that will never fire again (its provider has no next occurrence).
#: Stores keep it as an ordinary BIGINT so the due scan never selects it.
NO_MORE_OCCURRENCES_MS = 2**63 - 1

#: Default misfire grace: an occurrence admitted up to one minute late still counts as on time.
DEFAULT_MISFIRE_GRACE_MS = 60_000

#: Largest misfire grace a trigger may declare (366 days). Larger values mean nothing a scheduler
#: can honour and overflow the stores' 64-bit arithmetic.
MAX_MISFIRE_GRACE_MS = 366 * 24 * 3600 * 1000


class MisfirePolicy(str, enum.Enum):
    """What to do when the oldest due occurrence is older than the trigger's misfire grace."""

    SKIP = "skip"
    """Advance the cursor past the observation time; admit nothing."""

    FIRE_ONCE = "fire_once"
    """Admit exactly one occurrence, the latest one due; never replay the backlog."""


def canonical_json(value: Any) -> str:
    """Serialise ``value`` deterministically (sorted keys, no spaces) for storage and digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_digest(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value``, as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def trigger_content_digest(
    project_id: str,
    trigger_id: str,
    task_id: str,
    kind: str,
    spec: Mapping[str, Any],
    misfire_policy: "MisfirePolicy",
    misfire_grace_ms: int,
    enabled: bool,
    jitter_ms: int = 0,
) -> str:
    """The content digest of a trigger revision, the same in every store.

    It covers everything that makes a revision (after the provider normalised the spec): a
    publish whose digest equals the current one is not a new revision; any change is. A jitter
    of 0 is left out, so a trigger without one keeps the digest it had before jitter existed.
    """
    content = {
        "project_id": project_id, "trigger_id": trigger_id, "task_id": task_id, "kind": kind,
        "spec": dict(spec), "misfire_policy": misfire_policy.value,
        "misfire_grace_ms": misfire_grace_ms, "enabled": enabled,
    }
    if jitter_ms:
        content["jitter_ms"] = jitter_ms
    return content_digest(content)


@record
class TriggerDefinition:
    """What an operator publishes: a trigger before it gets a revision.

    ``spec`` is the raw spec; the trigger's provider validates and normalises it before any write.
    """

    project_id: str
    trigger_id: str
    task_id: str
    kind: str
    spec: Mapping[str, Any]
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    misfire_grace_ms: int = DEFAULT_MISFIRE_GRACE_MS
    enabled: bool = True
    #: random delay window of each occurrence (``contracts.jitter``); 0: none
    jitter_ms: int = 0


@record
class TriggerHead:
    """The current revision of a trigger, as stored."""

    project_id: str
    trigger_id: str
    task_id: str
    trigger_revision: int
    kind: str
    spec: Mapping[str, Any] = field(hash=False)
    misfire_policy: MisfirePolicy
    misfire_grace_ms: int
    enabled: bool
    content_digest: str
    #: random delay window of each occurrence (``contracts.jitter``); 0: none
    jitter_ms: int = 0


@record
class ScheduleCursor:
    """A trigger's schedule cursor. ``next_fire_at_ms`` None means awaiting initialization.

    ``published_at_ms`` is when this trigger revision was published (the store's clock: database
    time on the cluster). Initialization takes the first occurrence strictly after it, so an
    occurrence between the publish and the scheduler's first look is still owed. None (a row
    written before the column existed) initializes from the observation.
    """

    trigger_revision: int
    next_fire_at_ms: int | None
    last_scheduled_at_ms: int | None
    state_version: int
    published_at_ms: int | None = None


@record
class ClaimFence:
    """The four-part lease fence of a cluster claim. All four must still match to commit."""

    owner: str
    token: str
    claim_version: int
    expires_at_ms: int


class DecisionKind(str, enum.Enum):
    """The outcome of :func:`qinglong.contracts.decision.decide`."""

    NOT_DUE = "not_due"
    INITIALIZE = "initialize"
    FIRE = "fire"
    MISFIRE_SKIP = "misfire_skip"
    MISFIRE_FIRE_ONCE = "misfire_fire_once"


@record
class SkippedOccurrences:
    """Occurrences a decision deliberately did not admit (misfire), for operators to see.

    ``count`` is exact when ``count_exact``; past the counting bound it is a lower bound.
    """

    first_ms: int
    last_ms: int
    count: int
    count_exact: bool = True


@record
class Decision:
    """What to do with one due schedule, computed outside any database lock.

    ``expected_next_fire_at_ms`` is the cursor the decision was made from; a store commits the
    decision only if the cursor still has that value (compare-and-set). ``next_fire_at_ms`` is the
    cursor after the commit. ``scheduled_for_ms`` is the occurrence to admit, if any.
    """

    kind: DecisionKind
    observed_at_ms: int
    trigger_revision: int
    expected_next_fire_at_ms: int | None
    next_fire_at_ms: int
    scheduled_for_ms: int | None = None
    skipped: SkippedOccurrences | None = None
    #: the delay the admitted occurrence drew: ``scheduled_for_ms`` minus its nominal time
    jitter_ms: int = 0

    @property
    def admits_run(self) -> bool:
        """True when committing this decision creates exactly one Run."""
        return self.scheduled_for_ms is not None

    @property
    def changes_cursor(self) -> bool:
        """True when committing this decision writes the schedule row."""
        return self.kind is not DecisionKind.NOT_DUE


@record
class Admission:
    """A Run admitted for one occurrence, with the identifiers allocated at admit time."""

    run_id: str
    attempt_id: str
    idempotency_key: str
    project_id: str
    trigger_id: str
    trigger_revision: int
    scheduled_for_ms: int
    admitted_at_ms: int


@record
class ProjectRecord:
    """A project: the unit that owns tasks and triggers. Inactive projects never fire."""

    project_id: str
    name: str
    active: bool


@record
class TaskRecord:
    """A task revision: what a Run will execute, with the digest that pins it."""

    project_id: str
    task_id: str
    task_revision: int
    payload: Mapping[str, Any] = field(hash=False)
    content_digest: str


@record
class RunView:
    """A Run as the reader shows it. ``lag_ms`` is admitted minus scheduled."""

    run_id: str
    project_id: str
    trigger_id: str
    trigger_revision: int
    scheduled_for_ms: int
    admitted_at_ms: int
    state: str
    idempotency_key: str
    #: the random delay its occurrence drew (``scheduled_for_ms`` is the delayed time)
    jitter_ms: int = 0

    @property
    def lag_ms(self) -> int:
        """How late the Run was admitted after its (delayed) occurrence."""
        return self.admitted_at_ms - self.scheduled_for_ms


@record
class ScheduleView:
    """A trigger's schedule as the reader shows it."""

    project_id: str
    trigger_id: str
    trigger_revision: int
    kind: str
    spec: Mapping[str, Any] = field(hash=False)
    enabled: bool
    misfire_policy: MisfirePolicy
    next_fire_at_ms: int | None
    last_scheduled_at_ms: int | None
    #: when this revision was published (store clock); lets a reader preview the first fire time
    #: of a schedule that no scheduler round has initialized yet
    published_at_ms: int | None = None
    #: the trigger's random delay window (``next_fire_at_ms`` is already the delayed time)
    jitter_ms: int = 0

    def lag_ms(self, now_ms: int) -> int:
        """How far behind the schedule is at ``now_ms`` (0 when not due or not initialized)."""
        if not self.enabled or self.next_fire_at_ms is None:
            return 0
        return max(0, now_ms - self.next_fire_at_ms)


@record
class SchedulerStatus:
    """Whether a scheduler is working this store, as a reader can tell.

    ``running`` is True while a scheduler process holds the store (edge: the owner lock) or a
    replica completed a round within its liveness window (cluster). ``last_round_at_ms`` is the
    store-clock time of the newest completed round when the store records it, else None.
    ``replicas`` counts the live schedulers (at most 1 on SQLite). A reader computes schedule lag
    up to ``now`` only while ``running``; a stopped scheduler's lag is not "growing", it is stopped.
    """

    running: bool
    last_round_at_ms: int | None = None
    replicas: int = 0


@record
class SkipView:
    """A recorded misfire: what a decision did not admit, and why."""

    project_id: str
    trigger_id: str
    trigger_revision: int
    policy: MisfirePolicy
    first_skipped_ms: int
    last_skipped_ms: int
    count: int
    count_exact: bool
    recorded_at_ms: int


@record
class RoundReport:
    """What one scheduler round did. Counters only; safe to log. Every field means the same on
    every backend (the conformance suite holds them to it):

    * ``scanned``: schedule rows the round read to decide (edge: its scan; cluster: its claims).
    * ``claimed``: rows claimed under a lease (0 on a store without claims).
    * ``initialized``: initializations committed (a new revision's cursor set).
    * ``admitted``: Runs admitted, one per committed decision that scheduled an occurrence (an
      on-time fire, or the one occurrence of a ``fire_once`` misfire).
    * ``skipped``: committed misfire decisions that passed over at least one occurrence, i.e. one
      per skip record the round wrote (what ``Reader.recent_skips`` lists): every ``skip``
      misfire, and a ``fire_once`` misfire that left older occurrences unadmitted (that decision
      counts in ``admitted`` too). A ``fire_once`` misfire whose only late occurrence was admitted
      skipped nothing and is not counted. Occurrences are not counted here: a skip record holds
      their number.
    * ``cas_misses``: decisions not committed because the schedule or its task changed after the
      decision (a republish or a task edit raced the round); nothing of them was written. The
      occurrence is decided again from the new state (a task edit: next round, against the new
      task revision; a republish: the new revision is initialized).
    * ``fence_lost``: claims another replica took over before the commit (0 without claims).
    * ``serialization_retries``: transactions retried after a serialization failure.
    * ``errors``: rows that could not be decided or committed, plus a failed round. A trigger of
      a kind without a loaded provider is reported on every backend as
      :attr:`~qinglong.contracts.diagnostics.RoundEvent.UNKNOWN_TRIGGER_KIND`; edge's scan reads
      it and counts an error, the cluster never claims it (another replica may have the provider)
      and names it at start-up instead.
    * ``duration_ms``: the round's wall time. ``more_due``: start the next round at once.
    * ``admission_lags_ms``: for each admission counted in ``admitted`` (when the backend records
      them), admitted minus scheduled time in ms: the per-admission figure behind the admission
      lag histogram. ``skipped_policies``: for each decision counted in ``skipped`` (when
      recorded), the misfire policy of its trigger (``skip`` or ``fire_once``).
    * ``claims_released``: claims given back undecided under the full fence (exhausted retries,
      a failed decision, a task republished between claim and commit), decided again next round
      (0 without claims).
    """

    scanned: int = 0
    claimed: int = 0
    initialized: int = 0
    admitted: int = 0
    skipped: int = 0
    cas_misses: int = 0
    fence_lost: int = 0
    serialization_retries: int = 0
    errors: int = 0
    duration_ms: int = 0
    more_due: bool = False
    admission_lags_ms: tuple[int, ...] = ()
    skipped_policies: tuple[str, ...] = ()
    claims_released: int = 0


#: The counters a round accumulates; :class:`RoundReport` and :class:`RoundTally` both hold them.
ROUND_COUNTERS = ("scanned", "claimed", "initialized", "admitted", "skipped", "cas_misses",
                  "fence_lost", "serialization_retries", "errors", "claims_released")

#: The per-event samples of one round (a lag per admission, a policy per skip record): reported
#: with the round, never summed into a loop's totals (they would grow without bound).
ROUND_SAMPLES = ("admission_lags_ms", "skipped_policies")


@dataclass(slots=True)
class RoundTally:
    """The counters of :class:`RoundReport` while a round (or a loop of rounds) counts them.

    The one mutable form of the round counters, with the same fields and meanings as
    :class:`RoundReport`: a backend counts one round in it (adding what only it needs in a
    subclass) and freezes it with :meth:`report`; a loop folds finished reports into one with
    :meth:`add`.
    """

    scanned: int = 0
    claimed: int = 0
    initialized: int = 0
    admitted: int = 0
    skipped: int = 0
    cas_misses: int = 0
    fence_lost: int = 0
    serialization_retries: int = 0
    errors: int = 0
    claims_released: int = 0
    more_due: bool = False
    admission_lags_ms: list[int] = field(default_factory=list)
    skipped_policies: list[str] = field(default_factory=list)

    def report(self, duration_ms: int) -> RoundReport:
        """The frozen :class:`RoundReport` of these counters and samples."""
        return RoundReport(**{name: getattr(self, name) for name in ROUND_COUNTERS},
                           **{name: tuple(getattr(self, name)) for name in ROUND_SAMPLES},
                           duration_ms=duration_ms, more_due=self.more_due)

    def add(self, report: RoundReport) -> None:
        """Add a finished round's counters to these (``more_due`` is a round's, not a sum)."""
        for name in ROUND_COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(report, name))


@record
class MigrationState:
    """One migration as seen by ``db status``: applied, pending, or drifted (checksum differs)."""

    version: int
    name: str
    checksum: str
    status: str  # "applied" | "pending" | "drifted" | "unknown"


@record
class RecoveryReport:
    """What startup recovery found: pristine queued work is left alone, anything else reported."""

    pristine_queued: int = 0
    candidates: tuple[str, ...] = ()
    #: Runs a remote worker's protocol holds (leased, or waiting again after a requeue or for a
    #: retry): owned by the workers and the lease expiry, neither pristine nor a candidate.
    worker_held: int = 0


def record_from_row(cls: type, row: Mapping[str, Any], **given: Any) -> Any:
    """A record of dataclass ``cls`` from a row read by column name (a ``sqlite3.Row``, a psycopg
    ``dict_row``): each field takes the column of its own name, unless ``given`` supplies the
    value (a parsed spec, an enum, a bool from SQLite's integer). A column that is missing is a
    ``KeyError`` naming it, never a value silently taken from the wrong position."""
    import dataclasses

    values = {}
    for f in dataclasses.fields(cls):
        values[f.name] = given[f.name] if f.name in given else row[f.name]
    return cls(**values)


#: How many ids one :func:`page_id_base` numbers: its last 16 bits.
PAGE_ID_SERIALS = 0x10000


def page_id_base() -> int:
    """A fresh random (version 4) UUID, as an int, with its last 16 bits clear. A page of
    admissions numbers its Run (and Attempt) ids ``base | 0``, ``base | 1``, ... so they sit side
    by side in every ``run_id`` index (a few leaf pages, not one each: fewer pages written, and on
    PostgreSQL fewer page-level SIRead locks that other replicas' pages would meet), and different
    pages lie at random places apart. Unique: the 106 random bits are drawn afresh for each base,
    and at most :data:`PAGE_ID_SERIALS` ids are numbered from one."""
    return uuid.uuid4().int & ~(PAGE_ID_SERIALS - 1)
