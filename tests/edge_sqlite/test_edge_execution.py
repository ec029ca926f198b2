"""The edge store's execution side beyond the conformance suite: migration 0004 on a database
with Runs, admission by executor and recovery's pristine test, two processes racing on one file,
and the dispatcher's queries reading partial indexes.

Run as a script (``python test_edge_execution.py DB``) this module is the second process of the
race test: see :func:`race_driver`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge_helpers import cron, open_backend, query, seed, vm_steps
from qinglong.contracts.execution import Actor, AttemptState, RunState
from qinglong.plugins.edge_sqlite import migrations
from qinglong.plugins.edge_sqlite import queries as edge_sql
from qinglong.plugins.edge_sqlite.scheduler_read import pinned_execution_digest

MINUTE = 60_000


# ---- migration 0004 ---------------------------------------------------------------------------

def _database_of_0003_with_runs(path: Path) -> None:
    """A database as the version before execution left it: a task, a trigger, one queued Run as
    its admission wrote it (claimed for remote_worker) and one Run ended by hand, with no
    Attempt."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        migrations.apply_pending(conn, migrations.load_migrations()[:3], str(path), 1)
        digest = "sha256:" + "a" * 64
        conn.executescript(f"""
            BEGIN;
            INSERT INTO projects VALUES ('p1', 'p1', 1, 1);
            INSERT INTO tasks VALUES ('p1', 't1', 1, '{{"command":["true"]}}', '{digest}', 1);
            INSERT INTO task_revisions VALUES ('p1', 't1', 1, '{{"command":["true"]}}', '{digest}', 1);
            INSERT INTO runs VALUES ('done', 'p1', 'tr', 1, 't1', 1, '{digest}', 50, 60, 60,
                                     'succeeded', 'ql3:cron:v1:tr:1:50');
            INSERT INTO runs VALUES ('old', 'p1', 'tr', 1, 't1', 1, '{digest}', 100, 110, 110,
                                     'queued', 'ql3:cron:v1:tr:1:100');
            INSERT INTO attempts (attempt_id, run_id, attempt_no, state, executor, execution_digest,
                                  created_at_ms)
                 VALUES ('a-old', 'old', 1, 'claimed', 'remote_worker', 'sha256:x', 110);
            INSERT INTO run_events (run_id, seq, type, at_ms)
                 VALUES ('old', 1, 'run.created', 110), ('old', 2, 'run.queued', 110);
            COMMIT;
        """)
    finally:
        conn.close()


async def test_a_0003_database_with_runs_migrates_keeping_them_and_ends_the_unrunnable_backlog(db_path, clock):
    """An upgrade that dropped Runs loses history; one that kept the old remote-worker backlog
    queued would start every stale occurrence at once (86,400 a day for a per-second trigger)."""
    _database_of_0003_with_runs(db_path)
    rowids = query(db_path, "SELECT rowid, run_id FROM runs ORDER BY rowid")
    before = time.time() * 1000
    backend = await open_backend(db_path, clock)  # migrates and checks readiness (schema compare)
    try:
        assert query(db_path, "SELECT rowid, run_id FROM runs ORDER BY rowid") == rowids
        done, old = query(db_path, "SELECT run_id, state, finished_at_ms, reason FROM runs "
                                   "ORDER BY rowid")
        assert done == ("done", "succeeded", 60, None)
        assert old[:2] == ("old", "cancelled") and before - 1000 <= old[2] <= time.time() * 1000 + 1000
        assert "before this store executed runs" in old[3]
        assert query(db_path, "SELECT attempt_id, state, executor, reason IS NOT NULL, "
                              "log_dropped_bytes FROM attempts") == [
            ("a-old", "cancelled", "remote_worker", 1, 0)]
        assert query(db_path, "SELECT seq, type FROM run_events WHERE run_id = 'old' ORDER BY seq") == [
            (1, "run.created"), (2, "run.queued"), (3, "run.finished")]
        assert query(db_path, "PRAGMA foreign_key_check") == []
        store = backend.execution()
        assert await store.dispatch_candidates(clock.ms, 10) == []
        assert {r.run_id: r.state for r in await store.list_runs()} == {
            "done": RunState.SUCCEEDED, "old": RunState.CANCELLED}
        report = await backend.recover()
        assert (report.pristine_queued, report.candidates) == (0, ())
    finally:
        await backend.close()
    # a restart finds the migrated file ready, with nothing pending
    backend = await open_backend(db_path, clock)
    await backend.close()


