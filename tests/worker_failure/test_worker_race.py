"""Three workers racing for many Runs: every Attempt claimed once, started once, ended once."""

from __future__ import annotations

import pytest

from tests.failure.failure_helpers import env_full
from tests.worker_failure.harness import (
    audit_runs,
    executions,
    exit_codes_recorded,
    figures,
    overlaps,
    wait_until,
)

pytestmark = pytest.mark.postgres


def _race(c, runs: int, workers: int, replicas: int) -> None:
    c.publish_task("race", hold_s=0.3, exit_code=0)
    for i in range(replicas):
        c.start_replica(f"replica-{i + 1}")
    for i in range(workers):
        c.add_worker(f"w{i + 1}", max_running=2, poll_ms=50)
    wait_until(lambda: len(c.sessions()) == workers, "every worker's session")
    c.admit("race", runs)
    c.wait_runs(runs)
    c.wait_all_terminal()
    found, dups = executions(c.markers, c.watcher)
    attempts = c.attempts()
    audit = audit_runs(c, max_attempts=1)
    per_worker: dict[str, int] = {}
    for a in attempts:
        per_worker[a.get("worker_id")] = per_worker.get(a.get("worker_id"), 0) + 1
    versions = sorted({a.get("lease_version") for a in attempts})
    attempt_ids = [e.attempt_id for e in found]
    figures("workers_racing", runs=runs, workers=workers, replicas=replicas, executions=len(found),
            duplicate_starts=len(dups), per_worker=per_worker, lease_versions=versions,
            audit=audit.as_dict())
    assert not dups, dups
    assert len(attempt_ids) == len(set(attempt_ids)) == runs, found
    assert {a["attempt_id"] for a in attempts} == set(attempt_ids)
    # claimed exactly once: no Attempt was leased a second time (nothing failed here)
    assert versions == [1], versions
    assert audit.by_state == {"succeeded": runs} and not audit.problems, audit.as_dict()
    assert not exit_codes_recorded(c, found, 0)
    assert not overlaps(found)
    # the race was real: more than one worker won Runs
    assert len(per_worker) > 1, per_worker


@pytest.mark.soak
def test_racing_workers_claim_and_start_each_attempt_exactly_once(cluster):
    """Three workers (two slots each) and two replicas on 40 Runs at once (400 with
    QINGLONG_SOAK=full). If two claims could lease one Attempt, its job would start twice (a
    duplicate start marker) or one worker's outcome would be recorded over the other's; if a
    claim were lost, a Run would stay queued and the wait for every Run to end would hang."""
    _race(cluster, 400 if env_full() else 40, workers=3, replicas=2)


def test_instant_jobs_on_racing_workers_all_end_with_their_exit_code(cluster):
    """Forty Runs of a job that ends at once (``true``), three workers. A job this short ends
    before its wrapper's helpers (the log reader, the fence watcher) have settled: if the wrapper
    then waited on a helper in a way that never returns, it would never write the job's receipt
    (and spin), the worker would wait for it until the task's timeout, and the Run would not end;
    if the worker lost the receipt, the Run would end lost instead of succeeded with exit 0."""
    c = cluster
    c.publish_task("instant", command=["true"])
    c.start_replica("replica-1")
    for i in range(3):
        c.add_worker(f"w{i + 1}", max_running=2, poll_ms=50)
    c.admit("instant", 40)
    c.wait_runs(40)
    try:
        c.wait_all_terminal("every instant Run to end")
    finally:
        stuck = [a for a in c.attempts() if a["state"] in ("dispatching", "running")]
        figures("instant_jobs", runs=40, stuck_attempts=len(stuck),
                states=audit_runs(c).by_state)
    audit = audit_runs(c, max_attempts=1)
    codes = {a.get("exit_code") for a in c.attempts()}
    assert audit.by_state == {"succeeded": 40} and not audit.problems, audit.as_dict()
    assert codes == {0}, codes
