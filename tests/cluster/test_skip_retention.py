"""Skip records age out on the cluster: ``qinglong.prune_skips`` (the runtime's only way to
delete them) repeats the contracts' rule, keeps manual keys, and every replica's skip retention
loop calls it."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from qinglong.contracts.execution import (
    MAX_SKIP_PRUNE_BATCH,
    MIN_SKIP_RETENTION_MS,
    SkipPruneReport,
    skip_cutoff_ms,
)
from qinglong.plugins.cluster_postgres.control import SkipRetention, control_components
from qinglong.plugins.cluster_postgres.roles import CONTROL_FUNCTIONS, EXPECTED_FUNCTIONS
from tests.support.aio import closing
from tests.support.cluster import CollectingSink, arun

RUNTIME, ADMIN, GATEWAY = "qinglong_runtime", "qinglong_admin", "qinglong_gateway"
MINUTE = 60_000
PRUNE = "SELECT occurrences, runs FROM qinglong.prune_skips(%s, %s)"


def occurrence_skip(db, recorded_at_ms: int) -> str:
    skip_id = str(uuid.uuid4())
    db.sql("INSERT INTO qinglong.schedule_skips (skip_id, project_id, trigger_id, trigger_revision, policy, "
           "first_skipped_ms, last_skipped_ms, skipped_count, count_exact, recorded_at_ms) "
           "VALUES (%s, 'p1', 'tr', 1, 'skip', %s, %s, 1, true, %s)",
           (skip_id, recorded_at_ms, recorded_at_ms, recorded_at_ms))
    return skip_id


def run_skip(db, recorded_at_ms: int, key: str | None = None) -> str:
    run_id = str(uuid.uuid4())
    db.sql("INSERT INTO qinglong.run_skips (run_id, project_id, task_id, trigger_id, scheduled_for_ms, "
           "reason, recorded_at_ms, idempotency_key) VALUES (%s, 'p1', 't', 'tr', %s, 'skipped', %s, %s)",
           (run_id, recorded_at_ms, recorded_at_ms, key or f"ql3:cron:v1:tr:1:{recorded_at_ms}:{run_id}"))
    return run_id


def left(db) -> tuple[set, set]:
    return ({r for (r,) in db.sql("SELECT skip_id::text FROM qinglong.schedule_skips")},
            {r for (r,) in db.sql("SELECT run_id::text FROM qinglong.run_skips")})


def prune(db, before: int, limit: int, role: str = RUNTIME):
    with psycopg.connect(db.dsn(role), autocommit=True) as conn:
        return conn.execute(PRUNE, (before, limit)).fetchone()


def test_the_function_keeps_the_recent_window_whatever_it_is_given_and_bounds_its_batch(cluster):
    """The function repeats the contracts' rule: a runtime that asked for every record would
    empty the recent-skips figures (and the status verdict on them); an unbounded batch would
    hold the tables' locks over the scheduler's rounds."""
    now = cluster.db_now_ms()
    edge = MIN_SKIP_RETENTION_MS
    old = [occurrence_skip(cluster, now - edge - 2 * MINUTE), run_skip(cluster, now - edge - 2 * MINUTE)]
    young = [occurrence_skip(cluster, now - edge + 2 * MINUTE), run_skip(cluster, now - edge + 2 * MINUTE)]
    # asked to delete everything up to a day ahead: only what is older than the window goes
    assert prune(cluster, now + 86_400_000, 100) == (1, 1)
    assert left(cluster) == ({young[0]}, {young[1]})
    # the rule of the contracts, in database time, deletes the same
    assert skip_cutoff_ms(now, 1) == now - MIN_SKIP_RETENTION_MS
    for limit in (0, MAX_SKIP_PRUNE_BATCH + 1, None):
        with pytest.raises(psycopg.DatabaseError, match="limit of 1 to 10000"):
            prune(cluster, now, limit)
    assert prune(cluster, now, MAX_SKIP_PRUNE_BATCH) == (0, 0)


def test_old_skips_go_in_bounded_batches_oldest_first_and_manual_keys_stay(cluster):
    """A manual key held by a skip record must keep refusing a second admission of that key;
    each call deletes at most its limit of each kind, the oldest first."""
    now = cluster.db_now_ms()
    hour = 3_600_000
    occurrences = [occurrence_skip(cluster, now - (10 - i) * hour) for i in range(5)]
    runs = [run_skip(cluster, now - (10 - i) * hour) for i in range(3)]
    manual = run_skip(cluster, now - 20 * hour, key="ql3:manual:v1:nightly-once")
    before = now - 2 * hour
    assert prune(cluster, before, 2) == (2, 2)
    assert left(cluster) == (set(occurrences[2:]), {runs[2], manual})
    assert prune(cluster, before, 2) == (2, 1)
    assert prune(cluster, before, 2) == (1, 0)
    assert prune(cluster, before, 2) == (0, 0)
    assert left(cluster) == (set(), {manual})


def test_the_runtime_may_prune_skips_only_through_the_function(cluster):
    """The runtime gained EXECUTE on one function and nothing else: no DELETE on either table,
    and no other role may call it."""
    assert EXPECTED_FUNCTIONS["prune_skips"] == "runtime" and "prune_skips" in CONTROL_FUNCTIONS
    now = cluster.db_now_ms()
    run_skip(cluster, now - 5 * MIN_SKIP_RETENTION_MS)
    occurrence_skip(cluster, now - 5 * MIN_SKIP_RETENTION_MS)
    for statement in ("DELETE FROM qinglong.schedule_skips", "DELETE FROM qinglong.run_skips",
                      "UPDATE qinglong.run_skips SET recorded_at_ms = 0",
                      "UPDATE qinglong.schedule_skips SET recorded_at_ms = 0",
                      "TRUNCATE qinglong.run_skips"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            cluster.sql(statement, role=RUNTIME)
    for role in (ADMIN, GATEWAY):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            prune(cluster, now, 10, role=role)
    assert cluster.count("run_skips") == cluster.count("schedule_skips") == 1


def test_a_replica_with_a_tiny_retention_prunes_old_skips_and_keeps_the_last_hour(cluster):
    """The loop every replica runs: old records of both kinds disappear without anyone asking,
    the last hour's stay (the recent-skips figures read them)."""
    now = cluster.db_now_ms()
    for _ in range(3):
        occurrence_skip(cluster, now - 2 * MIN_SKIP_RETENTION_MS)
        run_skip(cluster, now - 2 * MIN_SKIP_RETENTION_MS)
    young = {occurrence_skip(cluster, now - MINUTE)}, {run_skip(cluster, now - MINUTE)}
    sink = CollectingSink()
    backend = cluster.backend("pruner", sink=sink)

    async def body():
        async with closing(backend):
            loop = SkipRetention(backend, retention_ms=1, batch=2, interval_s=0.05)
            await loop.start()
            try:
                while left(cluster) != young:
                    await asyncio.sleep(0.05)
            finally:
                await loop.stop()
            stats = await backend.reader().store_stats()
            return loop, stats

    loop, stats = arun(asyncio.wait_for(body(), 60))
    assert left(cluster) == young
    assert loop.pruned == 6 and loop.failures == 0
    assert stats.skipped_recent == 2
    assert "cluster_postgres.skips_pruned" in sink.codes()


def test_the_replica_components_take_the_skip_retention_setting(cluster):
    from types import SimpleNamespace

    settings = SimpleNamespace(execution=SimpleNamespace(log_retention_days=7, skip_retention_days=0.5,
                                                         prune_batch=50_000))
    (skips,) = [c for c in control_components(cluster.backend("c"), settings) if isinstance(c, SkipRetention)]
    assert (skips.retention_ms, skips.batch) == (43_200_000, MAX_SKIP_PRUNE_BATCH)
    assert SkipPruneReport() == SkipPruneReport(0, 0)
