"""The control plane's expiry in ``qinglong run`` replicas: leases of vanished worker sessions, and
the double check of timeouts a worker did not enforce.

The worker here is the protocol itself (the store's functions as the gateway role, see
``control_helpers.ProtocolWorker``), so a test decides exactly when a session goes silent; the
control plane is real ``qinglong run`` processes, two of them where leaderless handling matters.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from tests.support.cluster import CollectingSink, arun, set_cursor
from tests.cluster.control_helpers import (
    LEASE_MS,
    ProtocolWorker,
    Replica,
    admit,
    attempts_of,
    expired_events,
    publish,
    run_row,
    wait_for,
    write_settings,
)
from tests.support.aio import closing


def test_a_vanished_sessions_attempts_are_requeued_if_never_started_and_lost_if_started_exactly_once_by_two_replicas(
        cluster, tmp_path):
    """Without expiry a Run whose worker died would stay dispatching or running for ever; an
    Attempt that never started but were declared lost would drop a job that never ran; a started
    one that were requeued would run a non-idempotent job twice; two replicas that both expired
    one Attempt would create two retries (the job run twice more)."""
    retries = {"retry": {"max_attempts": 3, "initial_backoff_ms": 0, "jitter": 0}}
    never = admit(cluster, publish(cluster, "never", ["true"], **retries))
    plain = admit(cluster, publish(cluster, "plain", ["true"], **retries))
    idem = admit(cluster, publish(cluster, "idem", ["true"], idempotent=True, **retries))

    worker = ProtocolWorker(cluster, "vanishing-worker", lease_ms=LEASE_MS)
    try:
        leases = {lease.run_id: lease for lease in worker.claim(3)}
        assert set(leases) == {never, plain, idem}
        worker.started(leases[plain])
        worker.started(leases[idem])
    finally:
        worker.close()  # the session goes silent: no heartbeat, no close

    replicas = [Replica(write_settings(tmp_path / f"r{i}.toml", cluster, owner=f"replica-{i}"))
                for i in range(2)]
    try:
        for replica in replicas:
            replica.wait_ready()

        def settled():
            a_never, a_plain, a_idem = (attempts_of(cluster, r) for r in (never, plain, idem))
            return (len(a_never) == 1 and a_never[0]["state"] == "claimed"
                    and a_plain[0]["state"] == "lost" and len(a_idem) == 2)

        wait_for(settled, "the replicas to expire the silent session's three Attempts")
        for replica in replicas:
            assert replica.proc.poll() is None, replica.text()
    finally:
        for replica in replicas:
            replica.stop()
    assert [r.proc.returncode for r in replicas] == [0, 0], [r.stderr[-2000:] for r in replicas]

    a_never, a_plain, a_idem = (attempts_of(cluster, r) for r in (never, plain, idem))
    session_expiry = cluster.sql("SELECT lease_expires_at_ms FROM qinglong.worker_sessions "
                                 "WHERE worker_id = 'vanishing-worker'")[0][0]
    print(f"figure: lost {a_plain[0]['finished_at_ms'] - session_expiry} ms after the session lease "
          "expired (database time, 2 replicas, 1 s cadence)")
    # never started: back in the queue, the same Attempt, claimable again (nothing ran)
    assert run_row(cluster, never)["state"] == "queued"
    assert a_never[0]["started_at_ms"] is None and a_never[0]["finished_at_ms"] is None
    # started, not idempotent: lost, and no Attempt 2 whatever the retries
    assert len(a_plain) == 1 and run_row(cluster, plain)["state"] == "lost"
    assert "expired" in a_plain[0]["reason"] and "vanishing-worker" in a_plain[0]["reason"]
    assert "idempotent" in run_row(cluster, plain)["reason"]
    # started, idempotent: lost, and exactly one Attempt 2, queued for a worker
    assert [a["state"] for a in a_idem] == ["lost", "claimed"]
    assert run_row(cluster, idem)["state"] == "retry_wait"

    for replica in replicas:  # both loops ran all along, and none printed a secret
        assert not [e for e in replica.events() if e.get("code") == "cluster_postgres.expiry_failed"]
        assert "runtime-secret" not in replica.stderr
    events = expired_events(replicas)
    by_attempt: dict[str, list[str]] = {}
    for event in events:
        by_attempt.setdefault(event["attempt_id"], []).append(event["action"])
    assert by_attempt == {a_never[0]["attempt_id"]: ["requeued"], a_plain[0]["attempt_id"]: ["lost"],
                          a_idem[0]["attempt_id"]: ["lost"]}, events

    # the requeued Attempt and the retry are a worker's to claim, the first under a new lease version
    other = ProtocolWorker(cluster, "second-worker")
    try:
        claimed = {lease.run_id: lease for lease in other.claim(4)}
        assert set(claimed) == {never, idem}
        assert claimed[never].attempt_id == a_never[0]["attempt_id"]
        assert claimed[never].lease_version > leases[never].lease_version
        assert (claimed[idem].attempt_id, claimed[idem].attempt_no) == (a_idem[1]["attempt_id"], 2)
    finally:
        other.close()


def test_a_running_attempt_long_past_its_deadline_ends_timed_out_by_the_control_plane(cluster, tmp_path):
    """A worker that renews its session but never enforces a timeout (hung, or its kill did not
    land) would otherwise hold the Run running for ever; ending it while its lease lives tells the
    worker (lease lost) to stop, and its late report of success is refused, not recorded."""
    run_id = admit(cluster, publish(cluster, "slow", ["sleep", "600"], timeout_ms=1000))
    worker = ProtocolWorker(cluster, "hung-worker", lease_ms=LEASE_MS)
    (lease,) = worker.claim(1)
    deadline = worker.started(lease)
    stops: list[dict[str, str]] = []
    done = threading.Event()

    def heartbeats():  # the session stays alive all along: only the deadline can end the Attempt
        while not done.is_set():
            stops.append(worker.heartbeat([lease.attempt_id]))
            done.wait(0.5)

    beat = threading.Thread(target=heartbeats, daemon=True)
    beat.start()
    replica = Replica(write_settings(tmp_path / "r.toml", cluster, owner="replica-t"))
    try:
        wait_for(lambda: attempts_of(cluster, run_id)[0]["state"] == "timed_out",
                 "the control plane to end the Attempt past its deadline")
        wait_for(lambda: any(lease.attempt_id in s for s in stops[-3:]),
                 "the heartbeat reply to order the job stopped")
    finally:
        done.set()
        beat.join(30)
        replica.stop()
    (attempt,) = attempts_of(cluster, run_id)
    run = run_row(cluster, run_id)
    assert run["state"] == "timed_out" and attempt["cancel_reason"] == "timeout"
    assert attempt["deadline_ms"] == deadline
    assert attempt["finished_at_ms"] >= deadline + LEASE_MS  # "long past": deadline + the session lease
    print(f"figure: timed_out {attempt['finished_at_ms'] - deadline - LEASE_MS} ms after deadline + lease")
    lease_expiry = cluster.sql("SELECT lease_expires_at_ms FROM qinglong.worker_sessions "
                               "WHERE worker_id = 'hung-worker'")[0][0]
    assert lease_expiry > attempt["finished_at_ms"], "the session lived: this was the deadline, not a lost lease"
    reason = next(s[lease.attempt_id] for s in stops if lease.attempt_id in s)
    assert reason in ("lease_lost", "timeout"), stops
    with pytest.raises(psycopg.Error) as refused:
        worker.complete(lease, "succeeded", exit_code=0)
    assert refused.value.sqlstate == "QL002"
    assert run_row(cluster, run_id)["state"] == "timed_out"
    worker.close()
    assert [e["action"] for e in expired_events([replica])] == ["timed_out"]


def test_expiry_reports_a_failing_call_and_retries_it_and_stops_promptly_while_a_call_hangs(cluster):
    """An expiry loop that died on its first database error would leave every later lease
    unexpired (Runs stuck for ever) while the replica looks healthy; one that could not stop
    while its statement waited on a lock would hold the replica's shutdown past its bound."""
    from qinglong.plugins.cluster_postgres.control import ExpiryLoop

    run_id = admit(cluster, publish(cluster, "job", ["true"]))
    worker = ProtocolWorker(cluster, "silent", lease_ms=LEASE_MS)
    (lease,) = worker.claim(1)
    worker.close()  # never started, never renewed: its lease expires LEASE_MS from now

    def lock_attempts():
        locker = psycopg.connect(cluster.superuser_dsn())
        locker.execute("LOCK TABLE qinglong.attempts IN ACCESS EXCLUSIVE MODE")  # every expiry call waits
        return locker

    # stop while a call is stuck on a lock it cannot get: stop must return, the lock still held
    slow = cluster.backend("expirer-slow", settings=cluster.settings(statement_timeout_ms=60_000),
                           sink=CollectingSink())
    locker = lock_attempts()

    async def stuck():
        loop = ExpiryLoop(slow, interval_s=0.2)
        await loop.start()
        async with closing(slow):
            while not cluster.sql("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                  "AND query LIKE '%%qinglong.attempts%%'"):
                await asyncio.sleep(0.05)
            await loop.stop()  # an unbounded stop would wait here until the test's bound
            return locker.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND "
                                  "mode = 'AccessExclusiveLock' AND granted AND pid = pg_backend_pid()"
                                  ).fetchone()[0]

    try:
        assert arun(asyncio.wait_for(stuck(), 60)) == 1, "stop waited for the lock to be released"
    finally:
        locker.close()
    assert attempts_of(cluster, run_id)[0]["state"] == "dispatching"

    # a call that fails is reported and tried again; once the fault ends the work gets done
    sink = CollectingSink()
    backend = cluster.backend("expirer", settings=cluster.settings(statement_timeout_ms=300), sink=sink)
    locker = lock_attempts()

    async def body():
        loop = ExpiryLoop(backend, interval_s=0.2)
        await loop.start()
        try:
            while sink.codes().count("cluster_postgres.expiry_failed") < 2:
                await asyncio.sleep(0.05)
            locker.rollback()  # the fault ends: a later tick must do the work
            while attempts_of(cluster, run_id)[0]["state"] != "claimed":
                await asyncio.sleep(0.05)
            return loop
        finally:
            await loop.stop()
            await backend.close()

    try:
        loop = arun(asyncio.wait_for(body(), 90))
    finally:
        locker.close()
    assert attempts_of(cluster, run_id)[0]["state"] == "claimed"
    assert loop.expired == {"requeued": 1} and loop.failures >= 2
    failure = next(e for e in sink.events if e.code == "cluster_postgres.expiry_failed")
    assert "password" not in failure.message and "runtime-secret" not in failure.message


