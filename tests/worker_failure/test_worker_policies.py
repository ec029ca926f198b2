"""Each task's concurrency policy and required labels hold cluster-wide, with three workers racing.

The claim is the only place that knows what runs anywhere: a worker sees only its own jobs. The
marker job's intervals (monotonic clock, one machine) show how many Runs of one task really ran
at once across all workers.
"""

from __future__ import annotations

import pytest

from tests.worker_failure.harness import audit_runs, executions, figures, wait_until

pytestmark = pytest.mark.postgres

RUNS = 4


def _most_at_once(found, run_ids: set[str]) -> int:
    """The most executions of these Runs running at the same instant."""
    edges = []
    for e in found:
        if e.run_id in run_ids:
            edges.append((e.start, 1))
            edges.append((e.end if e.end is not None else float("inf"), -1))
    most = now = 0
    for _, step in sorted(edges, key=lambda x: (x[0], x[1])):  # an end before a start at a tie
        now += step
        most = max(most, now)
    return most


def test_forbid_queue_max_running_and_labels_hold_across_racing_workers(cluster):
    """Four Runs each of a 'forbid', a 'queue' and an 'allow, max_running 2' task, and three of a
    task needing label 'gpu', due at once, three workers with two slots each (one offering
    'gpu'). If the claim honoured a policy per worker instead of cluster-wide, two workers would
    run a forbid or queue task's Runs at the same time (or three of the max_running 2 task); a
    queue Run would start before an earlier one; a gpu Run would run on a worker without the
    label. A forbid Run that could not start is a skip record with its reason, not a Run."""
    c = cluster
    c.publish_task("forbid", hold_s=1.0, concurrency="forbid")
    c.publish_task("queue", hold_s=0.5, concurrency="queue")
    c.publish_task("pair", hold_s=0.5, concurrency={"mode": "allow", "max_running": 2})
    c.publish_task("gpu", hold_s=0.2, labels=["gpu"])
    c.start_replica("replica-1")
    c.add_worker("w1", max_running=2, poll_ms=50)
    c.add_worker("w2", max_running=2, poll_ms=50)
    c.add_worker("w3", max_running=2, poll_ms=50, labels=("gpu",))
    wait_until(lambda: len(c.sessions()) == 3, "every worker's session")
    for task in ("forbid", "queue", "pair"):
        c.admit(task, RUNS)
    c.admit("gpu", 3)
    c.wait_runs(3 * RUNS + 3)
    c.wait_all_terminal()
    found, dups = executions(c.markers, c.watcher)
    runs = c.rows("SELECT r.run_id::text, r.task_id, r.state, r.reason, r.scheduled_for_ms, "
                  "r.admitted_at_ms FROM qinglong.runs r ORDER BY r.scheduled_for_ms, r.admitted_at_ms, r.run_id")
    by_task: dict[str, list] = {}
    for row in runs:
        by_task.setdefault(row[1], []).append(row)
    ids = {task: {r[0] for r in rows} for task, rows in by_task.items()}
    attempts = c.attempts()
    worker_of = {a["run_id"]: a.get("worker_id") for a in attempts}
    start_of = {e.run_id: e.start for e in found}
    queue_started = [r[0] for r in by_task["queue"]]
    queue_order = sorted(queue_started, key=lambda r: start_of.get(r, float("inf")))
    audit = audit_runs(c, max_attempts=1)
    skips = c.rows("SELECT task_id, reason FROM qinglong.run_skips ORDER BY skip_seq")
    most = {task: _most_at_once(found, ids[task]) for task in ids}
    figures("policies_across_workers", most_at_once=most,
            states={t: sorted(r[2] for r in rows) for t, rows in by_task.items()},
            gpu_workers=sorted({worker_of.get(r) for r in ids["gpu"]}),
            forbid_reasons=sorted({r[1] for r in skips}))
    assert not dups and not audit.problems, (dups, audit.problems)
    assert most["forbid"] == 1 and most["queue"] == 1 and most["pair"] <= 2, most
    # forbid: the Runs that could not start while one was active were skipped, with a reason
    forbid_states = [r[2] for r in by_task["forbid"]]
    assert set(forbid_states) == {"succeeded"}, forbid_states
    assert {task for task, _ in skips} <= {"forbid"} and all(reason for _, reason in skips), skips
    assert len(forbid_states) + len(skips) == RUNS, (forbid_states, skips)
    # queue: every Run ran, one at a time, in dispatch order
    assert [r[2] for r in by_task["queue"]] == ["succeeded"] * RUNS
    assert queue_order == queue_started, (queue_order, queue_started)
    assert [r[2] for r in by_task["pair"]] == ["succeeded"] * RUNS
    assert {worker_of[r] for r in ids["gpu"]} == {"w3"} and \
        [r[2] for r in by_task["gpu"]] == ["succeeded"] * 3
