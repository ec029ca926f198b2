"""``complete_and_claim`` is an optional part of the worker protocol, declared in the contract
(:class:`~qinglong.contracts.worker.CombinedCompletion`): the shipped sides offer it with the
contract's signature, and a gateway a third party ships without it still serves the route with
``complete`` alone."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from qinglong.contracts.execution import AttemptOutcome, AttemptState, RunState
from qinglong.contracts.worker import (
    CombinedCompletion,
    CompletionResult,
    WorkerGateway,
    WorkerProtocol,
    WorkerRegistration,
    new_lease_token,
)
from qinglong.contracts import worker_wire as wire
from qinglong.host.http.gateway import GatewayService
from qinglong.plugins.cluster_postgres.gateway import create_worker_gateway
from qinglong.plugins.cluster_postgres.worker_client import PostgresWorkerProtocol
from qinglong.worker.http_client import HttpWorkerProtocol, _completion_body
from tests.worker.helpers import admit, publish_task, py_job, worker_dsn

SHIPPED = [HttpWorkerProtocol, PostgresWorkerProtocol]


def _parameters(function) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("side", SHIPPED + ["gateway"], ids=lambda s: getattr(s, "__name__", s))
def test_every_shipped_side_offers_the_combined_call_with_the_contracts_signature(side):
    """A side whose parameters drifted from the contract would take a keyword (``started``,
    ``log_missing_bytes``) as something else: a job that never started would be recorded as
    started, or a log's missing tail would go unmarked."""
    from qinglong.plugins.cluster_postgres.gateway import PostgresWorkerGateway

    cls = PostgresWorkerGateway if side == "gateway" else side
    assert issubclass(cls, WorkerProtocol) and issubclass(cls, CombinedCompletion)
    if side == "gateway":
        assert issubclass(cls, WorkerGateway)
    assert _parameters(cls.complete_and_claim) == _parameters(CombinedCompletion.complete_and_claim)


class _WithoutCombined:
    """A gateway as a third party could ship it: the worker protocol without the optional
    combined call. It hands every call to the real store's gateway."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        if name == "complete_and_claim":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_gateway_without_the_combined_call_serves_it_with_complete_alone(cluster):
    """If the route required the optional call, a worker talking to a third party's gateway
    would have every job's end refused and hold its Attempts until their leases ran out; if it
    claimed by another path, the claim would not see the slot the completion frees."""
    first = admit(cluster, publish_task(cluster, "plain-a", {"command": py_job("print(1)")}))
    second = admit(cluster, publish_task(cluster, "plain-b", {"command": py_job("print(2)")}))

    async def body():
        inner = await create_worker_gateway(worker_dsn(cluster), "gateway w-plain", 1)
        gateway = _WithoutCombined(inner)
        assert not isinstance(gateway, CombinedCompletion)
        try:
            service = GatewayService(gateway, limiter=None, source_of=lambda request: "test",
                                     max_claim_wait_ms=0)
            worker = WorkerRegistration("w-plain", labels=(), projects=(), capacity=1)
            session = await gateway.open_session("w-plain", [], 1, 5000)
            (held,) = await gateway.claim(session.fence, [new_lease_token()])
            assert held.run_id == first
            await gateway.started(session.fence, held.lease)
            done = AttemptOutcome(AttemptState.SUCCEEDED, exit_code=0, log_bytes=0)
            # the body the worker sends (the same helper builds it)
            answer = await service.complete_and_claim(worker, {
                **_completion_body(session.fence, held.lease, done, True, 0), "tokens": [wire.b64(new_lease_token())]})
            reply = wire.completion_of(answer["completion"])
            assert (reply.result, reply.run_state, answer["claimed"]) == (
                CompletionResult.ACCEPTED, RunState.SUCCEEDED, [])
            # the worker's own claim loop takes the slot the completion freed
            (following,) = await gateway.claim(session.fence, [new_lease_token()])
            assert following.run_id == second
        finally:
            await inner.close()

    asyncio.run(body())
