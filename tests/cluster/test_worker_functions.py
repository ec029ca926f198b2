"""The worker protocol's functions in PostgreSQL, called as the roles that call them for real.

No worker process: each test logs in as the gateway role (and as the runtime for the control
plane's functions) and calls the functions the way ``qinglong worker`` and the replicas do. Runs
are published through the real publisher and admitted by writing exactly the rows admission
writes (a queued Run, its claimed Attempt and the two admission events). Where a test needs a
lease to have run out it moves the lease's expiry (database time) into the past as the superuser:
what the database sees when the time has passed, without the test waiting for it (one test waits
for a real session lease to run out).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg
import pytest

from qinglong.contracts.execution import (
    ActiveRun,
    ConcurrencyMode,
    ConcurrencyPolicy,
    OverlapAction,
    overlap_decision,
)

from tests.support.cluster import arun, expire
from tests.support.aio import closing

INGRESS, RUNTIME = "qinglong_gateway", "qinglong_runtime"
_keys = itertools.count(1)


# ------------------------------------------------------------------------------------------------
# Helpers (shared with the other worker test modules)
# ------------------------------------------------------------------------------------------------


def publish(db, task_id: str, payload: dict, project: str = "p1") -> None:
    """Publish ``payload`` as task ``task_id`` through the real publisher (admin role)."""
    from qinglong.contracts.errors import AlreadyExists

    async def body():
        backend = db.backend("publisher")
        async with closing(backend):
            pub = backend.publisher()
            try:
                await pub.create_project(project)
            except AlreadyExists:
                pass
            await pub.put_task(project, task_id, payload)

    arun(body())


def admit(db, task_id: str, n: int = 1, project: str = "p1",
          max_queued: int | None = None) -> list[tuple[str, str]]:
    """Admit ``n`` Runs of the task's head revision, due now, in dispatch order; returns
    ``(run_id, attempt_id)`` of each. The rows are the ones admission writes (``max_queued``:
    the replica's bound written on each)."""
    now = db.db_now_ms()
    rev, digest = db.sql(
        "SELECT t.task_revision, e.content_digest FROM qinglong.tasks t "
        "JOIN qinglong.execution_revisions e ON e.project_id = t.project_id AND e.task_id = t.task_id "
        "AND e.task_revision = t.task_revision WHERE t.project_id = %s AND t.task_id = %s",
        (project, task_id))[0]
    made = []
    for i in range(n):
        run_id, attempt_id = str(uuid.uuid4()), str(uuid.uuid4())
        scheduled = now - 10_000 + next(_keys)  # due, and later admissions later in dispatch order
        db.sql("INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
               "task_revision, executor, execution_digest, scheduled_for_ms, admitted_at_ms, "
               "queued_at_ms, state, owned_by, idempotency_key, admitted_by, max_queued) VALUES (%s, %s, "
               "'tr', 1, %s, %s, 'remote_worker', %s, %s, %s, %s, 'queued', 'runtime', %s, 'test', %s)",
               (run_id, project, task_id, rev, digest, scheduled, now, now, f"k{uuid.uuid4()}", max_queued))
        db.sql("INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor, "
               "created_at_ms) VALUES (%s, %s, 1, 'claimed', 'remote_worker', %s)", (attempt_id, run_id, now))
        db.sql("INSERT INTO qinglong.run_events (event_id, run_id, seq, event_type, at_ms) VALUES "
               "(gen_random_uuid(), %s, 1, 'run.created', %s), (gen_random_uuid(), %s, 2, 'run.queued', %s)",
               (run_id, now, run_id, now))
        made.append((run_id, attempt_id))
    return made


def snapshot(db) -> dict:
    """Every row a worker call could change, to compare before and after a refused call."""
    tables = {"runs": "run_id", "attempts": "attempt_id", "run_events": "run_id, seq",
              "attempt_logs": "attempt_id, offset_bytes", "worker_sessions": "worker_id",
              "tasks": "project_id, task_id"}
    return {t: db.sql(f"SELECT * FROM qinglong.{t} ORDER BY {order}") for t, order in tables.items()}


def sqlstate_of(call) -> str | None:
    """The SQLSTATE ``call()`` raised (None when it succeeded)."""
    try:
        call()
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


@dataclass
class Claimed:
    run_id: str
    attempt_id: str
    attempt_no: int
    lease_version: int
    token: bytes = field(repr=False)
    lease_expires_at_ms: int = 0
    payload_json: str = ""


class Worker:
    """One worker's calls, as the gateway role, each its own autocommit transaction."""

    def __init__(self, db, worker_id: str, labels=(), capacity: int = 16, lease_ms: int = 30_000,
                 role: str = INGRESS) -> None:
        self.db = db
        self.worker_id = worker_id
        self.conn = psycopg.connect(db.dsn(role), autocommit=True)
        self.session_id, self.generation, self.lease_expires_at_ms, _ = self.conn.execute(
            "SELECT * FROM qinglong.worker_open_session(%s, %s::text[], %s, %s)",
            (worker_id, list(labels), capacity, lease_ms)).fetchone()

    def close_connection(self) -> None:
        self.conn.close()

    def _fence(self):
        return (self.worker_id, self.session_id, self.generation)

    def heartbeat(self, running=()) -> dict:
        expires, now, ids, reasons = self.conn.execute(
            "SELECT * FROM qinglong.worker_heartbeat(%s, %s, %s, %s::uuid[])",
            (*self._fence(), [str(r) for r in running])).fetchone()
        return {str(i): r for i, r in zip(ids, reasons)}

    def claim(self, n: int = 1) -> list[Claimed]:
        tokens = [os.urandom(32) for _ in range(n)]
        rows = self.conn.execute("SELECT * FROM qinglong.worker_claim(%s, %s, %s, %s::bytea[])",
                                 (*self._fence(), tokens)).fetchall()
        return [Claimed(str(r[0]), str(r[1]), r[2], r[3], tokens[r[4] - 1], r[5], r[10]) for r in rows]

    def started(self, c: Claimed, token: bytes | None = None, lease_version: int | None = None):
        return self.conn.execute(
            "SELECT * FROM qinglong.worker_started(%s, %s, %s, %s, %s, %s)",
            (*self._fence(), c.attempt_id, c.lease_version if lease_version is None else lease_version,
             c.token if token is None else token)).fetchone()

    def append(self, c: Claimed, offset: int, data: bytes, token: bytes | None = None) -> int:
        return self.conn.execute(
            "SELECT qinglong.worker_append_log(%s, %s, %s, %s, %s, %s, %s, %s)",
            (*self._fence(), c.attempt_id, c.lease_version, c.token if token is None else token,
             offset, data)).fetchone()[0]

    def complete(self, c: Claimed, state: str = "succeeded", exit_code: int | None = 0,
                 log_bytes: int = 0, *, signal: int | None = None, dropped: int = 0,
                 reason: str | None = None, started: bool = True, token: bytes | None = None) -> tuple:
        return self.conn.execute(
            "SELECT * FROM qinglong.worker_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (*self._fence(), c.attempt_id, c.lease_version, c.token if token is None else token, state,
             exit_code, signal, log_bytes, dropped, reason, started)).fetchone()

    def close(self) -> None:
        self.conn.execute("SELECT qinglong.worker_close_session(%s, %s, %s)", self._fence())


