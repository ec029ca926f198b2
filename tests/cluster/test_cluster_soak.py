"""Soak: replica processes (the real ``qinglong run``) killed and restarted at random while
thousands of every-second triggers fire; afterwards every expected occurrence exists exactly once.

The short form runs by default (300 triggers, 20 s, on PostgreSQL 18 and 15). With
``QINGLONG_SOAK=full`` the full form runs instead: 2,000 triggers firing every second for 60 s,
four replicas, on PostgreSQL 18. ``pytest -s`` prints the figures. ``QINGLONG_SOAK_SEED`` fixes
the kill schedule (the seed used is printed either way).

Each replica is ``python -m qinglong run --settings FILE`` with its own settings file, its own
pool and a distinct owner per start (``r2.g3``: replica 2, third start), so ``admitted_by``
shows which incarnation admitted what. Replicas are killed with SIGKILL at random moments (in a
round, between rounds, while still starting) and restarted after a short pause; the lease is
2.5 s so a dead replica's claims are taken over within the run. After the last kill the test
waits for conditions, not for a quiet period: every slot runs again and its incarnation has
admitted, no claim of a dead owner is left and every trigger has a Run; only then the orderly
stop. A loaded machine makes the soak longer, never failing. The misfire grace (10 minutes)
is longer than any stall a kill can cause, so every occurrence must be admitted, not skipped;
the audit still accepts skips recorded in ``schedule_skips``, and then exactly those.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.cluster import arun

FULL = os.environ.get("QINGLONG_SOAK", "").strip().lower() == "full"


@dataclass(frozen=True)
class SoakShape:
    """How big one soak is."""

    triggers: int
    seconds: float
    replicas: int
    kill_every_s: tuple[float, float]  # pause between two kills, uniform in this range
    down_for_s: tuple[float, float]    # how long a killed replica stays down
    lease_ms: int = 2_500
    claim_budget: int = 16
    grace_ms: int = 600_000


SHORT = SoakShape(triggers=300, seconds=20, replicas=4, kill_every_s=(2.0, 4.0), down_for_s=(0.2, 1.5))
FULL_SHAPE = SoakShape(triggers=2_000, seconds=60, replicas=4, kill_every_s=(3.0, 7.0),
                       down_for_s=(0.2, 2.0))
SHAPE = FULL_SHAPE if FULL else SHORT
BUILDS = ["pg18"] if FULL else ["pg18", "pg15"]

EVERY_SECOND = "* * * * * *"
SECOND_MS = 1_000
#: Overall bound on any wait for a condition or a process: a hang, never a speed requirement.
PATIENCE_S = 600.0


# --------------------------------------------------------------------------- replicas


@dataclass
class Replica:
    """One replica slot; each start is a new process with a new owner."""

    index: int
    workdir: Path
    runtime_dsn: str
    shape: SoakShape
    generation: int = 0
    proc: subprocess.Popen | None = None
    owners: list[str] = field(default_factory=list)
    exit_codes: list[tuple[str, int]] = field(default_factory=list)

    @property
    def owner(self) -> str:
        return f"r{self.index}.g{self.generation}"

    def settings_file(self) -> Path:
        path = self.workdir / f"{self.owner}.toml"
        dsn = self.runtime_dsn.replace("\\", "\\\\").replace('"', '\\"')
        path.write_text(
            'profile = "cluster"\n'
            "[scheduler]\n"
            f"claim_budget = {self.shape.claim_budget}\n"
            f"lease_ms = {self.shape.lease_ms}\n"
            "cadence_ms = 1000\n"
            f'owner = "{self.owner}"\n'
            "[backend]\n"
            f'runtime_dsn = "{dsn}"\n'
            "pool_min_size = 1\n"
            "pool_max_size = 2\n"
            "[diagnostics]\n"
            'level = "warning"\n'
        )
        return path

    def start(self) -> None:
        self.generation += 1
        self.owners.append(self.owner)
        log = open(self.workdir / f"{self.owner}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qinglong", "run", "--settings", str(self.settings_file())],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(self.workdir))
        log.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.exit_codes.append((self.owner, self.proc.wait(timeout=PATIENCE_S)))
        self.proc = None

    def stop(self, timeout: float = PATIENCE_S) -> int:
        """SIGTERM (the orderly stop drains the round in progress) and wait."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self.exit_codes.append((self.owner, code))
        self.proc = None
        return code

    def log_tail(self, owner: str, lines: int = 20) -> str:
        path = self.workdir / f"{owner}.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""