def test_the_control_components_are_offered_for_this_backend_only(cluster):
    """Expiry loops offered to another profile's backend would call functions that do not exist
    there, failing every second; missing on the cluster, nothing would ever expire."""
    from types import SimpleNamespace

    from qinglong.plugins.cluster_postgres import qinglong_lifecycle_components
    from qinglong.plugins.cluster_postgres.control import ExpiryLoop, LogRetention, SkipRetention, StrandedRunsWatch

    settings = SimpleNamespace(execution=SimpleNamespace(log_retention_days=2.0, prune_batch=50))
    ours = cluster.backend("components")
    found = qinglong_lifecycle_components(SimpleNamespace(backend=ours, settings=settings))
    assert [type(c) for c in found] == [ExpiryLoop, LogRetention, SkipRetention, StrandedRunsWatch]
    retention = found[1]
    assert (retention.retention_ms, retention.batch) == (2 * 86_400_000, 50)
    assert retention.interval_s == 300.0  # slow: a tenth of two days, capped at five minutes
    impostor = SimpleNamespace(name="cluster_postgres")
    assert qinglong_lifecycle_components(SimpleNamespace(backend=impostor, settings=settings)) == []
    assert qinglong_lifecycle_components(SimpleNamespace(backend=SimpleNamespace(name="edge_sqlite"),
                                                         settings=settings)) == []


