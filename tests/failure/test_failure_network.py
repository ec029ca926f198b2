"""Network faults on the wire between replicas and PostgreSQL, through a fault proxy of our own.

Each replica is the plugin's real backend with its own pool, run by the host's scheduler loop,
talking to PostgreSQL 18 only through its own :class:`FaultProxy`. Every test ends with the
exactly-once audit (expected occurrences against Runs) and prints its figures.

Fast forms run by default; ``QINGLONG_SOAK=full`` lengthens the ``soak``-marked ones.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from tests.support.cluster import seed, set_cursor
from tests.failure.failure_helpers import (
    ADMISSION_COMMITTED,
    ADMISSION_MESSAGE,
    EVERY_SECOND,
    FIRE_DECISION,
    InProcessReplica,
    audit,
    env_full,
    occurrence_shape,
    start_every_second,
    wait_db_time_past,
    wait_for,
    wait_rounds,
)
from devtools.fault_proxy import TO_CLIENT, TO_SERVER, FaultProxy

pytestmark = pytest.mark.postgres

LEASE_MS = 2000


def _proxy(db, name: str) -> FaultProxy:
    return FaultProxy((db.server.host, db.server.port), name=name).start()


def _admitted_keys(rule) -> list[str]:
    """The idempotency keys quoted in the admission message ``rule`` fired on: one per row of its
    page that creates a Run (initializations and releases have none)."""
    found = sorted(set(re.findall(rb"'(ql3:[a-z_]+:v1:[A-Za-z0-9_-]+:\d+:\d+)'", rule.chunk)))
    assert found, "expected an idempotency key in the admission message"
    return [key.decode() for key in found]


def _admitted_triggers(rule, prefix: str = "tr") -> list[str]:
    """The trigger ids of the admission message ``rule`` fired on (every row of its page): the
    quoted literals of the message that are whole ids of :func:`seed`'s form (``tr000``; an
    idempotency key quotes one only inside a longer literal)."""
    found = sorted(set(re.findall(rb"'(" + prefix.encode() + rb"\d{3})'", rule.chunk)))
    assert found, "expected a trigger id in the admission message"
    return [t.decode() for t in found]


@pytest.mark.soak
def test_latency_and_jitter_on_the_wire_neither_lose_nor_duplicate_occurrences(failure_db):
    """Slow links stretch every round (claim and admission each cost a delayed round trip); if
    the lease, the fence or the cursor CAS leaned on timing, a delayed admission could land twice
    or a claim could lapse and drop an occurrence."""
    db = failure_db
    triggers = 12 if env_full() else 4
    seconds = 60 if env_full() else 4
    seed(db, triggers, expression=EVERY_SECOND)
    first = start_every_second(db)

    async def body():
        proxies = [_proxy(db, "slow"), _proxy(db, "jittery"), _proxy(db, "quick")]
        proxies[0].set_latency(40)
        proxies[1].set_latency(5, jitter_ms=60)
        proxies[2].set_latency(1)
        # a small budget each, so the three replicas share the work instead of the quickest
        # taking every claim
        replicas = [await InProcessReplica(db, f"replica-{p.name}", proxy=p, lease_ms=5000,
                                           claim_budget=2).start()
                    for p in proxies]
        try:
            # every trigger's cursor past ``seconds`` worth of occurrences, however slow the start
            await wait_for(lambda: db.sql("SELECT min(next_fire_at_ms) FROM qinglong.trigger_schedules"
                                          )[0][0] > first + seconds * 1000,
                           what=f"{seconds} s of occurrences admitted")
        finally:
            for r in replicas:
                await r.stop()
            for p in proxies:
                p.close()
        return replicas

    replicas = asyncio.run(body())
    figures = audit(db.superuser_dsn(), first, "latency_and_jitter",
                    admitted_by={r.owner: r.total("admitted") for r in replicas},
                    fence_lost=sum(r.total("fence_lost") for r in replicas)).show()
    assert figures.expected >= triggers * seconds
    assert (figures.duplicates, figures.missing) == (0, 0)
    assert figures.found == figures.expected
    assert figures.extra["runs_without_1_attempt_2_events"] == 0


@pytest.mark.parametrize("where", ["request_mid_statement", "reply_mid_commit"])
def test_stream_cut_mid_message_leaves_exactly_one_run(failure_db, where):
    """A stream cut in the middle of a message either never reaches COMMIT (then the claim must
    lapse and be taken over, or the occurrence is lost) or cuts the COMMIT's reply (then the
    occurrence is already admitted and nobody may admit it again, or it is duplicated)."""
    db = failure_db
    seed(db, 1)
    set_cursor(db, "tr000", -500)
    # the admission is one message; its reply's final CommandComplete is sent after the commit
    direction, pattern = ((TO_SERVER, ADMISSION_MESSAGE) if where == "request_mid_statement"
                          else (TO_CLIENT, ADMISSION_COMMITTED))

    async def body():
        cut_proxy, clean_proxy = _proxy(db, "cut"), _proxy(db, "clean")
        rule = cut_proxy.arm(direction, pattern, "cut_mid")
        a = await InProcessReplica(db, "replica-a", proxy=cut_proxy, lease_ms=LEASE_MS).start()
        await wait_for(rule.fired.is_set, what="the cut")
        cut_at = db.db_now_ms()
        claim = db.sql("SELECT claim_owner, claim_expires_at_ms FROM qinglong.trigger_schedules")[0]
        b = await InProcessReplica(db, "replica-b", proxy=clean_proxy, lease_ms=LEASE_MS).start()
        await wait_for(lambda: db.count("runs") > 0, what="a Run")
        # long enough for any second admission to show: past A's lease by database time, then
        # rounds of both replicas
        await wait_db_time_past(db, claim[1] or cut_at + LEASE_MS, "A's claim expiry")
        await wait_rounds([a, b], 2, "rounds after A's lease")
        for r in (a, b):
            await r.stop()
        cut_proxy.close()
        clean_proxy.close()
        return a, b, cut_at, claim

    a, b, cut_at, claim = asyncio.run(body())
    shape = occurrence_shape(db.superuser_dsn())
    (state, admitted_by, admitted_at, _), = shape["runs"]
    figures = audit(db.superuser_dsn(), {"tr000": shape["runs"][0][3]}, f"stream_cut_{where}",
                    admitted_by=admitted_by, errors_seen_by_a=a.total("errors"))
    figures.recover_s = max(0, admitted_at - cut_at) / 1000
    figures.show()
    assert a.total("errors") >= 1  # the cut replica saw its connection fail
    assert (len(shape["runs"]), len(shape["attempts"]), len(shape["events"])) == (1, 1, 2)
    assert state == "queued" and shape["attempts"][0][:2] == ("claimed", "remote_worker")
    if where == "request_mid_statement":
        # nothing committed: the claim lived until its database-time expiry, then was taken over
        assert claim[0] == "replica-a"
        assert admitted_at > claim[1]
    else:
        # the server committed before the reply was cut: the claim was already cleared
        assert claim[0] is None and admitted_by == "replica-a"
    assert shape["schedules"][0][0] is None  # claim cleared
    assert (figures.duplicates, figures.missing) == (0, 0)


@pytest.mark.soak
def test_one_way_partitioned_replica_loses_its_claims_and_commits_nothing_after_its_lease(failure_db):
    """A replica cut off from PostgreSQL (its bytes to the server stop, the server's still reach
    it) while holding claims: if the lease did not lapse its occurrences would be lost until it
    healed; if its held admissions, delivered late after the heal, were not refused by the full
    fence, every one of them would be admitted a second time; if its round waited on the dead
    link past the lease, the replica would stall until the heal."""
    db = failure_db
    triggers = 6
    hold_s = 10.0 if env_full() else 3.0
    seed(db, triggers, expression=EVERY_SECOND)
    first = start_every_second(db)

    async def body():
        pp, pq = _proxy(db, "partitioned"), _proxy(db, "healthy")
        p = await InProcessReplica(db, "replica-p", proxy=pp, lease_ms=LEASE_MS).start()
        q = await InProcessReplica(db, "replica-q", proxy=pq, lease_ms=LEASE_MS).start()
        await wait_for(lambda: p.total("admitted") and q.total("admitted"), what="both replicas to admit")
        # partition P between a claim and its admission: its next admission is held, then everything
        rule = pp.arm(TO_SERVER, ADMISSION_MESSAGE, "hold")
        await wait_for(rule.fired.is_set, what="P to start an admission")
        pp.partition(TO_SERVER)
        partitioned_at = db.db_now_ms()
        held = db.sql("SELECT trigger_id, next_fire_at_ms, claim_expires_at_ms "
                      "FROM qinglong.trigger_schedules WHERE claim_owner = 'replica-p'")
        p_admitted_before = p.total("admitted")
        # Q takes every one of P's claims over, each only after its database-time expiry
        def taken_over():
            return all(db.count("runs", "trigger_id = %s AND scheduled_for_ms = %s", (t, nxt))
                       for t, nxt, _ in held)
        await wait_for(taken_over, what="takeover of P's claims")
        # P's round waiting on the partitioned link is cut at its bound (the lease), client-side,
        # while the partition still holds (waited for, not assumed to have happened in time)
        await wait_for(lambda: "cluster_postgres.round_timed_out" in p.sink.codes(),
                       what="P's round to be cut at its bound during the partition")
        p_timed_out = True
        # the partition lasts at least hold_s (by database time), longer on a slow machine
        await wait_db_time_past(db, partitioned_at + int(hold_s * 1000), "the partition's length")
        healed_at = db.db_now_ms()
        pp.heal()
        # the held admission arrives now, late (the proxy delivers what P had sent before P
        # dropped the connection): the fence must refuse it
        await wait_for(lambda: p.total("admitted") > p_admitted_before, what="P to resume")
        p_fence_lost = p.total("fence_lost")
        await wait_rounds([p, q], 3, "rounds after the heal")  # room for a late duplicate to show
        for r in (p, q):
            await r.stop()
        pp.close()
        pq.close()
        return p, q, held, partitioned_at, healed_at, p_fence_lost, p_timed_out

    p, q, held, partitioned_at, healed_at, p_fence_lost, p_timed_out = asyncio.run(body())
    takeover = db.sql("SELECT trigger_id, scheduled_for_ms, admitted_by, admitted_at_ms FROM qinglong.runs "
                      "WHERE (trigger_id, scheduled_for_ms) IN (SELECT * FROM unnest(%s::text[], %s::bigint[]))",
                      ([h[0] for h in held], [h[1] for h in held]))
    expiry = {h[0]: h[2] for h in held}
    by_p_while_cut = db.count("runs", "admitted_by = 'replica-p' AND admitted_at_ms BETWEEN %s AND %s",
                              (partitioned_at, healed_at))
    figures = audit(db.superuser_dsn(), first, "one_way_partition",
                    held_claims=len(held), p_fence_lost=p_fence_lost, p_round_timed_out=p_timed_out,
                    p_commits_while_partitioned=by_p_while_cut,
                    admitted_by={"replica-p": p.total("admitted"), "replica-q": q.total("admitted")})
    figures.recover_s = max(at - expiry[t] for t, _, _, at in takeover) / 1000
    figures.show()
    assert held, "P held no claim when it was partitioned"
    assert len(takeover) == len(held)
    for trigger_id, _, admitted_by, admitted_at in takeover:
        assert admitted_by == "replica-q"
        assert admitted_at > expiry[trigger_id]  # only after the database said the lease was over
    assert by_p_while_cut == 0
    assert p_timed_out  # the partitioned round did not wait for the heal
    assert (figures.duplicates, figures.missing) == (0, 0)
    assert figures.found == figures.expected


def test_connection_hanging_open_is_cut_at_the_lease_and_its_replica_admits_again_without_duplicates(failure_db):
    """The server's replies stop on an open connection right after an admission was sent: the
    server commits, the replica waits for a reply that never comes (no statement_timeout helps: the
    server is done, and the peer's kernel still answers keepalives). Without a client-side bound the
    replica would stall forever and every later occurrence it could have admitted would wait for
    the others; if the hung admission were retried after the connection was cut, or the cut
    connection were handed back to the pool, it would be admitted twice."""
    db = failure_db
    seed(db, 6, expression=EVERY_SECOND)
    first = start_every_second(db)

    async def body():
        ph, pq = _proxy(db, "hanging"), _proxy(db, "healthy")
        h = await InProcessReplica(db, "replica-h", proxy=ph, lease_ms=LEASE_MS, claim_budget=3).start()
        q = await InProcessReplica(db, "replica-q", proxy=pq, lease_ms=LEASE_MS, claim_budget=3).start()
        await wait_for(lambda: h.total("admitted") >= 1 and q.total("admitted") >= 1,
                       what="both replicas to admit")
        # an admission that creates a Run: the admission message also carries initialize, skip and
        # claim-release decisions, which create none, and the count below must know which it held
        rule = ph.arm(TO_SERVER, ADMISSION_MESSAGE, "hold_replies", also=(FIRE_DECISION,))
        await wait_for(rule.fired.is_set, what="H to start an admission")
        hung_at = time.monotonic()
        hung_triggers = _admitted_triggers(rule)
        hung_keys = _admitted_keys(rule)
        # the message went on whole: wait until the server is done with it (no session of H is
        # still executing an admission: it committed, or rolled back by a serialization failure
        # and its rows are taken over after expiry), so the claims left to H below are exactly
        # those its hung round never reached, or rows of the hung page the server refused (H
        # cannot claim again before its hung round is cut; Q may claim next occurrences)
        # (the forwarded bytes may not have been read by the server yet when this starts looking,
        # so "no admission executing" alone is not "done": the hung message's own text, which
        # holds its idempotency keys, must have been seen executing or have finished)
        seen: list[bool] = []

        def hung_message_done() -> bool:
            if db.count("runs", "idempotency_key = ANY (%s)", (hung_keys,)) == len(hung_keys):
                return True  # committed
            states = [r[0] for r in db.sql(
                "SELECT state FROM pg_stat_activity WHERE application_name = 'qinglong runtime replica-h' "
                "AND position(%s in query) > 0", (hung_keys[0],))]
            if states:
                seen.append(True)
            return bool(seen) and all(state == "idle" for state in states)  # rolled back, or gone

        await wait_for(hung_message_done, what=f"the server to finish the hung admission of {hung_triggers}")
        held = db.sql("SELECT trigger_id, next_fire_at_ms, claim_expires_at_ms "
                      "FROM qinglong.trigger_schedules WHERE claim_owner = 'replica-h'")
        reported_before = h.total("admitted")
        # the round is cut at its bound (the lease), on the client side, with no help from the proxy
        await wait_for(lambda: "cluster_postgres.round_timed_out" in h.sink.codes(),
                       what="H's round to be cut at its bound")
        timed_out_after_s = time.monotonic() - hung_at
        await wait_for(lambda: h.total("admitted") > reported_before, what="H to admit again")
        resumed_after_s = time.monotonic() - hung_at
        hung_connection_closed = rule.connection.closed.is_set()
        await wait_rounds([h, q], 2, "rounds after H resumed")  # room for a duplicate to show
        for r in (h, q):
            await r.stop()
        ph.close()
        pq.close()
        return (h, q, held, reported_before, timed_out_after_s, resumed_after_s, hung_connection_closed,
                hung_keys)

    h, q, held, reported_before, timed_out_after_s, resumed_after_s, hung_closed, hung_keys = asyncio.run(body())
    in_db_by_h = db.count("runs", "admitted_by = 'replica-h'")
    # whether the server committed the message whose reply H never saw: it may also have lost a
    # serialization race with Q there and rolled back by itself, and then the occurrence must have
    # been taken over and admitted once by someone else (the audit below counts it)
    hung_by = db.sql("SELECT idempotency_key, admitted_by FROM qinglong.runs "
                     "WHERE idempotency_key = ANY (%s)", (hung_keys,))
    hung_committed_by_h = sum(1 for _, by in hung_by if by == "replica-h")
    figures = audit(db.superuser_dsn(), first, "connection_hangs_open",
                    claims_left_when_hung=len(held), timed_out_after_s=round(timed_out_after_s, 2),
                    resumed_after_s=round(resumed_after_s, 2),
                    runs_by_h_in_db=in_db_by_h, runs_by_h_reported=h.total("admitted"),
                    admitted_by={"replica-h": h.total("admitted"), "replica-q": q.total("admitted")})
    runs_for_held = db.sql("SELECT trigger_id, admitted_by, admitted_at_ms FROM qinglong.runs "
                           "WHERE (trigger_id, scheduled_for_ms) IN "
                           "(SELECT * FROM unnest(%s::text[], %s::bigint[]))",
                           ([x[0] for x in held], [x[1] for x in held]))
    expiry = {x[0]: x[2] for x in held}
    if runs_for_held:
        figures.recover_s = max(at - expiry[t] for t, _, at in runs_for_held) / 1000
    figures.show()
    assert reported_before >= 1
    # cut at the bound (the lease from the round's start: the round_timed_out diagnostic waited
    # for above), not by the proxy, not by TCP keepalives (tens of seconds), and H came back. The
    # margins allow a loaded machine's scheduling delays; they never assume its speed otherwise.
    assert timed_out_after_s <= 3 * LEASE_MS / 1000
    assert resumed_after_s <= 3 * LEASE_MS / 1000 + 5.0
    # the cut connection was closed by H (never handed back to the pool): the proxy saw it go
    assert hung_closed
    # each occurrence of the page whose reply never came is in the database exactly once,
    # unreported by H (or, rolled back on the server, admitted once after the takeover): H counts
    # only what it saw
    assert sorted(k for k, _ in hung_by) == sorted(hung_keys)
    assert in_db_by_h == h.total("admitted") + hung_committed_by_h
    for trigger_id, admitted_by, admitted_at in runs_for_held:
        assert admitted_at > expiry[trigger_id]  # taken over (by Q, or H's next round) after expiry
    assert len(runs_for_held) == len(held)
    assert (figures.duplicates, figures.missing) == (0, 0)
    assert figures.found == figures.expected
