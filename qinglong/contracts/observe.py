"""What an operator observes: the store-derived figures behind ``/metrics`` and ``qinglong status``,
the metric names, and the status verdict.

Store-derived figures (:class:`StoreStats`) are read by one bounded statement (or one short read
transaction) per backend, the same on every replica of a cluster; process figures (rounds,
admissions and their lag, dispatches) are counted by the process that did the work. Metric names,
types and labels are fixed here, once, for the HTTP surface, the alert rules and the docs.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Mapping, Protocol, Sequence, runtime_checkable

from .frozen import record
from .windows import RECENT_WINDOW_MS

#: How long a store-derived read may take, and how long its result is served from cache, so a
#: scrape storm costs the database at most one read a second.
STATS_READ_TIMEOUT_MS = 1_000
STATS_CACHE_MS = 1_000

#: The window of the admission-lag percentiles and the skip/lost counts of ``qinglong status``.
LAG_WINDOW_MS = 5 * 60_000
#: The deepest per-task queues a stats reading carries (bounded, whatever the task count).
QUEUED_TASKS_SHOWN = 20

#: The states of a cluster worker's session (the ``state`` label of ``qinglong_workers``).
WORKER_STATES = ("live", "expired", "closed")

#: The states an Attempt ends in (the ``outcome`` label of ``qinglong_attempts_finished_total``).
ENDED_OUTCOMES = ("succeeded", "failed", "timed_out", "cancelled", "lost")


#: Run outcomes that count as a failure of the task (a cancelled Run is neither).
FAILED_OUTCOMES = ("failed", "timed_out", "lost")

#: The window of a task's success ratio, and how many failing tasks a reading lists (the worst
#: first: longest failure streak); ``tasks_failing`` counts them all.
OUTCOME_WINDOW_MS = 24 * 60 * 60_000
FAILING_TASKS_SHOWN = 20

#: How many Runs in a row a task may fail before it "has not succeeded within N periods" (each
#: Run of a scheduled task is one period of its trigger).
FAILURE_STREAK_PERIODS = 3


@record
class TaskOutcomes:
    """The outcome figures of one task, from its ended Runs (cancelled ones count in none):

    * ``last_outcome``: the state of its newest ended Run, ``last_finished_at_ms`` when;
    * ``failure_streak``: its Runs ended failed, timed out or lost since its last success;
    * ``last_success_at_ms``: when its newest succeeded Run ended (None: never, as far as the
      store remembers);
    * ``succeeded_in_window`` of ``ended_in_window``: over the last :data:`OUTCOME_WINDOW_MS`.
    """

    project_id: str
    task_id: str
    last_outcome: str
    last_finished_at_ms: int
    failure_streak: int
    last_success_at_ms: int | None
    succeeded_in_window: int
    ended_in_window: int

    @property
    def failing(self) -> bool:
        """Its newest ended Run did not succeed."""
        return self.last_outcome in FAILED_OUTCOMES

    @property
    def not_succeeded_within_periods(self) -> bool:
        """It has not succeeded within :data:`FAILURE_STREAK_PERIODS` Runs."""
        return self.failure_streak >= FAILURE_STREAK_PERIODS

    def describe(self) -> str:
        """One line: which task, how it last ended, its streak and its recent ratio."""
        words = self.last_outcome.replace("_", " ")
        line = (f"task {self.project_id}/{self.task_id} is failing: its last run {words}, "
                f"{self.failure_streak} in a row")
        if self.not_succeeded_within_periods:
            line += f" (no success within {FAILURE_STREAK_PERIODS} runs)"
        line += f"; {self.succeeded_in_window} of {self.ended_in_window} succeeded in the last 24 h"
        return line


def task_outcomes(row: Mapping[str, object]) -> TaskOutcomes:
    """A store's row of a failing task (the columns named as the fields) as :class:`TaskOutcomes`."""
    success = row["last_success_at_ms"]
    return TaskOutcomes(
        project_id=str(row["project_id"]), task_id=str(row["task_id"]),
        last_outcome=str(row["last_outcome"]), last_finished_at_ms=int(row["last_finished_at_ms"]),
        failure_streak=int(row["failure_streak"]),
        last_success_at_ms=None if success is None else int(success),
        succeeded_in_window=int(row["succeeded_in_window"]), ended_in_window=int(row["ended_in_window"]))