def test_two_expiry_loops_drain_a_backlog_larger_than_a_page_and_handle_each_attempt_once(cluster):
    """A page bound without continuation would leave a backlog expiring a page a second; two
    replicas both handling one Attempt would requeue it twice or create two retries; SKIP LOCKED
    pages that starved each other would leave some expired Attempts unhandled."""
    from qinglong.plugins.cluster_postgres.control import ExpiryLoop

    count, page = 24, 4
    publish(cluster, [f"job{i:02d}" for i in range(count)], ["true"], idempotent=True,
            retry={"max_attempts": 2, "initial_backoff_ms": 600_000, "jitter": 0})
    set_cursor(cluster, None, -1000)

    async def admit_all():
        backend = cluster.backend("admitter")
        async with closing(backend):
            while cluster.count("runs") < count:
                await backend.run_round()

    arun(admit_all())
    worker = ProtocolWorker(cluster, "crowded", lease_ms=LEASE_MS, capacity=count)
    leases = worker.claim(count)
    assert len(leases) == count
    for lease in leases[::2]:
        worker.started(lease)
    worker.close()
    started = {lease.attempt_id for lease in leases[::2]}

    wait_for(lambda: cluster.count("attempts", "state IN ('dispatching', 'running') AND "
                                   "lease_expires_at_ms <= %s", (cluster.db_now_ms(),)) == count,
             "the leases to expire")
    sinks = [CollectingSink(), CollectingSink()]
    backends = [cluster.backend(f"expirer-{i}", sink=sink) for i, sink in enumerate(sinks)]

    async def body():
        # one tick each, never a second one (600 s apart): the backlog drains by continuation
        loops = [ExpiryLoop(b, interval_s=600, page=page) for b in backends]
        for loop in loops:
            await loop.start()
        try:
            while sum(sum(loop.expired.values()) for loop in loops) < count:
                await asyncio.sleep(0.05)
            # a page still in flight ends before its loop stops (stop waits for it), so a
            # duplicate it made shows in the sinks; then one more page each must end nothing
            for loop in loops:
                await loop.stop()
            for loop in loops:
                await loop.tick()
            return loops
        finally:
            for loop in loops:
                await loop.stop()
            for b in backends:
                await b.close()

    loops = arun(asyncio.wait_for(body(), 90))
    handled = [(e.fields["attempt_id"], e.fields["action"]) for sink in sinks for e in sink.events
               if e.code == "cluster_postgres.attempt_expired"]
    assert len(handled) == count and len({a for a, _ in handled}) == count, handled
    assert {a for a, action in handled if action == "lost"} == started
    assert {a for a, action in handled if action == "requeued"} == {l.attempt_id for l in leases} - started
    assert cluster.count("attempts") == count + len(started)  # one retry per lost idempotent Attempt
    print(f"figure: {count} expired Attempts in pages of {page}: {[loop.expired for loop in loops]}")
