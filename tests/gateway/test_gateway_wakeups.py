"""How many waiting claims a notification wakes: the gateway's request side
(:class:`~qinglong.host.http.gateway.GatewayService`) on the store's real gateway pool and
listener (:func:`~qinglong.plugins.cluster_postgres.gateway.create_worker_gateway`, the gateway's
role, real PostgreSQL), with registered workers' real tokens. Each claim is served as the route
serves it; what the store was asked is counted on the pool's connections."""

from __future__ import annotations

import asyncio
import base64

from qinglong.contracts.worker import new_lease_token, worker_token_digest
from qinglong.host.http import gateway as http_gateway
from qinglong.host.http.gateway import GatewayService
from qinglong.plugins.cluster_postgres.gateway import create_worker_gateway
from tests.gateway.helpers import plane_settings, register
from tests.support.gateway import gateway_role_dsn
from tests.worker.helpers import PATIENCE_S, PROJECT, admit, publish_task, py_job

WAITING = 4


def _statements(gateway) -> int:
    """Statements the gateway's pool has sent so far."""
    return sum(member.calls for member in gateway._members)


async def _until(condition, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.01)


class _Fleet:
    """``WAITING`` registered workers (capacity 2, no labels), each with a session open."""

    def __init__(self, cluster, tmp_path, labels_of=lambda i: (), projects_of=lambda i: ()) -> None:
        settings = plane_settings(cluster, tmp_path)
        self.names = [f"waiter-{i}" for i in range(WAITING)]
        self.tokens = {name: register(settings, name, labels=labels_of(i), projects=projects_of(i), capacity=2)
                       for i, name in enumerate(self.names)}
        self.cluster = cluster

    async def open(self):
        gateway = await create_worker_gateway(gateway_role_dsn(self.cluster), "qinglong gateway wakeups", 2)
        service = GatewayService(gateway, limiter=None, source_of=lambda request: "test",
                                 max_claim_wait_ms=600_000)
        # the listener's start wakes whoever waits then: listen first
        await asyncio.wait_for(gateway.waiter().wait(), PATIENCE_S)
        workers = {}
        for name in self.names:
            digest = worker_token_digest(self.tokens[name])
            registration = await gateway.identify(digest)
            session = await gateway.open_session(name, registration.labels, registration.capacity, 600_000)
            workers[name] = (digest, registration, session)
        return gateway, service, workers


def _claim(service, workers, name: str) -> asyncio.Task:
    """``name``'s claim of two slots waiting up to ten minutes, served as the route serves it."""
    digest, registration, session = workers[name]
    body = {"session_id": session.fence.session_id, "generation": session.fence.generation,
            "tokens": [base64.b64encode(new_lease_token()).decode() for _ in range(2)], "wait_ms": 600_000}

    async def served():
        http_gateway._PRESENTED.set(digest)
        return name, await service.claim(registration, body)

    return asyncio.create_task(served())


def test_one_admitted_run_wakes_one_of_many_waiting_claims(cluster, tmp_path):
    """Every waiting claim used to be woken by every notification: with 20 workers waiting, the
    one Run an admission notified cost 20 token checks and 20 claims queued on the gateway's few
    connections, ahead of every heartbeat, start and completion, for one Run (20 workers
    completed fewer Runs per second than 2). One waiter is woken, checks its token and claims:
    two statements; the other claims stay waiting and take the next Run the same way."""
    trigger = publish_task(cluster, "woken-once", {"command": py_job("pass")})
    fleet = _Fleet(cluster, tmp_path)

    async def body():
        gateway, service, workers = await fleet.open()
        tasks = []
        try:
            tasks = [_claim(service, workers, name) for name in fleet.names]
            await _until(lambda: service.waits == WAITING, "every claim waiting")
            statements = _statements(gateway)
            run_id = await asyncio.to_thread(admit, cluster, trigger)
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            (winner,) = done
            name, answer = winner.result()
            assert [c["run_id"] for c in answer["claimed"]] == [run_id]
            # its wake-up and what it cost: the token checked again, one claim; no one else woken
            assert _statements(gateway) - statements == 2
            assert gateway.wakeups == gateway.notifications + 1  # + 1: the listener's start
            assert service.waits == WAITING and not any(t.done() for t in pending)
            # the others still wait, and the next Run wakes one of them alone
            statements = _statements(gateway)
            second = await asyncio.to_thread(admit, cluster, trigger)
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            (winner,) = done
            assert [c["run_id"] for c in winner.result()[1]["claimed"]] == [second]
            assert _statements(gateway) - statements == 2
            tasks = list(pending)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await gateway.close()

    asyncio.run(body())


def test_a_wakeup_for_another_workers_run_is_passed_on_until_one_takes_it(cluster, tmp_path):
    """Woken one at a time, a waiter that may not take the Run (registered for another project)
    would keep the wake-up, and the worker that may take it would find the Run only when its own
    wait ran out (minutes). A claim that takes nothing passes the wake-up on: the Run is taken
    at once by the one waiter registered for its project."""
    trigger = publish_task(cluster, "passed-on", {"command": py_job("pass")})
    fleet = _Fleet(cluster, tmp_path, projects_of=lambda i: (PROJECT,) if i == WAITING - 1 else ("elsewhere",))

    async def body():
        gateway, service, workers = await fleet.open()
        tasks = []
        try:
            tasks = [_claim(service, workers, name) for name in fleet.names]  # the taker waits last
            await _until(lambda: service.waits == WAITING, "every claim waiting")
            run_id = await asyncio.to_thread(admit, cluster, trigger)
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            (winner,) = done
            name, answer = winner.result()
            assert name == fleet.names[-1] and [c["run_id"] for c in answer["claimed"]] == [run_id]
            tasks = list(pending)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await gateway.close()

    asyncio.run(body())