def chaos(replicas: list[Replica], shape: SoakShape, rng: random.Random, until: float) -> list[dict]:
    """Kill random replicas with SIGKILL at random moments until ``until`` (monotonic), restarting
    each after a short pause. Sometimes two die at once. At the end every replica still down is
    restarted at once (see :func:`settle` for what is waited for before the stop).
    Returns what was done."""
    done: list[dict] = []
    down: list[tuple[float, Replica]] = []  # (restart at, replica)
    last_kill = until
    next_kill = time.monotonic() + rng.uniform(*shape.kill_every_s)
    while time.monotonic() < until:
        now = time.monotonic()
        for item in [d for d in down if d[0] <= now]:
            down.remove(item)
            item[1].start()
        if next_kill <= now < last_kill:
            alive = [r for r in replicas if r.alive]
            victims = rng.sample(alive, k=min(len(alive), 2 if rng.random() < 0.2 else 1))
            for victim in victims:
                done.append({"at_s": round(now, 2), "owner": victim.owner})
                victim.kill9()
                down.append((now + rng.uniform(*shape.down_for_s), victim))
            next_kill = now + rng.uniform(*shape.kill_every_s)
        time.sleep(0.02)
    for _, replica in down:
        replica.start()
    return done


def settle(db, replicas: list[Replica], triggers: int) -> float:
    """Wait (within :data:`PATIENCE_S`) until every replica slot runs, its current incarnation
    has admitted a Run (it finished starting: SIGTERM will not land in its start-up), no claim of
    an earlier, killed incarnation is left (each expired and was taken over) and every trigger
    has a Run. Returns the seconds waited."""
    began = time.monotonic()
    current = [r.owner for r in replicas]
    while True:
        dead = [r for r in replicas if not r.alive]
        assert not dead, "a replica exited by itself:\n" + "\n---\n".join(r.log_tail(r.owner) for r in dead)
        admitting = {row[0] for row in db.sql(
            "SELECT DISTINCT admitted_by FROM qinglong.runs WHERE admitted_by = ANY(%s)", (current,))}
        orphaned = db.sql("SELECT count(*) FROM qinglong.trigger_schedules WHERE claim_owner IS NOT NULL "
                          "AND NOT claim_owner = ANY(%s)", (current,))[0][0]
        with_runs = db.sql("SELECT count(DISTINCT trigger_id) FROM qinglong.runs")[0][0]
        if admitting == set(current) and orphaned == 0 and with_runs == triggers:
            return time.monotonic() - began
        assert time.monotonic() - began < PATIENCE_S, (
            f"after the last kill, in {PATIENCE_S:.0f} s: incarnations admitting {sorted(admitting)} of "
            f"{current}, claims of killed incarnations left {orphaned}, triggers with a Run {with_runs}/{triggers}")
        time.sleep(0.2)


# --------------------------------------------------------------------------- publishing


def publish_every_second_triggers(db, n: int, grace_ms: int, concurrency: int = 2) -> None:
    """Publish ``n`` triggers firing every second through the real publisher (admin role)."""
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    async def body():
        backend = db.backend("publisher")
        try:
            pub = backend.publisher()
            await pub.create_project("soak")
            await pub.put_task("soak", "task", {"cmd": ["echo", "soak"]})
            queue = list(range(n))

            async def worker():
                while queue:
                    i = queue.pop()
                    await pub.put_trigger(TriggerDefinition(
                        "soak", f"s{i:05d}", "task", "cron", {"expression": EVERY_SECOND},
                        misfire_policy=MisfirePolicy.FIRE_ONCE, misfire_grace_ms=grace_ms))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            await backend.close()

    arun(body())


# --------------------------------------------------------------------------- audit


