"""The PostgreSQL worker client against the real store functions: each refusal arrives as the
contract's type, a repeated call is answered as the protocol says, an unreachable or silent
store is StoreUnavailable within a bound, and no secret reaches a message."""

from __future__ import annotations

import asyncio
import sys

import pytest

from qinglong.contracts.errors import SettingsError, StoreUnavailable
from qinglong.contracts.execution import AttemptOutcome, AttemptState, RunState
from qinglong.contracts.worker import (
    SESSION_CLOSED,
    SESSION_REPLACED,
    BadWorkerCall,
    CompletionResult,
    LeaseFence,
    LeaseFenced,
    SessionFenced,
    new_lease_token,
)
from qinglong.worker.logship import ship_log
from qinglong.plugins.cluster_postgres import worker_client
from qinglong.plugins.cluster_postgres.worker_client import connect_worker_protocol
from devtools.fault_proxy import BOTH, FaultProxy
from tests.support.pg import ROLE_PASSWORDS
from tests.worker.helpers import admit, publish_task, py_job, stored_log, worker_dsn

PASSWORD = ROLE_PASSWORDS["qinglong_gateway"]


def test_every_call_maps_its_refusal_and_repeats_idempotently(cluster, tmp_path):
    """A refusal mapped to the wrong type would make the worker keep a job it lost (or drop one
    it holds); a repeat after a lost reply that were not idempotent would duplicate log bytes or
    end an Attempt twice; a token in a message would leak the lease's secret."""
    run_id = admit(cluster, publish_task(cluster, "client", {"command": py_job("print(1)")}))
    log = tmp_path / "attempt"
    log.mkdir()
    data = bytes(range(256)) * 2600  # 665,600 bytes: three chunks
    (log / "log").write_bytes(data)

    async def body():
        protocol = await connect_worker_protocol(worker_dsn(cluster), "qinglong worker w-client")
        try:
            session = await protocol.open_session("w-client", ["b", "a"], 2, 5000)
            assert session.fence.generation == 1 and session.labels == ("b", "a")
            names = cluster.sql("SELECT application_name FROM pg_stat_activity WHERE usename = "
                                "'qinglong_gateway'")
            assert ("qinglong worker w-client",) in names
            tokens = [new_lease_token(), new_lease_token()]
            (claimed,) = await protocol.claim(session.fence, tokens)
            assert claimed.run_id == run_id and claimed.lease.token in tokens
            assert claimed.payload["command"][0] == sys.executable
            lease = claimed.lease
            wrong = LeaseFence(lease.attempt_id, lease.lease_version, new_lease_token())
            with pytest.raises(LeaseFenced) as err:
                await protocol.started(session.fence, wrong)
            assert wrong.token.hex() not in str(err.value) and lease.token.hex() not in str(err.value)
            first = await protocol.started(session.fence, lease)
            # repeated (a lost reply): the same deadline
            assert (await protocol.started(session.fence, lease)).deadline_ms == first.deadline_ms
            with pytest.raises(BadWorkerCall):
                await protocol.append_log(session.fence, lease, 0, b"x" * (256 * 1024 + 1))
            with pytest.raises(BadWorkerCall):
                await protocol.append_log(session.fence, lease, 10, b"gap")
            stored = await ship_log(str(log), 0, lambda o, d: protocol.append_log(session.fence, lease, o, d))
            assert stored == len(data)
            # a resent chunk (a lost reply) changes nothing
            assert await protocol.append_log(session.fence, lease, 0, data[:1000]) == len(data)
            outcome = AttemptOutcome(AttemptState.SUCCEEDED, exit_code=0, log_bytes=len(data) + 1)
            reply = await protocol.complete(session.fence, lease, outcome)
            assert reply.result is CompletionResult.LOG_INCOMPLETE and reply.log_bytes_stored == len(data)
            outcome = AttemptOutcome(AttemptState.SUCCEEDED, exit_code=0, log_bytes=len(data))
            reply = await protocol.complete(session.fence, lease, outcome)
            assert (reply.result, reply.run_state) == (CompletionResult.ACCEPTED, RunState.SUCCEEDED)
            again = await protocol.complete(session.fence, lease, outcome)
            assert again.result is CompletionResult.ALREADY_DONE
            with pytest.raises(LeaseFenced):  # a different outcome after the end
                await protocol.complete(session.fence, lease, AttemptOutcome(AttemptState.FAILED, exit_code=1,
                                                                             log_bytes=len(data)))
            newer = await protocol.open_session("w-client", [], 2, 5000)
            assert newer.fence.generation == 2
            with pytest.raises(SessionFenced) as fenced:
                await protocol.heartbeat(session.fence, [])
            assert fenced.value.reason == SESSION_REPLACED
            beat = await protocol.heartbeat(newer.fence, [lease.attempt_id])
            assert [(s.attempt_id, s.reason) for s in beat.stop] == [(lease.attempt_id, "lease_lost")]
            await protocol.close_session(newer.fence)
            with pytest.raises(SessionFenced) as fenced:
                await protocol.heartbeat(newer.fence, [])
            assert fenced.value.reason == SESSION_CLOSED
            return lease.attempt_id
        finally:
            await protocol.close()

    attempt_id = asyncio.run(body())
    assert stored_log(cluster, attempt_id) == data


@pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)
def test_a_silent_store_is_unavailable_within_the_call_bound_and_the_next_call_reconnects(
        cluster, monkeypatch):
    """A call on a link that went silent would hang the worker's heartbeat forever (libpq waits
    for a reply that never comes); after the link is back the same protocol must work again."""
    monkeypatch.setattr(worker_client, "CALL_TIMEOUT_S", 1.0)
    server = cluster.server
    with FaultProxy((server.host, server.port), name="client-link") as proxy:
        async def body():
            protocol = await connect_worker_protocol(worker_dsn(cluster, proxy.host, proxy.port), "qinglong worker w")
            try:
                session = await protocol.open_session("w-silent", [], 1, 5000)
                proxy.partition(BOTH)
                with pytest.raises(StoreUnavailable) as err:
                    await asyncio.wait_for(protocol.heartbeat(session.fence, []), 30)
                assert PASSWORD not in str(err.value)
                proxy.heal()
                proxy.cut_all()
                beat = await protocol.heartbeat(session.fence, [])
                assert beat.stop == ()
            finally:
                await protocol.close()

        asyncio.run(body())


def test_an_unreachable_store_and_a_malformed_dsn_are_refused_without_the_password(cluster):
    """A connection error quoting the DSN would print the worker's password in its log."""
    async def unreachable():
        with pytest.raises(StoreUnavailable) as err:
            await connect_worker_protocol(f"host=127.0.0.1 port=1 user=w password={PASSWORD} connect_timeout=2",
                                          "qinglong worker w")
        assert PASSWORD not in str(err.value) and "port=1" in str(err.value)
        with pytest.raises(SettingsError) as err:
            await connect_worker_protocol(f"host=127.0.0.1 password='{PASSWORD}", "qinglong worker w")
        assert "[worker] dsn" in str(err.value) and PASSWORD not in str(err.value)

    asyncio.run(unreachable())


def test_an_idle_worker_connection_is_woken_when_an_attempt_becomes_claimable(cluster):
    """Without the notification an idle worker would claim a Run admitted after its last claim
    only at its next poll (up to a minute later); a notification left unread on the idle socket
    would never wake it."""
    trigger = publish_task(cluster, "woken", {"command": py_job("print(1)")})

    async def body():
        protocol = await connect_worker_protocol(worker_dsn(cluster), "qinglong worker w-woken")
        try:
            session = await protocol.open_session("w-woken", [], 2, 5000)
            assert await protocol.claim(session.fence, [new_lease_token()]) == []
            # idle: nothing is in flight on the connection when the Run is admitted
            waiter = protocol.claim_waiter()
            assert not waiter.is_set()
            run_id = await asyncio.to_thread(admit, cluster, trigger)
            await asyncio.wait_for(waiter.wait(), 90)
            (claimed,) = await protocol.claim(session.fence, [new_lease_token()])
            assert claimed.run_id == run_id
            # the next waiter is woken by the next notification, whichever path reads it
            waiter = protocol.claim_waiter()
            second = await asyncio.to_thread(admit, cluster, trigger)
            await protocol.heartbeat(session.fence, [claimed.attempt_id])
            await asyncio.wait_for(waiter.wait(), 90)
            (again,) = await protocol.claim(session.fence, [new_lease_token()])
            assert again.run_id == second
        finally:
            await protocol.close()

    asyncio.run(body())


def test_complete_and_claim_is_one_transaction_whose_refusal_claims_nothing(cluster):
    """The slot a completion frees is claimed in the same round trip; if a refused completion
    still claimed, the worker (which takes the call as refused) would never run what it holds,
    and if the claim did not see the completion, a full worker could never claim that way."""
    first = admit(cluster, publish_task(cluster, "pair-a", {"command": py_job("print(1)")}))
    second = admit(cluster, publish_task(cluster, "pair-b", {"command": py_job("print(2)")}))

    async def body():
        protocol = await connect_worker_protocol(worker_dsn(cluster), "qinglong worker w-pair")
        try:
            session = await protocol.open_session("w-pair", [], 1, 5000)
            (held,) = await protocol.claim(session.fence, [new_lease_token()])
            assert held.run_id == first
            await protocol.started(session.fence, held.lease)
            done = AttemptOutcome(AttemptState.SUCCEEDED, exit_code=0, log_bytes=0)
            wrong = LeaseFence(held.lease.attempt_id, held.lease.lease_version, new_lease_token())
            with pytest.raises(LeaseFenced):
                await protocol.complete_and_claim(session.fence, wrong, done, [new_lease_token()])
            assert cluster.sql("SELECT state FROM qinglong.runs WHERE run_id = %s", (second,))[0][0] == "queued"
            # a refused claim undoes the completion made before it in the same transaction
            with pytest.raises(BadWorkerCall):
                await protocol.complete_and_claim(session.fence, held.lease, done,
                                                  [new_lease_token() for _ in range(257)])
            assert cluster.sql("SELECT state FROM qinglong.attempts WHERE attempt_id = %s",
                               (held.attempt_id,))[0][0] == "running"
            # capacity 1, held: only the completion in the same transaction frees the slot
            tokens = [new_lease_token()]
            reply, claimed = await protocol.complete_and_claim(session.fence, held.lease, done, tokens)
            assert reply.result is CompletionResult.ACCEPTED and reply.run_state is RunState.SUCCEEDED
            (next_one,) = claimed
            assert next_one.run_id == second and next_one.lease.token == tokens[0]
            # a repeat (a lost reply) is answered as complete answers it; the slot is taken now
            again, more = await protocol.complete_and_claim(session.fence, held.lease, done, [new_lease_token()])
            assert again.result is CompletionResult.ALREADY_DONE and list(more) == []
        finally:
            await protocol.close()

    asyncio.run(body())
