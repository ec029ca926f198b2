"""Two replicas as separate processes, each with its own pool, racing on one database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import seed, set_cursor
from tests.support.aio import closing

DRIVER = Path(__file__).with_name("replica_driver.py")


#: Overall bound on any wait for a replica process: a hang, never a speed requirement.
PATIENCE_S = 180


def _spawn(db, owner: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, QL_RUNTIME_DSN=db.dsn("qinglong_runtime"))
    return subprocess.Popen([sys.executable, str(DRIVER), "--owner", owner, *args], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, before: list[dict] = ()) -> list[dict]:
    out, err = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 0, err
    lines = [*before, *(json.loads(line) for line in out.splitlines() if line.strip())]
    assert not [line for line in lines if line["event"] == "timed_out"], "a replica never reached its stop condition"
    return lines


def _ready(proc: subprocess.Popen) -> list[dict]:
    """Read the replica's lines up to its ``ready`` (it is connected); those lines."""
    seen = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if seen[-1]["event"] == "ready":
            return seen
    raise AssertionError(f"replica ended before it was ready: {proc.communicate()[1]}")


def _race(db, owners=("replica-a", "replica-b")) -> dict[str, list[dict]]:
    """Both replicas connect first, then start together on a line each, and run until each has
    had several rounds in a row that claimed nothing (all work done, whoever did it)."""
    procs = {o: _spawn(db, o, "--start-on-stdin", "--idle-rounds", "5", "--cadence-ms", "20") for o in owners}
    ready = {o: _ready(p) for o, p in procs.items()}
    for p in procs.values():
        p.stdin.write("go\n")
        p.stdin.flush()
    return {o: _finish(p, ready[o]) for o, p in procs.items()}


def _sum(lines: list[dict], field: str) -> int:
    return sum(line[field] for line in lines if line["event"] == "round")


def test_two_replica_processes_initialize_once_and_admit_each_occurrence_exactly_once(cluster):
    """Without the row lease two replicas would both initialize and both admit every occurrence."""
    seed(cluster, 20)
    first = _race(cluster)
    pids = {o: next(line["pid"] for line in lines if line["event"] == "ready") for o, lines in first.items()}
    assert len(set(pids.values())) == 2  # two independent pools, two backends
    assert sum(_sum(lines, "initialized") for lines in first.values()) == 20
    assert sum(_sum(lines, "errors") for lines in first.values()) == 0
    assert cluster.count("trigger_schedules", "next_fire_at_ms IS NULL OR claim_owner IS NOT NULL") == 0

    set_cursor(cluster, None, -500)
    second = _race(cluster)
    assert sum(_sum(lines, "admitted") for lines in second.values()) == 20
    assert sum(_sum(lines, "errors") for lines in second.values()) == 0
    assert cluster.count("runs") == 20
    assert cluster.count("attempts") == 20
    assert cluster.count("run_events") == 40
    per_trigger = cluster.sql("SELECT trigger_id, count(*) FROM qinglong.runs GROUP BY 1")
    assert sorted(n for _, n in per_trigger) == [1] * 20
    admitted_by = {r[0] for r in cluster.sql("SELECT DISTINCT admitted_by FROM qinglong.runs")}
    assert admitted_by <= {"replica-a", "replica-b"}


def test_killed_claim_holder_is_taken_over_only_after_expiry_and_still_one_run(cluster):
    """A holder dying with a live claim must neither block the occurrence forever nor let the
    survivor fire it before the lease expired in database time."""
    seed(cluster, 1)
    set_cursor(cluster, "tr000", -500)
    holder = _spawn(cluster, "holder", "--mode", "claim-and-hang", "--lease-ms", "2000")
    claimed = None
    for line in holder.stdout:
        msg = json.loads(line)
        if msg["event"] == "claimed":
            claimed = msg
            break
    assert claimed and claimed["trigger_ids"] == ["tr000"]
    expires_at = claimed["expires_at_ms"][0]
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=PATIENCE_S)

    # the survivor runs until it admitted the occurrence, then five more rounds (room for a
    # second admission to show), however long its start or the lease takes on this machine
    survivor = _finish(_spawn(cluster, "survivor", "--until-admitted", "1", "--then-rounds", "5",
                              "--cadence-ms", "100"))
    rounds = [line for line in survivor if line["event"] == "round"]
    assert sum(r["admitted"] for r in rounds) == 1
    run = cluster.sql("SELECT admitted_by, admitted_at_ms FROM qinglong.runs")
    assert len(run) == 1 and run[0][0] == "survivor"
    assert run[0][1] > expires_at  # not before the database said the lease was over
    assert (cluster.count("runs"), cluster.count("attempts"), cluster.count("run_events")) == (1, 1, 2)


def test_an_orderly_stop_gives_back_the_claims_the_replica_still_holds(cluster):
    """A replica stopped in order while it held claims (its round cut at the stop's bound, as in a
    backlog) must give them back under its fence: otherwise every occurrence it held waits a whole
    lease (30 s here) before another replica may admit it, and a rolling restart of all replicas
    stalls the schedule by a lease each time. After the stop no claim of its owner is left, and
    the other replica's very next round admits every one of those occurrences."""
    import asyncio

    from qinglong.plugins.cluster_postgres.claim import claim_due_schedules

    seed(cluster, 6)

    async def body():
        a = cluster.backend("replica-a", lease_ms=30_000)
        b = cluster.backend("replica-b", lease_ms=30_000)
        await a.open()
        await b.open()
        async with closing(b), closing(a):
            await a.run_round()  # the triggers are initialized: nothing is due yet
            set_cursor(cluster, None, -500)
            # what a round cut at the stop leaves: rows claimed, nothing decided
            pool = await a.runtime_pool()
            async with pool.connection() as conn:
                held = await claim_due_schedules(conn, owner=a.owner, limit=16, lease_ms=30_000)
            await a.close()
            left = cluster.count("trigger_schedules", "claim_owner = %s", ("replica-a",))
            runs_before = cluster.count("runs")
            report = await b.run_round()
            return len(held), left, runs_before, report, cluster.count("runs")

    held, left, runs_before, report, runs_after = asyncio.run(body())
    assert held == 6 and left == 0, (held, left)
    assert runs_after - runs_before == 6, (runs_before, runs_after, report)
    events = [e.code for sink in cluster.sinks for e in sink.events]
    assert "cluster_postgres.claims_released" in events, events