@record
class StoreStats:
    """One consistent reading of a store, at store time ``now_ms``.

    * ``schedules_total`` / ``schedules_enabled``: schedule rows (of enabled triggers of active
      projects, for the latter);
    * ``schedules_due``: enabled schedules whose occurrence is due at ``now_ms`` and not yet
      admitted (the backlog), awaiting initialization excluded; ``oldest_due_ms``: the scheduled
      time of the oldest of them (None when none is due);
    * ``runs_by_state``: Runs by :class:`~qinglong.contracts.execution.RunState` value (every
      state present, zeros included);
    * ``admission_lag_p50_ms`` / ``_p99_ms``: admitted minus scheduled over the Runs admitted in
      the last :data:`LAG_WINDOW_MS` from triggers (None when there were none);
      ``admitted_in_window``: how many;
    * ``skipped_recent``: occurrences recorded as skipped in the last :data:`RECENT_WINDOW_MS`;
    * ``lost_recent``: Attempts that ended ``lost`` in the last :data:`RECENT_WINDOW_MS`;
    * ``running``: Attempts holding a process now;
    * ``queued_by_task``: Runs waiting to start per task (``project/task``), the deepest
      :data:`QUEUED_TASKS_SHOWN` queues only;
    * ``workers_by_state`` / ``worker_free_slots``: cluster workers by session state (``live``:
      open, lease running; ``expired``: its lease ran out within :data:`RECENT_WINDOW_MS` and it
      did not close; ``closed``: closed within that window) and the free slots of the live ones
      (empty / None where no workers exist);
    * ``runs_without_worker``: queued Runs that no live worker can take (none is live, or none
      offers every label the Run requires); None where no workers exist;
    * ``attempts_finished``: ended Attempts the store holds, by outcome (every one of
      :data:`ENDED_OUTCOMES`); None where this process counts the ends itself;
    * ``tasks_failing``: tasks (not deleted, of active projects) whose newest ended Run failed,
      timed out or was lost; ``tasks_not_succeeding``: those of them that failed
      :data:`FAILURE_STREAK_PERIODS` Runs in a row or more; ``failing_tasks``: the figures of at most
      :data:`FAILING_TASKS_SHOWN` of them, longest failure streak first;
    * ``live_schedulers``: schedulers working the store (the owner lock on SQLite, live replicas
      on PostgreSQL); ``last_round_at_ms``: the newest completed round the store records.
    """

    now_ms: int
    schedules_total: int
    schedules_enabled: int
    schedules_due: int
    oldest_due_ms: int | None
    runs_by_state: Mapping[str, int]
    admission_lag_p50_ms: int | None
    admission_lag_p99_ms: int | None
    admitted_in_window: int
    skipped_recent: int
    lost_recent: int
    running: int
    live_schedulers: int
    last_round_at_ms: int | None = None
    workers_by_state: Mapping[str, int] = field(default_factory=dict)
    worker_free_slots: int | None = None
    runs_without_worker: int | None = None
    attempts_finished: Mapping[str, int] | None = None
    tasks_failing: int = 0
    tasks_not_succeeding: int = 0
    failing_tasks: tuple[TaskOutcomes, ...] = ()
    queued_by_task: Mapping[str, int] = field(default_factory=dict)

    @property
    def oldest_due_seconds(self) -> float:
        """How long the oldest due occurrence has waited (0 without a backlog)."""
        if self.oldest_due_ms is None:
            return 0.0
        return max(0, self.now_ms - self.oldest_due_ms) / 1000