def test_the_migrated_schema_is_the_one_a_fresh_database_gets(tmp_path):
    """The readiness check compares a file's schema with the migrations applied afresh; a rebuilt
    table whose definition differed between the two paths would refuse every upgraded file."""
    upgraded, fresh = tmp_path / "upgraded.db", tmp_path / "fresh.db"
    _database_of_0003_with_runs(upgraded)
    known = migrations.load_migrations()
    for path in (upgraded, fresh):
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            migrations.apply_pending(conn, known, str(path), 2)
            migrations.check_ready(conn, known, str(path))
        finally:
            conn.close()
    schemas = []
    for path in (upgraded, fresh):
        conn = sqlite3.connect(path)
        try:
            schemas.append(migrations.schema_of(conn))
        finally:
            conn.close()
    assert schemas[0] == schemas[1]
    assert {"runs_dispatchable", "runs_finished", "runs_by_task", "attempts_active",
            "attempts_log_kept", "manual_run_keys", "runs_in_flight"} <= set(schemas[1])


async def test_the_backend_offers_one_execution_store_implementing_the_contract(db_path, clock, backends):
    """A second store instance per backend would hold its own caches beside the connection's
    thread; one that missed a protocol method would fail only when the dispatcher first calls it."""
    from qinglong.contracts.execution import ExecutionStore

    backend = backends.track(await open_backend(db_path, clock))
    assert isinstance(backend.execution(), ExecutionStore)
    assert backend.execution() is backend.execution()


# ---- admission and recovery by executor --------------------------------------------------------

async def _admit(backend, clock, payload: dict) -> str:
    await backend.publisher().create_project("p1")
    await backend.publisher().put_task("p1", "t1", payload)
    await backend.publisher().put_trigger(cron("a", "* * * * *"))
    await backend.run_round()
    clock.advance(MINUTE)
    assert (await backend.run_round()).admitted == 1
    return query_one_run(backend)


def query_one_run(backend) -> str:
    [(run_id,)] = query(Path(backend.store.path), "SELECT run_id FROM runs")
    return run_id


@pytest.mark.parametrize("payload, executor", [
    ({"command": ["true"]}, "local_process"),
    ({"command": ["true"], "executor": "other_exec"}, "other_exec"),
])
async def test_admission_claims_the_attempt_for_the_executor_its_task_names(db_path, clock,
                                                                             payload, executor, backends):
    """An Attempt claimed for the wrong executor would be started by a process that cannot run it
    (or never started); recovery must still see it as pristine, not as drifted work."""
    backend = backends.track(await open_backend(db_path, clock))
    run_id = await _admit(backend, clock, payload)
    (state, got, digest), = query(db_path, "SELECT state, executor, execution_digest FROM attempts")
    (revision, task_digest), = query(db_path, "SELECT task_revision, task_digest FROM runs")
    assert (state, got) == ("claimed", executor)
    assert digest == pinned_execution_digest("p1", "t1", revision, task_digest, executor)
    assert digest != pinned_execution_digest("p1", "t1", revision, task_digest, "remote_worker")
    report = await backend.recover()
    assert (report.pristine_queued, report.candidates) == (1, ())
    # the same Run claimed for another executor (with that executor's own digest) is drift
    query_write(db_path, "UPDATE attempts SET executor = 'remote_worker', execution_digest = ?",
                (pinned_execution_digest("p1", "t1", revision, task_digest, "remote_worker"),))
    report = await backend.recover()
    assert report.pristine_queued == 0
    assert [c for c in report.candidates if run_id in c and "executor 'remote_worker'" in c]


async def test_recovery_leaves_executing_runs_to_the_reconciler_and_still_reports_drift(db_path, clock, backends):
    """Reporting every running job as 'in-flight work needs recovery' at each restart buries real
    drift in noise; passing over a Run whose Attempt disagrees with it hides real drift."""
    from qinglong.contracts.execution import ProcessHandle, Receipt, classify_outcome

    backend = backends.track(await open_backend(db_path, clock))
    await backend.publisher().create_project("p1")
    await backend.publisher().put_task("p1", "t1", {
        "command": ["true"], "retry": {"max_attempts": 2, "initial_backoff_ms": 60_000}})
    store = backend.execution()
    ids = [(await store.admit_manual_run("p1", "t1", f"k{i}", clock.ms))[0] for i in range(4)]
    attempts = [(await store.run_detail(r)).attempts[0].attempt_id for r in ids]
    for attempt_id in attempts[:3]:
        assert await store.begin_dispatch(attempt_id, f"/l/{attempt_id}", clock.ms + MINUTE, clock.ms)
    for attempt_id in attempts[1:3]:
        assert await store.record_started(attempt_id, ProcessHandle("b", 1, 1, 1), clock.ms)
    result = await store.record_finished(attempts[2], classify_outcome(Receipt(1, None, clock.ms, 0), None),
                                         clock.ms, Actor.COMPLETION)
    assert result.run_state is RunState.RETRY_WAIT
    report = await backend.recover()
    assert (report.pristine_queued, report.candidates) == (1, ())  # dispatching, running, retry_wait
    query_write(db_path, "UPDATE attempts SET state = 'claimed' WHERE attempt_id = ?", (attempts[1],))
    report = await backend.recover()
    assert report.pristine_queued == 1
    [candidate] = report.candidates
    assert ids[1] in candidate and "run state 'running'" in candidate


