"""A worker's claim reads a bounded number of rows at any backlog: plan shapes, not times.

10,000 queued Runs a worker can take, 2,000 earlier ones needing a label it does not offer and
2,000 earlier ones of a ``queue`` task whose previous Run is still running. The claim runs as it
runs for real (``qinglong.worker_claim``), with ``auto_explain`` reporting EXPLAIN (ANALYZE,
BUFFERS) of every statement inside it to this session: the rows its scans of ``runs`` return or
filter out and the buffers they touch must stay within a small bound, and the scans must reach the
waiting Runs through an index condition (a label set, a task), never by walking them.

What is lost if this fails: a claim that walks the backlog costs the database time in proportion
to the queued Runs, on every claim of every worker; a 1,000-Run burst then drains in time
quadratic in its size, and a backlog of Runs no worker here may take (another label, a task that
must wait) starves the Runs this worker could run.
"""

from __future__ import annotations

import json
import os


from tests.cluster.test_worker_functions import Worker, admit, publish
from tests.support.cluster import explained

FREE, LABELLED, WAITING = 10_000, 2_000, 2_000
#: What a bounded claim reads: windows of 2 x 4 + 16 candidates per label set and gated task,
#: the index descents between them, and the handful of rows each taken candidate touches. A walk
#: reads the backlog itself (thousands).
MAX_RUNS_ROWS = 400
MAX_BUFFERS = 1_500


def _bulk_admit(db, task_id: str, n: int, offset_ms: int) -> None:
    """``n`` queued Runs of ``task_id``'s head revision with their claimed Attempts, scheduled
    ``offset_ms`` before now and on (earlier offsets come first in dispatch order), written as
    admission writes them (the routing fields from the insert trigger, as for any writer)."""
    db.sql(
        "WITH head AS (SELECT t.task_revision AS rev, e.content_digest AS digest "
        "  FROM qinglong.tasks t JOIN qinglong.execution_revisions e ON e.project_id = t.project_id "
        "  AND e.task_id = t.task_id AND e.task_revision = t.task_revision "
        "  WHERE t.project_id = 'p1' AND t.task_id = %(task)s), "
        "clock AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms), "
        "made AS (INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
        "  task_revision, executor, execution_digest, scheduled_for_ms, admitted_at_ms, queued_at_ms, "
        "  state, owned_by, idempotency_key, admitted_by) "
        "  SELECT gen_random_uuid(), 'p1', 'tr', 1, %(task)s, head.rev, 'remote_worker', head.digest, "
        "         clock.now_ms - %(offset)s + g.i, clock.now_ms, clock.now_ms, 'queued', 'runtime', "
        "         'k-' || %(task)s || '-' || g.i, 'test' "
        "  FROM head, clock, generate_series(1, %(n)s) AS g (i) RETURNING run_id, admitted_at_ms) "
        "INSERT INTO qinglong.attempts (attempt_id, run_id, attempt_no, state, executor, created_at_ms) "
        "SELECT gen_random_uuid(), run_id, 1, 'claimed', 'remote_worker', admitted_at_ms FROM made",
        {"task": task_id, "n": n, "offset": offset_ms})


def _explained_claim(db, worker: Worker, want: int, plan_mode: str) -> tuple[list, list[dict]]:
    """``worker_claim`` of ``want`` Attempts for ``worker``'s session with every statement's plan
    (see :func:`~tests.support.cluster.explained`); the rows it returned and the plans."""
    return explained(db, "SELECT run_id::text, task_id FROM qinglong.worker_claim(%s, %s::uuid, %s, %s::bytea[])",
                     (worker.worker_id, worker.session_id, worker.generation,
                      [os.urandom(32) for _ in range(want)]), plan_mode=plan_mode)


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _runs_scans(plans: list[dict]) -> list[dict]:
    """Every scan node of ``qinglong.runs`` in the plans."""
    return [node for plan in plans for node in _nodes(plan["Plan"])
            if node.get("Relation Name") == "runs" or str(node.get("Index Name", "")).startswith("runs_")]


def _rows(node: dict) -> int:
    loops = int(node.get("Actual Loops", 1))
    return int(float(node.get("Actual Rows", 0)) * loops + float(node.get("Rows Removed by Filter", 0))
               + float(node.get("Rows Removed by Index Recheck", 0)))


def _buffers(plans: list[dict]) -> int:
    """Shared buffers hit or read by the statements inside the claim, each counted at its top
    node (the call itself is left out: it counts them again, with the catalog reads of a
    session's first call of each function)."""
    return sum(int(p["Plan"].get("Shared Hit Blocks", 0)) + int(p["Plan"].get("Shared Read Blocks", 0))
               for p in plans if "qinglong.worker_claim(" not in p.get("Query Text", ""))


def test_a_claim_reads_a_bounded_number_of_rows_at_ten_thousand_queued_runs(cluster):
    publish(cluster, "free", {"command": ["true"]})
    publish(cluster, "gpu", {"command": ["true"], "labels": ["gpu"]})
    publish(cluster, "serial", {"command": ["true"], "concurrency": "queue"})
    # the queue task's earliest Run is taken by a gpu worker and runs: the rest must wait
    [(first_serial, _)] = admit(cluster, "serial", 1)
    holder = Worker(cluster, "holder", labels=["gpu"], capacity=1)
    assert [c.run_id for c in holder.claim(1)] == [first_serial]
    _bulk_admit(cluster, "gpu", LABELLED, offset_ms=3_000_000)
    _bulk_admit(cluster, "serial", WAITING, offset_ms=2_000_000)
    _bulk_admit(cluster, "free", FREE, offset_ms=1_000_000)
    cluster.sql("VACUUM ANALYZE qinglong.runs")
    cluster.sql("VACUUM ANALYZE qinglong.attempts")
    plain = Worker(cluster, "plain", capacity=8)
    earliest = [r[0] for r in cluster.sql(
        "SELECT run_id::text FROM qinglong.runs WHERE task_id = 'free' "
        "ORDER BY scheduled_for_ms, admitted_at_ms, run_id LIMIT 8")]

    for mode, expected in (("force_generic_plan", earliest[:4]), ("force_custom_plan", earliest[4:])):
        rows, plans = _explained_claim(cluster, plain, 4, mode)
        # the four earliest Runs this worker may take, past 4,000 earlier ones it may not
        assert [task for _, task in rows] == ["free"] * 4, (mode, rows)
        assert sorted(r for r, _ in rows) == sorted(expected), mode
        scans = _runs_scans(plans)
        assert scans, f"{mode}: no statement read qinglong.runs: {len(plans)} plans"
        walked = [n for n in scans if n["Node Type"] == "Seq Scan"]
        assert not walked, f"{mode}: a sequential scan of runs: {walked}"
        read = sum(_rows(n) for n in scans)
        assert read <= MAX_RUNS_ROWS, (
            f"{mode}: the claim read {read} rows of runs at {FREE + LABELLED + WAITING} waiting: "
            + json.dumps([{k: n.get(k) for k in ('Index Name', 'Index Cond', 'Filter', 'Actual Rows',
                                                  'Actual Loops', 'Rows Removed by Filter')}
                          for n in scans], indent=1)[:4000])
        assert _buffers(plans) <= MAX_BUFFERS, f"{mode}: the claim touched {_buffers(plans)} buffers"
        # the waiting Runs are reached by an index condition: a label set, a task
        conditions = " ".join(str(n.get("Index Cond", "")) for n in scans)
        assert "required_labels" in conditions and "task_id" in conditions, (mode, conditions)
