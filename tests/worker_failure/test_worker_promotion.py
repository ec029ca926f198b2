"""Promotion of the database while jobs run: a streaming standby (``pg_basebackup -R -X stream``,
as tests/failure/test_failure_promotion.py makes it) is promoted after the old primary is fenced,
and the workers and the replica, each behind its own fault proxy (the service address), are moved
to the new primary while their jobs keep running. Completions made before the promotion must be
there after it, completions made after it must land on the new primary, and nothing may run twice.
"""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import ClusterDb
from tests.failure.failure_helpers import (
    new_cluster_db,
    promote,
    start_standby,
    timeline,
    wait_replayed,
)
from tests.support.pg import ROLE_PASSWORDS, start_server
from tests.worker_failure.harness import (
    Cluster,
    audit_runs,
    executions,
    exit_codes_recorded,
    figures,
    overlaps,
    started_keys,
    wait_until,
)

pytestmark = pytest.mark.postgres

EXIT_CODE = 7
#: A session lease that outlasts the fence, the replay and the promotion (a few seconds), so the
#: workers keep their jobs through it: 2 x 1000 + 500 + 2000 + 1000 <= 20000.
LEASE = dict(session_lease_ms=20_000, heartbeat_ms=1000, self_fence_margin_ms=2000)


def _quiet(db: ClusterDb) -> bool:
    """No statement of ours in flight on the server: what it committed is in its WAL now."""
    return db.sql("SELECT count(*) FROM pg_stat_activity WHERE usename IN "
                  "('qinglong_runtime', 'qinglong_gateway') "
                  "AND state NOT IN ('idle')")[0][0] == 0


def test_workers_and_replicas_carry_on_against_the_promoted_standby_without_running_a_run_twice(tmp_path):
    """Two Runs finish before the promotion and four are running across it (two more wait for a
    slot). If a completion were lost with the old primary, its Run would run again or hang; if
    the workers did not follow the service address, the running Runs would never complete (or
    would be lost and their jobs' exit codes with them); if anything ran twice, the markers show
    it."""
    primary = start_server("pg18")
    standby = None
    c = None
    try:
        db = new_cluster_db(primary)
        standby = start_standby(primary)
        c = Cluster(db, tmp_path)
        c.publish_task("early", hold_s=0, exit_code=EXIT_CODE)
        c.publish_task("held", hold_s=600, exit_code=EXIT_CODE)
        replica_proxy = c.proxy("proxy-replica")
        c.start_replica("replica-1", dsn=(
            f"host={replica_proxy.host} port={replica_proxy.port} user=qinglong_runtime "
            f"password={ROLE_PASSWORDS['qinglong_runtime']} dbname={db.dbname} connect_timeout=3"))
        for name in ("wa", "wb"):
            c.add_worker(name, max_running=2, **LEASE)
        c.admit("early", 2)
        c.wait_runs(2)
        c.wait_all_terminal("the early Runs to end before the promotion")
        c.admit("held", 6)
        c.wait_runs(8)
        wait_until(lambda: c.db.count("attempts", "state = 'running'") == 4
                   and len(started_keys(c.markers)) == 6, "four held jobs to run")

        # the service address stops answering; what the primary committed reaches the standby
        fenced = time.monotonic()
        for proxy in c.proxies:
            proxy.partition()
        wait_until(lambda: _quiet(c.db), "the statements in flight to finish")
        replay_s = wait_replayed(primary, standby)
        before = {a["attempt_id"]: a for a in c.attempts()}
        primary.stop("immediate")
        promote(standby)
        c.db = ClusterDb(standby, db.dbname)
        for proxy in c.proxies:
            proxy.retarget((standby.host, standby.port))
            proxy.cut_all()
            proxy.heal()
        promoted_s = time.monotonic() - fenced
        after = {a["attempt_id"]: a for a in c.attempts()}
        c.release_jobs()
        states = c.wait_all_terminal("every Run to end on the new primary")
        found, dups = executions(c.markers, c.watcher)
        audit = audit_runs(c, max_attempts=1)
        missing_exit_codes = exit_codes_recorded(c, found, EXIT_CODE)
        pairs = overlaps(found)
        figures("promotion_while_jobs_run", timeline=timeline(standby), replay_wait_s=round(replay_s, 3),
                fence_to_promoted_s=round(promoted_s, 2), executions=len(found),
                duplicate_starts=len(dups), audit=audit.as_dict(),
                missing_exit_codes=missing_exit_codes[:5])
        assert timeline(standby) == 2
        assert before == after  # the standby held every committed step of the old primary
        assert not dups and not pairs, (dups, pairs)
        assert len(found) == 8 and all(e.how == "done" for e in found), found
        assert audit.by_state == {"failed": 8} and not audit.problems, audit.as_dict()
        assert not missing_exit_codes, missing_exit_codes
    finally:
        if c is not None:
            c.close()
        if standby is not None:
            standby.destroy()
        primary.destroy()