def query_write(path: Path, sql: str, params=()) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


async def test_a_stored_spec_that_is_invalid_is_offered_with_the_reason(db_path, clock, backends):
    """A revision published before specs were checked (a command given as one string) must fail
    its Run saying what is wrong, not 'no command' and not crash the dispatcher's scan."""
    backend = backends.track(await open_backend(db_path, clock))
    await backend.publisher().create_project("p1")
    payload = json.dumps({"command": "echo hi"})
    digest = "sha256:" + "b" * 64
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO tasks (project_id, task_id, task_revision, payload_json, content_digest,"
                     " updated_at_ms) VALUES ('p1', 't1', 1, ?, ?, 1)", (payload, digest))
        conn.execute("INSERT INTO task_revisions VALUES ('p1', 't1', 1, ?, ?, 1)", (payload, digest))
        conn.execute("COMMIT")
    finally:
        conn.close()
    store = backend.execution()
    run_id, _ = await store.admit_manual_run("p1", "t1", "k", clock.ms)
    [candidate] = await store.dispatch_candidates(clock.ms, 10)
    assert candidate.run_id == run_id and candidate.spec is None
    assert "command" in candidate.spec_error and "list of arguments" in candidate.spec_error


async def test_one_prune_deletes_at_most_its_cap_whatever_batch_it_is_asked(db_path, clock, backends):
    """A prune asked for a huge batch would hold the write lock for as long as it deletes, and a
    round waiting behind it would miss its cadence."""
    from qinglong.contracts.errors import UserError
    from qinglong.plugins.edge_sqlite.execution import MAX_PRUNE_BATCH

    backend = backends.track(await open_backend(db_path, clock))
    total = MAX_PRUNE_BATCH + 100
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
            "task_revision, task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state, "
            "idempotency_key, finished_at_ms) VALUES (?, 'p1', 'tr', 1, 't1', 1, 'd', ?, ?, ?, "
            "'failed', ?, ?)", [(f"r{i}", i, i, i, f"k{i}", i) for i in range(total)])
        conn.execute("COMMIT")
    finally:
        conn.close()
    store = backend.execution()
    with pytest.raises(UserError, match="prune batch"):
        await store.prune(clock.ms, 0)
    assert (await store.prune(clock.ms, 10 * total)).runs == MAX_PRUNE_BATCH
    assert (await store.prune(clock.ms, 10 * total)).runs == 100
    assert query(db_path, "SELECT count(*) FROM runs") == [(0,)]


# ---- two processes on one file ---------------------------------------------------------------

def race_driver(path: str) -> None:
    """The second process: open the store, say ``ready``, then for each ``go ATTEMPT`` line call
    begin_dispatch once and say ``won`` or ``lost``; exit at the end of input."""
    from qinglong.contracts.store import BackendContext, SchedulerLimits
    from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

    class Sink:
        def emit(self, event) -> None:
            pass

    async def main() -> None:
        backend = create_backend(BackendContext(
            settings=EdgeSqliteSettings(path=path, busy_timeout_ms=30_000),
            limits=SchedulerLimits(page_size=32, claim_budget=16, lease_ms=30_000, cadence_ms=1000),
            providers={}, diagnostics=Sink(), clock_ms=lambda: int(time.time() * 1000),
            owner="race"))
        await backend.open()
        try:
            store = backend.execution()
            print("ready", flush=True)
            for line in sys.stdin:
                attempt_id = line.split()[1]
                now = int(time.time() * 1000)
                won = await store.begin_dispatch(attempt_id, f"/logs/{attempt_id}", now + MINUTE, now)
                print("won" if won else "lost", flush=True)
        finally:
            await backend.close()

    asyncio.run(main())