@dataclass
class Audit:
    """What the database holds after the soak, against what the cursors say was due."""

    triggers: int = 0
    expected: int = 0
    admitted: int = 0
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    skipped_recorded: int = 0
    skip_mismatches: int = 0
    never_admitted: int = 0
    bad_attempts: int = 0
    bad_events: int = 0
    duplicate_keys: int = 0
    claims_made: int = 0
    live_claims_at_end: int = 0
    lag_p50_ms: int = 0
    lag_p99_ms: int = 0
    worst_lag_ms: int = 0
    behind_at_end_ms: int = 0
    admitted_by: dict = field(default_factory=dict)
    examples: list = field(default_factory=list)


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def audit(db, claim_versions_before: int, stopped_at_ms: int) -> Audit:
    """Compare every Run with the occurrences each trigger's cursor says were due.

    For every trigger, the occurrences from its first admitted one up to its final cursor
    (exclusive) are every whole second; each must have exactly one Run unless a recorded skip
    covers it, and then none.
    """
    a = Audit()
    runs: dict[str, list[int]] = {}
    for trigger_id, scheduled in db.sql(
            "SELECT trigger_id, scheduled_for_ms FROM qinglong.runs ORDER BY 1, 2"):
        runs.setdefault(trigger_id, []).append(scheduled)
    skips: dict[str, list[tuple[int, int, int, bool]]] = {}
    for trigger_id, first, last, count, exact in db.sql(
            "SELECT trigger_id, first_skipped_ms, last_skipped_ms, skipped_count, count_exact "
            "FROM qinglong.schedule_skips"):
        skips.setdefault(trigger_id, []).append((first, last, count, exact))
    schedules = db.sql("SELECT trigger_id, next_fire_at_ms, claim_owner IS NOT NULL "
                       "FROM qinglong.trigger_schedules")
    a.triggers = len(schedules)
    for trigger_id, cursor, claimed in schedules:
        a.live_claims_at_end += bool(claimed)
        mine = runs.get(trigger_id, [])
        if not mine:
            a.never_admitted += 1
            continue
        a.behind_at_end_ms = max(a.behind_at_end_ms, stopped_at_ms - cursor)
        skipped: set[int] = set()
        for first, last, count, exact in skips.get(trigger_id, []):
            span = set(range(first, last + 1, SECOND_MS))
            a.skipped_recorded += len(span)
            if exact and len(span) != count:
                a.skip_mismatches += 1
            skipped |= span
        expected = set(range(mine[0], cursor, SECOND_MS)) - skipped
        seen: set[int] = set()
        for scheduled in mine:
            if scheduled in seen:
                a.duplicates += 1
                a.examples.append(("duplicate", trigger_id, scheduled))
            seen.add(scheduled)
        a.expected += len(expected)
        missing = expected - seen
        unexpected = seen - expected
        a.missing += len(missing)
        a.unexpected += len(unexpected)
        a.examples += [("missing", trigger_id, m) for m in sorted(missing)[:3]]
        a.examples += [("unexpected", trigger_id, u) for u in sorted(unexpected)[:3]]
    a.admitted = sum(len(v) for v in runs.values())
    a.examples = a.examples[:10]

    a.bad_attempts = db.sql(
        "SELECT count(*) FROM qinglong.runs r WHERE (SELECT count(*) FROM qinglong.attempts t "
        "WHERE t.run_id = r.run_id) <> 1")[0][0]
    a.bad_events = db.sql(
        "SELECT count(*) FROM qinglong.runs r WHERE (SELECT array_agg(e.event_type ORDER BY e.seq) "
        "FROM qinglong.run_events e WHERE e.run_id = r.run_id) "
        "IS DISTINCT FROM ARRAY['run.created', 'run.queued']")[0][0]
    a.duplicate_keys = db.sql(
        "SELECT count(*) - count(DISTINCT idempotency_key) FROM qinglong.runs")[0][0]
    # Every claim bumps claim_version. One claim may commit several decisions (an initialization
    # and the occurrence owed since the publish, or a backlog drained in one round), and some are
    # never committed (a killed holder's, taken over after the lease), so the count is a figure,
    # not something to balance against the Runs.
    a.claims_made = db.sql("SELECT sum(claim_version) FROM qinglong.trigger_schedules")[0][0] - claim_versions_before
    lags = sorted(r[0] for r in db.sql("SELECT admitted_at_ms - scheduled_for_ms FROM qinglong.runs"))
    a.lag_p50_ms, a.lag_p99_ms = _percentile(lags, 0.50), _percentile(lags, 0.99)
    a.worst_lag_ms = lags[-1] if lags else 0
    a.admitted_by = dict(db.sql("SELECT admitted_by, count(*) FROM qinglong.runs GROUP BY 1 ORDER BY 1"))
    return a


