"""Promotion of the database while jobs run: a streaming standby (``pg_basebackup -R -X stream``,
as tests/failure/test_failure_promotion.py makes it) is promoted after the old primary is fenced.
The workers keep talking to the gateway; the gateway follows the promotion through its multi-host
DSN (a proxy in front of each server, ``target_session_attrs=read-write``), the replica through
its fault proxy (the service address, moved to the new primary), while the jobs keep running.
Completions made before the promotion must be there after it, completions made after it must land
on the new primary, and nothing may run twice.
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


_BUSY = ("FROM pg_stat_activity WHERE usename IN ('qinglong_runtime', 'qinglong_gateway') "
         "AND state NOT IN ('idle', 'idle in transaction', 'idle in transaction (aborted)')")


def _quiet(db: ClusterDb) -> bool:
    """No statement of ours in flight on the server: what it committed is in its WAL now. A
    transaction left open by a client behind the partition (its Sync held in the proxy) commits
    nothing more, and the primary is stopped before it could hear from it."""
    return db.sql(f"SELECT count(*) {_BUSY}")[0][0] == 0


def test_workers_and_replicas_carry_on_against_the_promoted_standby_without_running_a_run_twice(tmp_path):
    """Two Runs finish before the promotion and four are running across it (two more wait for a
    slot). If a completion were lost with the old primary, its Run would run again or hang; if
    the gateway did not follow the promotion, the running Runs would never complete (or would be
    lost and their jobs' exit codes with them); if anything ran twice, the markers show it."""
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
        # the gateway's pool and listener: the primary first, the standby once it is writable
        to_primary = c.proxy("proxy-gateway-primary")
        to_standby = c.proxy("proxy-gateway-standby", (standby.host, standby.port))
        c.start_gateway(dsn=c.ingress_dsn(f"{to_primary.host},{to_standby.host}",
                                          f"{to_primary.port},{to_standby.port}") + " target_session_attrs=read-write",
                        db_proxies=[to_primary, to_standby])
        db_proxies = [replica_proxy, to_primary, to_standby]
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

        # the database stops answering (the workers still reach the gateway); what the primary
        # committed reaches the standby
        fenced = time.monotonic()
        for proxy in db_proxies:
            proxy.partition()
        try:
            wait_until(lambda: _quiet(c.db), "the statements in flight to finish")
        except AssertionError as exc:
            busy = c.db.sql(f"SELECT usename, application_name, state, wait_event, left(query, 120) {_BUSY}")
            raise AssertionError(f"{exc}: {busy}") from None
        replay_s = wait_replayed(primary, standby)
        before = {a["attempt_id"]: a for a in c.attempts()}
        primary.stop("immediate")
        promote(standby)
        c.db = ClusterDb(standby, db.dbname)
        replica_proxy.retarget((standby.host, standby.port))  # the gateway's DSN names both servers
        standby_bytes = to_standby.bytes["to_client"]
        for proxy in db_proxies:
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
        gateway_links = {"to_old_primary": to_primary.accepted, "to_standby": to_standby.accepted,
                         "bytes_from_new_primary": to_standby.bytes["to_client"] - standby_bytes}
        figures("promotion_while_jobs_run", gateway_connections_made=gateway_links, timeline=timeline(standby), replay_wait_s=round(replay_s, 3),
                fence_to_promoted_s=round(promoted_s, 2), executions=len(found),
                duplicate_starts=len(dups), audit=audit.as_dict(),
                missing_exit_codes=missing_exit_codes[:5])
        assert timeline(standby) == 2
        assert gateway_links["bytes_from_new_primary"] > 0, gateway_links  # the gateway moved over
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