class _Racer:
    def __init__(self, db_path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(db_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(__file__))
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._cond:
                self.lines.append(line.strip())
                self._cond.notify_all()

    def line(self, index: int) -> str:
        """The ``index``-th line, waiting for it (60 s at most)."""
        deadline = time.monotonic() + 60
        with self._cond:
            while len(self.lines) <= index:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None and len(self.lines) <= index:
                    raise AssertionError(f"no line {index} from the racer; stderr: "
                                         f"{self.process.stderr.read() if self.process.poll() is not None else ''}")
                self._cond.wait(min(left, 0.5))
            return self.lines[index]


async def test_two_processes_racing_for_each_attempt_find_exactly_one_winner(db_path, clock):
    """Two dispatchers on one file (a second `qinglong run` slipping past the owner lock, or a CLI
    and a dispatcher) that both won would start one Attempt's process twice."""
    backend = await open_backend(db_path, clock)
    try:
        await seed(backend)
        store = backend.execution()
        run_ids = [(await store.admit_manual_run("p1", "t1", f"k{i}", clock.ms))[0] for i in range(12)]
        attempts = [a.attempt_id for a in [((await store.run_detail(r)).attempts[0]) for r in run_ids]]
    finally:
        await backend.close()
    racers = [_Racer(db_path), _Racer(db_path)]
    try:
        for racer in racers:
            assert racer.line(0) == "ready"
        for number, attempt_id in enumerate(attempts, start=1):
            for racer in racers:  # both requests leave before either answer is read
                racer.process.stdin.write(f"go {attempt_id}\n")
                racer.process.stdin.flush()
            answers = sorted(racer.line(number) for racer in racers)
            assert answers == ["lost", "won"], (attempt_id, answers)
    finally:
        for racer in racers:
            racer.process.stdin.close()
        for racer in racers:
            racer.process.wait(60)
    assert all(racer.process.returncode == 0 for racer in racers)
    assert query(db_path, "SELECT count(*) FROM attempts WHERE state = 'dispatching'") == [(12,)]
    assert query(db_path, "SELECT count(*), count(DISTINCT run_id) FROM run_events "
                          "WHERE type = 'run.dispatching'") == [(12, 12)]
    assert query(db_path, "SELECT count(*) FROM runs WHERE state = 'dispatching'") == [(12,)]


# ---- the dispatcher's queries and history size -------------------------------------------------

def test_the_dispatchers_queries_read_only_their_partial_indexes(db_path):
    """A dispatch scan, active-attempt read or prune that walked the whole runs table would grow
    with the history (70 MB a day for one per-second trigger) and delay every round."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        migrations.apply_pending(conn, migrations.load_migrations(), str(db_path), 1)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, "
            "task_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, state, idempotency_key, "
            "finished_at_ms) VALUES (?, 'p1', 'tr', 1, 't1', 1, 'd', ?, ?, ?, 'succeeded', ?, ?)",
            [(f"r{i}", i, i, i, f"k{i}", i) for i in range(20_000)])
        conn.executemany(
            "INSERT INTO attempts (attempt_id, run_id, attempt_no, state, executor, execution_digest, "
            "created_at_ms, finished_at_ms, attempt_dir, log_deleted_at_ms) "
            "VALUES (?, ?, 1, 'succeeded', 'local_process', 'd', ?, ?, '/l', ?)",
            [(f"a{i}", f"r{i}", i, i, i) for i in range(20_000)])
        conn.execute("COMMIT")
        conn.execute("ANALYZE")

        def steps(name: str, params) -> int:
            return vm_steps(conn, edge_sql.query(name), params, every=100)[1]

        budget = 5_000  # virtual-machine steps; a scan of 20,000 rows takes far more
        assert steps("exec_dispatch_candidates", {"now": 10**13, "limit": 32}) < budget
        assert steps("exec_active_attempts", {}) < budget
        assert steps("exec_prunable_runs", {"before": 0, "limit": 32}) < budget
        assert steps("exec_finished_logs", {"before": 10**13, "limit": 32}) < budget
        assert steps("exec_list_runs_in_flight",
                     {"state": "running", "project": None, "task": None, "limit": 32}) < budget
        assert steps("in_flight_summary", ()) < budget
        # the scan that must read rows does read them: the counter measures something
        assert steps("exec_list_runs", {"state": "failed", "project": None, "task": None,
                                        "limit": 32}) > budget
    finally:
        conn.close()


if __name__ == "__main__":
    race_driver(sys.argv[1])