@runtime_checkable
class StatsReader(Protocol):
    """The one bounded read behind ``/metrics`` and ``qinglong status`` (every reader offers it)."""

    async def store_stats(self) -> StoreStats:
        """Read :class:`StoreStats`; raise :class:`~qinglong.contracts.errors.StoreUnavailable`
        when the store cannot answer within :data:`STATS_READ_TIMEOUT_MS`."""
        ...


class MetricType(str, enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    INFO = "info"


@record
class MetricSpec:
    """A metric's fixed name (without a counter's ``_total`` suffix for prometheus_client, which
    adds it), type, help text and label names (low cardinality only: never a project, trigger or
    run id)."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()


#: Every metric the HTTP surface exports. Names as the operator sees them in the scrape.
METRICS: Sequence[MetricSpec] = (
    MetricSpec("qinglong_schedules_due", MetricType.GAUGE,
               "Schedules whose occurrence is due and not yet admitted (the backlog)."),
    MetricSpec("qinglong_schedule_oldest_due_seconds", MetricType.GAUGE,
               "How long the oldest due, unadmitted occurrence has waited."),
    MetricSpec("qinglong_schedules_total", MetricType.GAUGE, "Schedules, by whether they are enabled.",
               ("enabled",)),
    MetricSpec("qinglong_admission_lag_seconds", MetricType.HISTOGRAM,
               "Admitted minus scheduled time, per admission by this process."),
    MetricSpec("qinglong_admissions_total", MetricType.COUNTER, "Runs admitted by this process."),
    MetricSpec("qinglong_skipped_occurrences_total", MetricType.COUNTER,
               "Misfire decisions that passed over occurrences, by misfire policy.", ("policy",)),
    MetricSpec("qinglong_rounds_total", MetricType.COUNTER, "Scheduler rounds, by result.", ("result",)),
    MetricSpec("qinglong_round_duration_seconds", MetricType.HISTOGRAM, "Wall time of a scheduler round."),
    MetricSpec("qinglong_claims_total", MetricType.COUNTER, "Schedule rows claimed under a lease."),
    MetricSpec("qinglong_claim_races_total", MetricType.COUNTER,
               "Claims or decisions lost to a concurrent change, by kind.", ("kind",)),
    MetricSpec("qinglong_serialization_retries_total", MetricType.COUNTER,
               "Transactions retried after a serialization failure."),
    MetricSpec("qinglong_runs", MetricType.GAUGE, "Runs in the store, by state.", ("state",)),
    MetricSpec("qinglong_task_queued", MetricType.GAUGE,
               "Runs waiting to start, per task (the deepest queues).", ("project", "task")),
    MetricSpec("qinglong_dispatch_lag_seconds", MetricType.HISTOGRAM,
               "Admitted to process started, per Attempt started by this process."),
    MetricSpec("qinglong_attempts_finished_total", MetricType.COUNTER,
               "Attempts this process saw end, by outcome.", ("outcome",)),
    MetricSpec("qinglong_running", MetricType.GAUGE, "Attempts holding a process now."),
    MetricSpec("qinglong_workers", MetricType.GAUGE, "Cluster workers, by session state.", ("state",)),
    MetricSpec("qinglong_worker_free_slots", MetricType.GAUGE, "Free slots of live cluster workers."),
    MetricSpec("qinglong_runs_without_worker", MetricType.GAUGE,
               "Queued Runs no live cluster worker can take (none live, or none with their labels)."),
    MetricSpec("qinglong_status_verdict", MetricType.GAUGE,
               "The verdict of qinglong status from this process's readings: 0 clear, 10 converging, "
               "20 attention, 30 failing."),
    MetricSpec("qinglong_status_grace_seconds", MetricType.GAUGE,
               "How long a due occurrence may wait before it counts as late (the verdict's grace)."),
    MetricSpec("qinglong_tasks_failing", MetricType.GAUGE,
               "Tasks whose newest ended Run failed, timed out or was lost."),
    MetricSpec("qinglong_tasks_not_succeeding", MetricType.GAUGE,
               "Tasks that have not succeeded within their last FAILURE_STREAK_PERIODS Runs."),
    MetricSpec("qinglong_metrics_read_errors_total", MetricType.COUNTER,
               "Store reads behind a scrape that failed (the scrape served the last values)."),
    MetricSpec("qinglong_build_info", MetricType.INFO, "Version and profile of this process.",
               ("version", "profile")),
)

#: Buckets of the lag histograms (seconds): from a few ms (on time) to a lease and beyond.
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
ROUND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Verdict(enum.IntEnum):
    """``qinglong status``'s answer, as its exit code."""

    CLEAR = 0
    CONVERGING = 10   # a backlog, but shrinking
    ATTENTION = 20    # a growing backlog, lag over the grace, lost attempts, nobody scheduling
    FAILING = 30      # tasks whose last Run failed (whatever else the reasons say)


@record
class StatusFinding:
    verdict: Verdict
    reasons: tuple[str, ...]


def status_grace_ms(cadence_ms: int, lease_ms: int, *, leased: bool) -> int:
    """How long a due occurrence may wait before it counts as late: the one grace behind the
    verdict of ``qinglong status``, the status page, ``qinglong_status_verdict`` and the alert
    rules' lag threshold (``qinglong_status_grace_seconds``).

    Five cadences where one scheduler rounds every cadence (SQLite); three cadences and a claim
    lease where a claim that dies is taken over only after its lease (``leased``: the cluster),
    the same window after which a replica no longer counts as live.
    """
    return 3 * cadence_ms + lease_ms if leased else 5 * cadence_ms


def assess(before: StoreStats | None, now: StoreStats, *, grace_ms: int) -> StatusFinding:
    """The verdict every surface shows (``qinglong status``, the status page, the
    ``qinglong_status_verdict`` gauge): :func:`status_verdict` with workers expected where the
    store has them (``worker_free_slots`` is not None). ``grace_ms`` comes from
    :func:`status_grace_ms`."""
    return status_verdict(before, now, grace_ms=grace_ms, expect_workers=now.worker_free_slots is not None)


def _aged_backlog(stats: StoreStats, grace_ms: int) -> bool:
    """Whether the oldest due occurrence of ``stats`` has waited more than ``grace_ms``."""
    return (stats.schedules_due > 0 and stats.oldest_due_ms is not None
            and stats.now_ms - stats.oldest_due_ms > grace_ms)


def status_verdict(before: StoreStats | None, now: StoreStats, *, grace_ms: int,
                   expect_workers: bool = False) -> StatusFinding:
    """The verdict from one reading (and an earlier one, when taken, to see a backlog's trend).

    A *backlog* is due occurrences the oldest of which has waited more than ``grace_ms``:
    occurrences that have only just come due are being admitted on time (a reading taken between
    an occurrence and the round that admits it sees them), whatever their number.

    Attention: no live scheduler; lost Attempts in the recent window; queued Runs no live worker
    can take (``runs_without_worker``); other Runs waiting while no worker slot is free
    (``expect_workers``); a backlog without ``before`` to compare with, or one that
    is larger than at ``before``, or as large with the same oldest occurrence (nothing moves);
    admission lag p99 over ``grace_ms`` unless a backlog is draining (late admissions are what
    draining it looks like). Failing: a task whose newest ended Run failed, timed out or was lost
    (``tasks_failing``), whatever else holds (its reasons come first, then the others).
    Converging: a backlog smaller than at ``before``, or as large with a
    newer oldest occurrence, or one ``before`` had and that is gone now. Clear otherwise: then no
    reason is given.
    """
    attention: list[str] = []
    converging: list[str] = []
    if now.live_schedulers == 0:
        attention.append("no scheduler is running on this store")
    if now.lost_recent:
        attention.append(f"{now.lost_recent} attempt(s) lost in the last hour")
    stranded = now.runs_without_worker or 0
    if stranded:
        attention.append(f"{stranded} queued run(s) with no live worker able to take them "
                         "(no worker is live, or none offers the labels they require)")
    if expect_workers:
        waiting = now.runs_by_state.get("queued", 0) - stranded
        if waiting > 0 and (now.worker_free_slots or 0) == 0:
            attention.append(f"{waiting} run(s) waiting and no free worker slot")
    draining = False
    aged = _aged_backlog(now, grace_ms)
    if before is not None and _aged_backlog(before, grace_ms) and not aged:
        draining = True
        converging.append(f"the backlog drained ({before.schedules_due} -> {now.schedules_due} due, "
                          "none waiting over the grace)")
    elif aged:
        waited = f"the oldest due occurrence waits {now.oldest_due_seconds:.1f} s"
        if before is None:
            attention.append(f"{now.schedules_due} occurrence(s) due; {waited}, over the grace of "
                             f"{grace_ms} ms")
        elif now.schedules_due > before.schedules_due:
            attention.append(f"the backlog grows ({before.schedules_due} -> {now.schedules_due} due); "
                             f"{waited}")
        elif now.schedules_due < before.schedules_due or (
                before.oldest_due_ms is not None and now.oldest_due_ms > before.oldest_due_ms):
            draining = True
            converging.append(f"the backlog shrinks ({before.schedules_due} -> {now.schedules_due} "
                              f"due); {waited}")
        else:
            attention.append(f"the backlog does not move ({now.schedules_due} due); {waited}")
    if now.admission_lag_p99_ms is not None and now.admission_lag_p99_ms > grace_ms:
        late = f"admission lag p99 {now.admission_lag_p99_ms} ms is over the grace of {grace_ms} ms"
        (converging if draining else attention).append(late)
    failing = [task.describe() for task in now.failing_tasks]
    if now.tasks_failing > len(failing):
        failing.append(f"{now.tasks_failing - len(failing)} more task(s) failing")
    if failing:
        return StatusFinding(Verdict.FAILING, tuple(failing + attention + converging))
    if attention:
        return StatusFinding(Verdict.ATTENTION, tuple(attention + converging))
    if converging:
        return StatusFinding(Verdict.CONVERGING, tuple(converging))
    return StatusFinding(Verdict.CLEAR, ())


def workers_summary(stats: StoreStats) -> str:
    """Cluster workers in one line, as ``qinglong status`` and the status page say it: live ones
    (and those expired or closed in the last hour), free slots, queued Runs none can take."""
    by_state = stats.workers_by_state
    line = f"{by_state.get('live', 0)} live"
    gone = [f"{by_state[s]} {s}" for s in ("expired", "closed") if by_state.get(s)]
    if gone:
        line += f" ({', '.join(gone)} in the last hour)"
    slots = stats.worker_free_slots or 0
    line += f"; {slots} free slot{'' if slots == 1 else 's'}"
    if stats.runs_without_worker:
        line += f"; {stats.runs_without_worker} queued run(s) no live worker can take"
    return line


def nearest_rank(count: int, q: float) -> int:
    """The 1-based rank of the nearest-rank ``q`` percentile (0 < q <= 1) among ``count`` values
    (``count`` >= 1): ``ceil(q * count)``, at least 1 and at most ``count``. A store that ranks in
    SQL asks for this row, so it reports exactly what :func:`percentile` would."""
    import math

    return min(max(1, math.ceil(q * count)), count)


def percentile(sorted_values: Sequence[int], q: float) -> int | None:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of an ascending sequence, None if empty."""
    if not sorted_values:
        return None
    return sorted_values[nearest_rank(len(sorted_values), q) - 1]


__all__ = [name for name in dir() if not name.startswith("_")]