def runtime_call(db, statement: str, params=()):
    """One control-plane call as the runtime role (autocommit)."""
    with psycopg.connect(db.dsn(RUNTIME), autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def age_session(db, worker: Worker, *, attempts_only: bool = False) -> None:
    """Move the session's lease (and its Attempts' leases) into the past in database time: what
    the database sees once the lease ran out without a heartbeat."""
    past = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1"
    db.sql(f"UPDATE qinglong.attempts SET lease_expires_at_ms = {past} WHERE session_id = %s "
           "AND state IN ('dispatching', 'running')", (worker.session_id,))
    if not attempts_only:
        db.sql(f"UPDATE qinglong.worker_sessions SET lease_expires_at_ms = {past} WHERE session_id = %s",
               (worker.session_id,))


def run_row(db, run_id: str) -> tuple:
    return db.sql("SELECT state, reason, finished_at_ms IS NOT NULL FROM qinglong.runs WHERE run_id = %s",
                  (run_id,))[0]


def attempts_of(db, run_id: str) -> list[tuple]:
    return db.sql("SELECT attempt_no, state, not_before_ms, lease_version, reason FROM qinglong.attempts "
                  "WHERE run_id = %s ORDER BY attempt_no", (run_id,))


def events_of(db, run_id: str) -> list[str]:
    return [r[0] for r in db.sql("SELECT event_type FROM qinglong.run_events WHERE run_id = %s ORDER BY seq",
                                 (run_id,))]


CMD = {"command": ["true"]}
RETRY_LOST = {"command": ["true"], "idempotent": True,
              "retry": {"max_attempts": 3, "initial_backoff_ms": 0, "jitter": 0}}


# ------------------------------------------------------------------------------------------------
# What the functions read: the pinned, normalised execution spec
# ------------------------------------------------------------------------------------------------


def test_put_task_pins_the_normalised_spec_and_refuses_an_invalid_one_writing_nothing(cluster):
    """The functions read every policy from the pinned spec (no default lives in SQL): a spec
    stored without its defaults written out, or an invalid one stored at all, would make a worker
    run a Run under a policy nobody published."""
    import json

    from qinglong.contracts.errors import UserError
    from qinglong.contracts.execution import parse_execution_spec, spec_to_payload

    payload = {"command": ["sh", "-c", "exit 3"], "retry": 2, "labels": ["gpu"], "data": {"k": 1}}
    publish(cluster, "t", payload)
    publish(cluster, "plain", {"cmd": ["echo"]})
    specs = dict(cluster.sql("SELECT task_id, spec_json FROM qinglong.execution_revisions"))
    assert json.loads(specs["t"])["execution"] == spec_to_payload(parse_execution_spec("t", payload))
    assert json.loads(specs["plain"])["execution"] is None
    before = snapshot(cluster)
    with pytest.raises(UserError, match="retry.max_attempts"):
        publish(cluster, "t", {"command": ["true"], "retry": {"max_attempts": 0}})
    with pytest.raises(UserError, match="timeout_ms: given without a command"):
        publish(cluster, "new", {"timeout_ms": 5000})
    assert snapshot(cluster) == before


# ------------------------------------------------------------------------------------------------
# Fences
# ------------------------------------------------------------------------------------------------


def test_stale_generation_wrong_token_or_expired_lease_is_refused_and_changes_nothing(cluster):
    """Without the whole fence on every call, a worker holding an old token, version or session
    could start, log into or end an Attempt another worker now runs: a job run twice, or an
    outcome invented by the wrong process."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 2)
    w = Worker(cluster, "w1")
    first, second = w.claim(2)
    w.started(first)
    bad = os.urandom(32)
    before = snapshot(cluster)
    refusals = {
        "wrong token, started": (lambda: w.started(second, token=bad), "QL002"),
        "wrong lease version, started": (lambda: w.started(second, lease_version=second.lease_version + 1), "QL002"),
        "wrong token, log": (lambda: w.append(first, 0, b"x", token=bad), "QL002"),
        "wrong token, complete": (lambda: w.complete(first, token=bad), "QL002"),
        "another attempt's token": (lambda: w.complete(first, token=second.token), "QL002"),
        "unknown attempt": (lambda: w.started(Claimed(first.run_id, str(uuid.uuid4()), 1, 1, first.token)), "QL002"),
    }
    for name, (call, code) in refusals.items():
        assert sqlstate_of(call) == code, name
        assert snapshot(cluster) == before, name

    # a wrong session id, then a stale generation (the worker id opened a newer session)
    impostor = Worker(cluster, "w2")
    impostor.worker_id, impostor.generation = "w1", w.generation
    before = snapshot(cluster)
    assert sqlstate_of(lambda: impostor.complete(first)) == "QL001"
    assert snapshot(cluster) == before
    newer = Worker(cluster, "w1")
    assert newer.generation == w.generation + 1
    before = snapshot(cluster)
    for name, call in {"heartbeat": lambda: w.heartbeat([first.attempt_id]), "claim": lambda: w.claim(1),
                       "started": lambda: w.started(second), "log": lambda: w.append(first, 0, b"x"),
                       "complete": lambda: w.complete(first), "close": w.close}.items():
        assert sqlstate_of(call) == "QL001", name
        assert snapshot(cluster) == before, name

    # an expired lease under a live session
    w3 = Worker(cluster, "w3")
    admit(cluster, "t", 1)
    (third,) = w3.claim(1)
    w3.started(third)
    age_session(cluster, w3, attempts_only=True)
    before = snapshot(cluster)
    for name, call in {"log": lambda: w3.append(third, 0, b"x"), "complete": lambda: w3.complete(third),
                       "started again": lambda: w3.started(third)}.items():
        assert sqlstate_of(call) == "QL002", name
        assert snapshot(cluster) == before, name


def test_a_heartbeat_renews_the_session_and_every_attempt_it_holds_to_one_expiry(cluster):
    """If a heartbeat renewed the session but not its Attempts' leases, expiry would take a
    healthy worker's running jobs away from it (and hand them to another: run twice)."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 3)
    w = Worker(cluster, "w1", lease_ms=5_000)
    held = w.claim(2)
    w.started(held[0])
    w.heartbeat([c.attempt_id for c in held])
    (session_expiry,) = cluster.sql("SELECT lease_expires_at_ms FROM qinglong.worker_sessions")[0]
    leases = cluster.sql("SELECT DISTINCT lease_expires_at_ms FROM qinglong.attempts "
                         "WHERE state IN ('dispatching', 'running')")
    assert leases == [(session_expiry,)]
    assert session_expiry >= w.lease_expires_at_ms


def test_a_session_whose_lease_ran_out_in_database_time_is_refused(cluster):
    """A worker that stopped heartbeating (partitioned) must be refused once its lease ran out by
    the database clock, or it could still claim and complete while another worker runs its job."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 1)
    w = Worker(cluster, "w1", lease_ms=5_000)
    deadline = time.monotonic() + 60
    while cluster.db_now_ms() <= w.lease_expires_at_ms:
        assert time.monotonic() < deadline, "the database clock did not pass the lease"
        time.sleep(0.2)
    before = snapshot(cluster)
    assert sqlstate_of(lambda: w.heartbeat()) == "QL001"
    assert sqlstate_of(lambda: w.claim(1)) == "QL001"
    assert snapshot(cluster) == before


def test_bad_arguments_are_refused_with_ql003_and_change_nothing(cluster):
    """A caller bug (a huge chunk, a short token, a state that is not an end) must be refused in
    words, not stored: a 1 MiB chunk or a 1-byte token would break the log bound or the lease."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    before = snapshot(cluster)
    with psycopg.connect(cluster.dsn(INGRESS), autocommit=True) as conn:
        calls = {
            "open: capacity 0": lambda: conn.execute(
                "SELECT * FROM qinglong.worker_open_session('x', '{}', 0, 10000)"),
            "open: lease too short": lambda: conn.execute(
                "SELECT * FROM qinglong.worker_open_session('x', '{}', 1, 10)"),
            "open: bad label": lambda: conn.execute(
                "SELECT * FROM qinglong.worker_open_session('x', ARRAY['a b'], 1, 10000)"),
            "open: control character in id": lambda: conn.execute(
                "SELECT * FROM qinglong.worker_open_session(E'x\\n', '{}', 1, 10000)"),
            "claim: short token": lambda: conn.execute(
                "SELECT * FROM qinglong.worker_claim(%s, %s, %s, ARRAY['\\x01'::bytea])", w._fence()),
            "complete: not an end": lambda: w.complete(c, state="running"),
            "complete: exit code 300": lambda: w.complete(c, exit_code=300),
            "log: chunk over 256 KiB": lambda: w.append(c, 0, b"x" * (262_144 + 1)),
            "log: negative offset": lambda: w.append(c, -1, b"x"),
        }
        for name, call in calls.items():
            assert sqlstate_of(call) == "QL003", name
            assert snapshot(cluster) == before, name
    with psycopg.connect(cluster.dsn(INGRESS)) as conn:
        # a snapshot older than the task lock would miss another worker's start ('forbid' twice)
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert sqlstate_of(lambda: conn.execute(
            "SELECT * FROM qinglong.worker_claim(%s, %s, %s, ARRAY[%s::bytea])",
            (*w._fence(), os.urandom(32)))) == "QL003"
        conn.rollback()
    for statement, params in (("SELECT qinglong.request_cancel(%s, 'whim')", (c.run_id,)),
                              ("SELECT qinglong.expire_attempt(%s, 1, 'gone', NULL, NULL, NULL, NULL)",
                               (str(uuid.uuid4()),)),
                              ("SELECT qinglong.prune_attempt_logs(0, 0)", ())):
        assert sqlstate_of(lambda: runtime_call(cluster, statement, params)) == "QL003", statement
    assert snapshot(cluster) == before


# ------------------------------------------------------------------------------------------------
# Claim
# ------------------------------------------------------------------------------------------------


def test_two_sessions_racing_claims_lease_every_attempt_exactly_once(cluster):
    """Two workers claiming at the same time must never both receive one Attempt: that Run
    would run twice."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 120)
    workers = [Worker(cluster, f"w{i}", capacity=256) for i in range(2)]
    got: list[list[Claimed]] = [[], []]
    barrier = threading.Barrier(2)
    errors = []

    def loop(i):
        try:
            barrier.wait()
            while True:
                batch = workers[i].claim(7)
                if not batch:
                    return
                got[i].extend(batch)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors
    ids = [c.attempt_id for batch in got for c in batch]
    assert len(ids) == len(set(ids)) == 120
    assert cluster.count("attempts", "state = 'dispatching'") == 120
    assert cluster.count("run_events", "event_type = 'run.dispatching'") == 120


def test_claim_takes_due_attempts_in_dispatch_order_up_to_the_free_capacity(cluster):
    """Claiming past the session's capacity would start more jobs than the worker can hold; out
    of order, a backlog's oldest Runs could wait for ever."""
    publish(cluster, "t", CMD)
    runs = admit(cluster, "t", 5)
    w = Worker(cluster, "w1", capacity=3)
    first = w.claim(2)
    assert [c.run_id for c in first] == [r for r, _ in runs[:2]]
    assert [c.lease_version for c in first] == [1, 1]
    assert [c.run_id for c in w.claim(5)] == [runs[2][0]]  # one slot left
    assert w.claim(5) == []
    w.started(first[0])
    w.complete(first[0])
    assert [c.run_id for c in w.claim(5)] == [runs[3][0]]
    payload = first[0].payload_json
    assert '"command":["true"]' in payload.replace(" ", "")


def test_an_unbounded_tasks_runs_are_claimed_in_parallel_while_a_bounded_task_is_decided_once(cluster):
    """A task with no concurrency bound must not serialise the workers (one claim in flight
    would leave every other worker empty-handed: no scaling); a bounded one ('queue' here) is
    decided by one claim at a time, and a claim never waits for another one's decision."""
    publish(cluster, "free", CMD)
    publish(cluster, "one", {"command": ["true"], "concurrency": "queue"})
    admit(cluster, "one", 2)
    admit(cluster, "free", 4)
    a, b = Worker(cluster, "a"), Worker(cluster, "b")
    with psycopg.connect(cluster.dsn(INGRESS)) as held:  # a's claim, not committed yet
        rows = held.execute("SELECT task_id FROM qinglong.worker_claim(%s, %s, %s, %s::bytea[])",
                            (*a._fence(), [os.urandom(32) for _ in range(2)])).fetchall()
        assert sorted(r[0] for r in rows) == ["free", "one"]
        got = b.claim(8)  # returns at once: a holds its rows and the bounded task's decision
        assert sorted(c.payload_json.count("queue") for c in got) == [0, 0, 0]
        held.commit()
    assert b.claim(8) == []  # 'one' has its one Run running: the next waits
    assert cluster.count("runs", "task_id = 'one' AND state = 'queued'") == 1


def run_skips(db, run_id: str | None = None) -> list[tuple]:
    """The skip records (run id, reason), oldest first; of one Run when ``run_id``."""
    return [(str(r), why) for r, why in db.sql(
        "SELECT run_id, reason FROM qinglong.run_skips WHERE %s::uuid IS NULL OR run_id = %s::uuid "
        "ORDER BY skip_seq", (run_id, run_id))]


def gone(db, run_id: str) -> bool:
    """No row of the Run is left (Run, Attempts, events)."""
    return sum(db.count(t, "run_id = %s", (run_id,)) for t in ("runs", "attempts", "run_events")) == 0


def test_forbid_never_runs_two_and_the_newcomer_becomes_a_skip_record_with_the_reason(cluster):
    """'forbid' must hold cluster-wide: two workers must never both start a Run of the task,
    and a Run that would overlap is skipped saying why instead of waiting for ever. The skip is
    a skip record, not a cancelled Run: kept as a Run, `skips` showed 0 while 97 Runs were
    skipped. Its end is still announced (the outbox row any end writes)."""
    publish(cluster, "f", {"command": ["true"], "concurrency": "forbid"})
    (r1, _), (r2, _) = admit(cluster, "f", 2)
    w1, w2 = Worker(cluster, "w1"), Worker(cluster, "w2")
    (c,) = w1.claim(4)
    assert c.run_id == r1
    assert w2.claim(4) == []
    assert gone(cluster, r2)
    ((_, reason),) = run_skips(cluster, r2)
    assert reason == f"skipped: concurrency 'forbid' and run {r1} of this task is still running"
    assert cluster.sql("SELECT kind, reason FROM qinglong.event_outbox WHERE run_id = %s", (r2,)) == [
        ("run.cancelled", reason)]


@pytest.mark.parametrize("mode", ["queue", "allow"])
def test_a_tasks_waiting_runs_beyond_max_queued_become_skip_records_and_the_oldest_stay(cluster, mode):
    """Without the bound a 'queue' or 'allow' backlog grew without limit (75 and 39 Runs waiting
    and growing on a per-second trigger of 3 s jobs): the claim must go on past a task's first
    waiting Run and skip those beyond the bound the admitting replica wrote on them, keeping the
    oldest in order. Runs admitted without a bound still wait, as before."""
    max_running = 1 if mode == "allow" else None
    publish(cluster, "q", {"command": ["true"], "concurrency": {"mode": mode, "max_running": max_running}
                           if max_running else mode})
    runs = [r for r, _ in admit(cluster, "q", 6, max_queued=2)]
    unbounded = [r for r, _ in admit(cluster, "q", 2)]
    w = Worker(cluster, "w1")
    (c,) = w.claim(4)
    assert c.run_id == runs[0]
    waiting = [r for (r,) in cluster.sql("SELECT run_id::text FROM qinglong.runs WHERE task_id = 'q' "
                                         "AND state = 'queued' ORDER BY scheduled_for_ms")]
    assert waiting == runs[1:3] + unbounded
    expected = overlap_decision(ConcurrencyPolicy(ConcurrencyMode(mode), max_running), [ActiveRun(runs[0], 0)],
                                2, max_queued=2)
    assert expected.action is OverlapAction.SKIP
    assert run_skips(cluster) == [(r, expected.reason) for r in runs[3:]]
    assert all(gone(cluster, r) for r in runs[3:])
    # the next claims find the same backlog: nothing more is skipped, nothing starts early
    assert w.claim(4) == []
    assert len(run_skips(cluster)) == 3
    w.started(c)
    w.complete(c)
    assert [x.run_id for x in w.claim(4)] == [runs[1]]


def test_a_worker_cannot_change_the_bound_the_replica_wrote_on_a_run(cluster):
    """max_queued is written by the admitting replica: a worker able to raise it could let its
    task's backlog grow without limit again (or lower it to skip other Runs)."""
    publish(cluster, "q", {"command": ["true"], "concurrency": "queue"})
    ((run_id, _),) = admit(cluster, "q", 1, max_queued=2)
    with psycopg.connect(cluster.dsn(INGRESS), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE qinglong.runs SET max_queued = 100000 WHERE run_id = %s", (run_id,))
    assert cluster.sql("SELECT max_queued FROM qinglong.runs WHERE run_id = %s", (run_id,)) == [(2,)]


def test_a_skipped_runs_idempotency_key_admits_nothing_again_even_racing_the_skip(cluster):
    """Once a skipped Run's row leaves, its key must stay taken: a sender's retried event (or any
    second admission of the key) would otherwise run what was skipped. An insert that races the
    skip waits for it and then finds the skip record, so it inserts nothing either."""
    publish(cluster, "f", {"command": ["true"], "concurrency": "forbid"})
    (r1, _), (r2, _) = admit(cluster, "f", 2)
    (r3, _), = admit(cluster, "f", 1)
    key2, key3 = (cluster.sql("SELECT idempotency_key FROM qinglong.runs WHERE run_id = %s", (r,))[0][0]
                  for r in (r2, r3))
    rev, digest = cluster.sql("SELECT task_revision, execution_digest FROM qinglong.runs WHERE run_id = %s",
                              (r1,))[0]
    insert = ("INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
              "task_revision, executor, execution_digest, scheduled_for_ms, admitted_at_ms, state, owned_by, "
              "idempotency_key, admitted_by) VALUES (gen_random_uuid(), 'p1', 'tr', 1, 'f', %s, 'remote_worker', "
              "%s, 0, 0, 'queued', 'runtime', %s, 'test') ON CONFLICT (idempotency_key) DO NOTHING RETURNING run_id")
    w = Worker(cluster, "w1")
    holder = psycopg.connect(cluster.dsn(INGRESS))  # the claim's transaction stays open
    try:
        rows = holder.execute("SELECT * FROM qinglong.worker_claim(%s, %s, %s, %s::bytea[])",
                              (w.worker_id, w.session_id, w.generation, [os.urandom(32)] * 4)).fetchall()
        assert [str(r[0]) for r in rows] == [r1]  # r2 and r3 skipped, not committed yet
        racer = psycopg.connect(cluster.dsn(RUNTIME), autocommit=True)
        pid = racer.info.backend_pid
        result: list = []
        thread = threading.Thread(target=lambda: result.append(racer.execute(insert, (rev, digest, key2)).fetchall()))
        thread.start()
        # the racing insert waits on the skipped Run's row lock (an event, not a delay)
        deadline = time.monotonic() + 60
        while cluster.sql("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)) != [("Lock",)]:
            assert time.monotonic() < deadline and thread.is_alive(), "the insert did not wait for the skip"
            time.sleep(0.01)
        holder.commit()
        thread.join(60)
        racer.close()
    finally:
        holder.close()
    assert result == [[]]
    with psycopg.connect(cluster.dsn(RUNTIME), autocommit=True) as conn:
        assert conn.execute(insert, (rev, digest, key3)).fetchall() == []
    assert cluster.count("runs", "idempotency_key IN (%s, %s)", (key2, key3)) == 0
    assert [r for r, _ in run_skips(cluster)] == [r2, r3]


def test_forbid_and_queue_hold_under_concurrent_claims(cluster):
    """Serialising each task's start decision is what keeps two workers that claim at the same
    instant from both starting a 'forbid' or 'queue' task (both would see nothing running)."""
    publish(cluster, "f", {"command": ["true"], "concurrency": "forbid"})
    publish(cluster, "q", {"command": ["true"], "concurrency": "queue"})
    workers = [Worker(cluster, f"w{i}", capacity=64) for i in range(3)]
    for _ in range(8):
        admit(cluster, "f", 2)
        admit(cluster, "q", 2)
        barrier = threading.Barrier(len(workers))
        claimed: list[tuple[Worker, Claimed]] = []
        lock = threading.Lock()

        def go(w):
            barrier.wait()
            batch = w.claim(8)
            with lock:
                claimed.extend((w, c) for c in batch)

        threads = [threading.Thread(target=go, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        active = cluster.sql("SELECT task_id, count(*) FROM qinglong.runs WHERE state IN "
                             "('dispatching', 'running') GROUP BY task_id")
        assert all(n <= 1 for _, n in active), active
        for w, c in claimed:
            w.started(c)
            w.complete(c)
    assert cluster.count("runs", "task_id = 'q' AND state = 'cancelled'") == 0


def test_queue_starts_one_at_a_time_in_scheduled_order(cluster):
    """'queue' must run every Run, one after the other in order; starting a later one first or
    two at once breaks what the task asked for."""
    publish(cluster, "q", {"command": ["true"], "concurrency": "queue"})
    runs = admit(cluster, "q", 3)
    w = Worker(cluster, "w1")
    done = []
    for expected_run, _ in runs:
        batch = w.claim(3)
        assert [c.run_id for c in batch] == [expected_run]
        assert w.claim(3) == []
        w.started(batch[0])
        w.complete(batch[0])
        done.append(expected_run)
    assert [run_row(cluster, r)[0] for r in done] == ["succeeded"] * 3


def test_replace_requests_the_cancel_of_the_running_run_and_starts_after_it_ended(cluster):
    """'replace' must stop the old Run (through its worker's heartbeat) before the new one
    starts: both running at once, or the old one never told, breaks the policy."""
    publish(cluster, "r", {"command": ["true"], "concurrency": "replace"})
    (r1, _), = admit(cluster, "r", 1)
    w = Worker(cluster, "w1")
    (old,) = w.claim(1)
    w.started(old)
    (r2, _), = admit(cluster, "r", 1)
    assert w.claim(1) == []
    assert w.heartbeat([old.attempt_id]) == {old.attempt_id: "replaced"}
    assert w.claim(1) == []  # waits until the replaced one has ended
    assert w.complete(old, "cancelled", None, signal=15, reason="replaced by a newer run of the task")[0] == "accepted"
    assert run_row(cluster, r1)[0] == "cancelled"
    assert [c.run_id for c in w.claim(1)] == [r2]
    assert "run.cancel_requested" in events_of(cluster, r1)


def test_max_running_bounds_the_tasks_active_runs_across_workers(cluster):
    """concurrency.max_running is a cluster-wide bound: each worker counting only its own jobs
    would run max_running per worker."""
    publish(cluster, "m", {"command": ["true"], "concurrency": {"mode": "allow", "max_running": 2}})
    admit(cluster, "m", 5)
    w1, w2 = Worker(cluster, "w1"), Worker(cluster, "w2")
    assert len(w1.claim(1)) == 1
    assert len(w2.claim(5)) == 1
    assert w1.claim(5) == [] and w2.claim(5) == []
    assert cluster.count("runs", "state = 'queued'") == 3


def test_required_labels_must_all_be_offered_by_the_session(cluster):
    """A task that needs a GPU given to a worker without one would fail or run wrongly."""
    publish(cluster, "g", {"command": ["true"], "labels": ["gpu", "zone=eu"]})
    admit(cluster, "g", 1)
    assert Worker(cluster, "plain", labels=["zone=eu"]).claim(1) == []
    assert len(Worker(cluster, "gpu", labels=["gpu", "zone=eu", "big"]).claim(1)) == 1


def test_a_task_without_a_command_fails_at_claim_with_the_reason(cluster):
    """A Run with nothing to execute must end failed, saying why, instead of staying queued for
    ever or being handed to a worker."""
    publish(cluster, "n", {"cmd": ["echo"]})
    (run_id, _), = admit(cluster, "n", 1)
    assert Worker(cluster, "w1").claim(1) == []
    assert run_row(cluster, run_id) == ("failed", "the task has no command", True)
    assert events_of(cluster, run_id)[-2:] == ["run.dispatching", "run.finished"]


# ------------------------------------------------------------------------------------------------
# started, logs, completion
# ------------------------------------------------------------------------------------------------


def test_started_log_and_complete_are_idempotent_and_the_log_must_be_whole(cluster):
    """A lost reply makes the worker repeat its call: a second started must not restart the
    clock, a resent chunk must not duplicate bytes, a completion must not be accepted before the
    whole log is stored nor twice, and nothing else may be accepted after the end."""
    publish(cluster, "t", CMD)
    (run_id, _), = admit(cluster, "t", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    deadline, now = w.started(c)
    assert deadline - now == 3_600_000  # the spec's timeout_ms, from the start in database time
    assert w.started(c)[0] == deadline
    assert events_of(cluster, run_id).count("run.started") == 1
    chunk = bytes(range(256)) * 1024  # 256 KiB, every byte value
    assert w.append(c, 0, chunk) == len(chunk)
    assert w.append(c, 0, chunk) == len(chunk)  # resent: accepted once
    assert cluster.count("attempt_logs") == 1
    before = snapshot(cluster)
    assert sqlstate_of(lambda: w.append(c, len(chunk) + 1, b"gap")) == "QL003"
    assert sqlstate_of(lambda: w.append(c, 10, b"different")) == "QL003"
    assert snapshot(cluster) == before
    total = len(chunk) + 5
    reply = w.complete(c, "failed", 2, total)
    assert reply == ("log_incomplete", "running", len(chunk), None, None)
    assert snapshot(cluster) == before
    assert w.append(c, len(chunk) - 3, chunk[-3:] + b"tail!") == total  # overlaps the end
    reply = w.complete(c, "failed", 2, total)
    assert reply == ("accepted", "failed", total, None, None)
    stored = cluster.sql("SELECT string_agg(data, ''::bytea ORDER BY offset_bytes) FROM qinglong.attempt_logs")[0][0]
    assert bytes(stored) == chunk + b"tail!"
    after = snapshot(cluster)
    assert w.complete(c, "failed", 2, total) == ("already_done", "failed", total, None, None)
    assert snapshot(cluster) == after
    for other in ({"state": "succeeded", "exit_code": 0}, {"state": "failed", "exit_code": 3}):
        assert sqlstate_of(lambda: w.complete(c, log_bytes=total, **other)) == "QL002"
    assert sqlstate_of(lambda: w.append(c, total, b"late")) == "QL002"
    assert snapshot(cluster) == after
    assert run_row(cluster, run_id) == ("failed", "exit status 2", True)
    assert events_of(cluster, run_id) == ["run.created", "run.queued", "run.dispatching", "run.started",
                                          "run.finished"]


def test_a_replaced_sessions_late_completion_is_refused_and_the_new_ones_is_accepted_once(cluster):
    """The worker that took an Attempt over must be the only one whose outcome counts: a late
    report from the session it replaced would invent or overwrite the outcome."""
    publish(cluster, "t", CMD)
    (run_id, _), = admit(cluster, "t", 1)
    old = Worker(cluster, "w1")
    (c_old,) = old.claim(1)
    new = Worker(cluster, "w1")  # the same worker id restarted: the old session is fenced
    age_session(cluster, old, attempts_only=True)
    assert [(action,) for _, _, action in expire(cluster, 10)] == [("requeued",)]
    (c_new,) = new.claim(1)
    assert c_new.attempt_id == c_old.attempt_id and c_new.lease_version == c_old.lease_version + 1
    new.started(c_new)
    before = snapshot(cluster)
    assert sqlstate_of(lambda: old.complete(c_old)) == "QL001"
    assert sqlstate_of(lambda: new.complete(c_old)) == "QL002"  # the old token under the new session
    assert snapshot(cluster) == before
    assert new.complete(c_new)[0] == "accepted"
    assert new.complete(c_new)[0] == "already_done"
    assert run_row(cluster, run_id)[0] == "succeeded"
    assert cluster.count("attempts", "run_id = %s", (run_id,)) == 1


# ------------------------------------------------------------------------------------------------
# Expiry, cancel, close, pruning
# ------------------------------------------------------------------------------------------------


def test_expire_requeues_an_unstarted_attempt_which_is_claimable_again_under_a_new_lease(cluster):
    """An Attempt claimed but never started provably never ran: it must go back to the queue
    (not be lost) and the worker that lost it must not be able to start it any more."""
    publish(cluster, "t", CMD)
    (run_id, attempt_id), = admit(cluster, "t", 1)
    w1 = Worker(cluster, "w1")
    (c,) = w1.claim(1)
    age_session(cluster, w1)
    assert expire(cluster, 10) == [
        (uuid.UUID(attempt_id), uuid.UUID(run_id), "requeued")]
    assert run_row(cluster, run_id)[0] == "queued"
    w2 = Worker(cluster, "w2")
    (again,) = w2.claim(1)
    assert again.attempt_id == attempt_id and again.lease_version == c.lease_version + 1
    assert sqlstate_of(lambda: w2.started(again, token=c.token)) == "QL002"
    w2.started(again)
    assert events_of(cluster, run_id)[2:] == ["run.dispatching", "run.requeued", "run.dispatching",
                                              "run.started"]


def test_expire_ends_a_started_attempt_lost_and_retries_only_an_idempotent_task(cluster):
    """A started job whose worker vanished may have run to the end: retrying a non-idempotent
    task could run it twice, never retrying an idempotent one would lose the Run."""
    publish(cluster, "plain", {"command": ["true"], "retry": {"max_attempts": 3}})
    publish(cluster, "idem", RETRY_LOST)
    (plain_run, _), = admit(cluster, "plain", 1)
    (idem_run, _), = admit(cluster, "idem", 1)
    w = Worker(cluster, "w1")
    for c in w.claim(2):
        w.started(c)
    age_session(cluster, w)
    actions = [(str(run), action) for _, run, action in expire(cluster, 10)]
    assert sorted(actions) == sorted([(plain_run, "lost"), (idem_run, "lost")])
    state, reason, finished = run_row(cluster, plain_run)
    assert (state, finished) == ("lost", True)
    assert "retried only for an idempotent task" in reason
    assert [a[:2] for a in attempts_of(cluster, plain_run)] == [(1, "lost")]
    assert run_row(cluster, idem_run)[0] == "retry_wait"
    (first, second) = attempts_of(cluster, idem_run)
    assert first[:2] == (1, "lost") and second[:2] == (2, "claimed") and second[2] is not None
    (retry,) = Worker(cluster, "w2").claim(1)
    assert (retry.run_id, retry.attempt_no) == (idem_run, 2)


def test_expire_ends_a_running_attempt_whose_deadline_is_long_past_timed_out(cluster):
    """A worker that keeps heartbeating but never reports its timed-out job must not hold the
    Run for ever: the control plane ends it timed_out."""
    publish(cluster, "t", {"command": ["true"], "timeout_ms": 3_600_000})
    (run_id, _), = admit(cluster, "t", 1)
    w = Worker(cluster, "w1", lease_ms=5_000)
    (c,) = w.claim(1)
    w.started(c)
    assert expire(cluster, 10) == []
    cluster.sql("UPDATE qinglong.attempts SET deadline_ms = deadline_ms - 3610000 WHERE attempt_id = %s",
                (c.attempt_id,))
    assert [(action,) for _, _, action in expire(cluster, 10)] == [("timed_out",)]
    assert run_row(cluster, run_id)[0] == "timed_out"
    assert w.heartbeat([c.attempt_id]) == {c.attempt_id: "lease_lost"}


def test_request_cancel_ends_a_queued_run_at_once_and_asks_a_running_ones_worker(cluster):
    """Cancelling must stop a Run that has not started before any worker takes it, and reach the
    worker of a running one through its heartbeat (the only channel it has)."""
    publish(cluster, "t", CMD)
    (queued, _), (running, _) = admit(cluster, "t", 2)
    w = Worker(cluster, "w1")
    cluster.sql("UPDATE qinglong.runs SET scheduled_for_ms = scheduled_for_ms + 100000 WHERE run_id = %s", (queued,))
    (c,) = w.claim(1)
    assert c.run_id == running
    w.started(c)
    cancel = "SELECT qinglong.request_cancel(%s, 'operator')"
    assert runtime_call(cluster, cancel, (queued,)) == [("cancelled",)]
    assert run_row(cluster, queued)[:2] == ("cancelled", "cancelled by an operator")
    assert w.claim(1) == []
    assert runtime_call(cluster, cancel, (running,)) == [("running",)]
    assert w.heartbeat([c.attempt_id]) == {c.attempt_id: "operator"}
    assert w.complete(c, "cancelled", None, signal=15, reason="cancelled by an operator")[:2] == ("accepted", "cancelled")
    assert runtime_call(cluster, cancel, (running,)) == [("cancelled",)]
    assert runtime_call(cluster, cancel, (str(uuid.uuid4()),)) == [(None,)]
    assert events_of(cluster, running).count("run.cancel_requested") == 1


def test_close_session_requeues_unstarted_attempts_and_ends_started_ones_lost(cluster):
    """A drained worker's session close must hand an untouched claim back at once (not after the
    lease) and must not leave a started job looking alive."""
    publish(cluster, "idem", RETRY_LOST)
    (a, _), (b, _) = admit(cluster, "idem", 2)
    w = Worker(cluster, "w1")
    ca, cb = w.claim(2)
    w.started(ca)
    w.close()
    assert run_row(cluster, a)[0] == "retry_wait"  # lost, idempotent: retried
    assert attempts_of(cluster, a)[0][1] == "lost"
    assert run_row(cluster, b)[0] == "queued"
    assert sqlstate_of(lambda: w.heartbeat()) == "QL001"
    assert sqlstate_of(lambda: w.complete(ca)) == "QL001"
    assert {c.run_id for c in Worker(cluster, "w2").claim(4)} == {a, b}


def test_prune_attempt_logs_deletes_old_shipped_logs_and_keeps_a_tombstone(cluster):
    """Shipped logs must not grow for ever, and pruning must touch only Attempts that ended
    before the time (a running job's log is still being written)."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 2)
    w = Worker(cluster, "w1")
    done, running = w.claim(2)
    for c in (done, running):
        w.started(c)
        w.append(c, 0, b"log bytes")
    w.complete(done, log_bytes=9)
    prune = "SELECT qinglong.prune_attempt_logs(%s, 100)"
    assert runtime_call(cluster, prune, (0,)) == [(0,)]
    assert runtime_call(cluster, prune, (cluster.db_now_ms() + 1,)) == [(1,)]
    assert cluster.count("attempt_logs", "attempt_id = %s", (done.attempt_id,)) == 0
    assert cluster.count("attempt_logs", "attempt_id = %s", (running.attempt_id,)) == 1
    assert cluster.count("attempts", "log_deleted_at_ms IS NOT NULL") == 1
    assert runtime_call(cluster, prune, (cluster.db_now_ms() + 1,)) == [(0,)]