# --------------------------------------------------------------------------- the soak


@pytest.mark.soak
@pytest.mark.postgres
@pytest.mark.parametrize("pg_server", BUILDS, indirect=True)
def test_every_occurrence_is_admitted_exactly_once_while_replicas_are_killed_and_restarted(
        cluster, tmp_path):
    """If a kill -9 between claim and commit, or a takeover after the lease, could let two
    replicas commit one occurrence, the audit finds a duplicate Run; if a dead replica's claim
    were never taken over, or an occurrence were stepped over by a cursor advance, it finds a
    missing one."""
    shape = SHAPE
    seed_value = int(os.environ.get("QINGLONG_SOAK_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed_value)
    began = time.monotonic()
    publish_every_second_triggers(cluster, shape.triggers, shape.grace_ms)
    published_s = time.monotonic() - began
    claim_versions_before = cluster.sql("SELECT sum(claim_version) FROM qinglong.trigger_schedules")[0][0]

    replicas = [Replica(i + 1, tmp_path, cluster.dsn("qinglong_runtime"), shape)
                for i in range(shape.replicas)]
    for replica in replicas:
        replica.start()
    try:
        kills = chaos(replicas, shape, rng, until=time.monotonic() + shape.seconds)
        settled_s = settle(cluster, replicas, shape.triggers)
        stopping = time.monotonic()
        codes = {r.owner: r.stop() for r in replicas}
        stopped_at_ms = cluster.db_now_ms()
        stop_s = time.monotonic() - stopping
    finally:
        for replica in replicas:
            if replica.alive:
                replica.proc.kill()
                replica.proc.wait(timeout=PATIENCE_S)

    result = audit(cluster, claim_versions_before, stopped_at_ms)
    nominal = shape.triggers * int(shape.seconds)
    print(
        f"\nsoak {'full' if FULL else 'short'} on {cluster.server.label}: seed {seed_value}, "
        f"{shape.triggers} triggers every second, {shape.seconds:g} s, {shape.replicas} replicas, "
        f"lease {shape.lease_ms} ms, budget {shape.claim_budget}\n"
        f"  published in {published_s:.1f} s; settled {settled_s:.1f} s after the last kill; "
        f"orderly stop took {stop_s:.1f} s\n"
        f"  kills: {len(kills)} ({', '.join(k['owner'] for k in kills)})\n"
        f"  expected {result.expected} (nominal {nominal}), admitted {result.admitted}, "
        f"duplicates {result.duplicates}, missing {result.missing}, unexpected {result.unexpected}, "
        f"skipped (recorded) {result.skipped_recorded}\n"
        f"  lag p50 {result.lag_p50_ms} ms, p99 {result.lag_p99_ms} ms, worst {result.worst_lag_ms} ms; "
        f"furthest cursor behind at stop {result.behind_at_end_ms} ms\n"
        f"  claims made: {result.claims_made} for {result.admitted} Runs and {result.triggers} initializations, "
        f"still held at end: {result.live_claims_at_end}\n"
        f"  runs by owner: {result.admitted_by}"
    )
    # a killed start ends in SIGKILL, every orderly stop in 0; anything else is a crash
    failures = [f"{owner} exited with {code}:\n{r.log_tail(owner)}" for r in replicas
                for owner, code in r.exit_codes if code not in (0, -signal.SIGKILL)]
    assert not failures, "\n---\n".join(failures)
    assert set(codes.values()) == {0}, codes
    assert result.duplicates == 0 and result.duplicate_keys == 0, result.examples
    assert result.missing == 0 and result.unexpected == 0, result.examples
    assert result.skip_mismatches == 0
    assert result.never_admitted == 0, "some trigger was never admitted at all"
    assert result.bad_attempts == 0, "a Run without exactly one Attempt"
    assert result.bad_events == 0, "a Run without exactly run.created and run.queued"
    assert result.admitted == result.expected
    assert len(kills) >= 3
    # every claim a killed replica left behind expired and was taken over before the stop
    assert result.live_claims_at_end == 0
