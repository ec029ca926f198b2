"""``POST /worker/v1/complete_and_claim``: a job's completion and the claim for the slot it frees in
one request and one store transaction, through a real ``qinglong api`` over TCP on real
PostgreSQL, with real registered workers; and a real ``qinglong worker`` that ends each job with it
(its requests counted by a proxy in front of the gateway)."""

from __future__ import annotations

import base64

from devtools.fault_proxy import TO_SERVER
from qinglong.contracts.worker import new_lease_token
from tests.gateway.helpers import (ApiGateway, GatewayPlane, WorkerHttp, cli, plane_settings, register,
                                   start_gateway_worker)
from tests.gateway.test_gateway_attacks import dump
from tests.worker.helpers import admit, publish_task, py_job, run_state, wait_run_state, wait_until
from tests.worker_failure.harness import SniffingProxy

LEASE_MS = 30_000
SUCCEEDED = {"state": "succeeded", "exit_code": 0, "signal": None, "log_bytes": 0, "log_dropped_bytes": 0,
             "reason": None}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def fence(session: dict) -> dict:
    return {"session_id": session["session_id"], "generation": session["generation"]}


def tokens(n: int) -> list[str]:
    return [b64(new_lease_token()) for _ in range(n)]


class Workers:
    """A gateway and registered workers: ``alice`` (label linux, project wp, capacity 2) and
    ``bob`` (no label, project wp, capacity 1)."""

    def __init__(self, cluster, tmp_path) -> None:
        self.db = cluster
        self.settings = settings = plane_settings(cluster, tmp_path)
        secrets = {"alice": register(settings, "alice", labels=("linux",), projects=("wp",), capacity=2),
                   "bob": register(settings, "bob", projects=("wp",), capacity=1)}
        self.api = ApiGateway(settings, tmp_path / "api.stderr")
        self.clients = {name: WorkerHttp(self.api.port, secret) for name, secret in secrets.items()}
        self.sessions: dict[str, dict] = {}

    def open(self, name: str) -> dict:
        status, session = self.clients[name].call("open_session", {"lease_ms": LEASE_MS})
        assert status == 200, session
        self.sessions[name] = session
        return session

    def claim(self, name: str, n: int) -> list[dict]:
        status, answer = self.clients[name].call("claim", {**fence(self.sessions[name]), "tokens": tokens(n),
                                                           "wait_ms": 0})
        assert status == 200, answer
        return answer["claimed"]

    def started(self, name: str, claimed: dict) -> None:
        status, answer = self.clients[name].call("started", {**fence(self.sessions[name]), "lease": claimed["lease"]})
        assert status == 200, answer

    def complete_and_claim(self, name: str, lease: dict, lease_tokens: list[str], *,
                           session: dict | None = None, token: str | None = None) -> tuple[int, dict]:
        return self.clients[name].call("complete_and_claim", {
            **fence(session or self.sessions[name]), "lease": lease, "outcome": SUCCEEDED, "started": True,
            "log_missing_bytes": 0, "tokens": lease_tokens}, token=token)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.api.stop()


def queued(db, *names: str, labels: tuple[str, ...] = (), project: str = "wp") -> list[str]:
    """One admitted Run of each task ``names`` (with the required ``labels``, in ``project``)."""
    spec = {"command": py_job("pass"), **({"labels": list(labels)} if labels else {})}
    return [admit(db, publish_task(db, name, spec, project=project)) for name in names]


def attempt_of(db, run_id: str) -> tuple:
    """The state of the Run's last Attempt and the worker it is leased to."""
    return tuple(db.sql("SELECT state, worker_id FROM qinglong.attempts WHERE run_id = %s "
                        "ORDER BY attempt_no DESC LIMIT 1", (run_id,))[0])


def test_a_completion_claims_the_slot_it_frees_in_the_same_request(cluster, tmp_path):
    """Without it every job's end costs a second request (and a second store transaction) before
    the freed slot is used; if its claim were not bounded by the session's free slots after the
    completion, a worker could hold more Attempts than it was registered for; if its repeat
    (a lost answer) claimed again, the Attempts the first one leased would be held by nobody."""
    w = Workers(cluster, tmp_path)
    try:
        first, second = queued(cluster, "held-1", "held-2", labels=("linux",))
        waiting = queued(cluster, "next-1", "next-2", "next-3")
        w.open("alice")
        held = w.claim("alice", 2)
        assert {c["run_id"] for c in held} == {first, second}
        for claimed in held:
            w.started("alice", claimed)
        fresh = tokens(2)
        status, answer = w.complete_and_claim("alice", held[0]["lease"], fresh)
        assert status == 200, answer
        assert (answer["completion"]["result"], answer["completion"]["run_state"]) == ("accepted", "succeeded")
        # capacity 2, one still held: the completion freed exactly one slot, and only one is claimed
        (taken,) = answer["claimed"]
        assert taken["run_id"] in waiting and taken["lease"]["token"] in fresh
        assert attempt_of(cluster, held[0]["run_id"])[0] == "succeeded"
        assert attempt_of(cluster, taken["run_id"]) == ("dispatching", "alice")
        assert sorted(run_state(cluster, r) for r in waiting) == ["dispatching", "queued", "queued"]
        snapshot = dump(cluster)
        # the same request again (its answer lost): answered as complete answers it, nothing claimed
        status, again = w.complete_and_claim("alice", held[0]["lease"], fresh)
        assert status == 200, again
        assert (again["completion"]["result"], again["claimed"]) == ("already_done", [])
        assert dump(cluster) == snapshot
    finally:
        w.close()


def test_a_refused_completion_claims_nothing_and_a_claim_keeps_to_the_registration(cluster, tmp_path):
    """Each refusal must leave the store as it was: otherwise bob, knowing alice's fence or lease,
    could end her Attempt with an outcome of his, a claim beyond the registered capacity could
    hoard the queue under long leases, and a completion refused by its claim would still end
    the Attempt the worker goes on running. The claim that rides on a completion is offered only
    what a claim is: no Run needing a label bob was never given, none of another project."""
    w = Workers(cluster, tmp_path)
    try:
        (alices,) = queued(cluster, "alices", labels=("linux",))
        (bobs,) = queued(cluster, "bobs")
        w.open("alice")
        (alice_holds,) = w.claim("alice", 1)
        w.started("alice", alice_holds)
        w.open("bob")
        (bob_holds,) = w.claim("bob", 1)
        assert (alice_holds["run_id"], bob_holds["run_id"]) == (alices, bobs)
        w.started("bob", bob_holds)
        gpu, linux = queued(cluster, "gpu-only", labels=("gpu",)) + queued(cluster, "linux-only", labels=("linux",))
        (elsewhere,) = queued(cluster, "elsewhere", project="other")
        admin = cli(w.settings, "token", "create", "ops", "--scope", "admin").stdout.strip()
        snapshot = dump(cluster)
        # an operator's token, even an admin's, and a made-up one are no worker's: bob's own call
        # carried by either must not end his Attempt or lease anything
        for other in (admin, "qlw_" + "x" * 40):
            status, answer = w.complete_and_claim("bob", bob_holds["lease"], tokens(1), token=other)
            assert (status, answer["error"]["code"]) == (401, "unauthorized"), answer
        assert dump(cluster) == snapshot
        refused = [
            # alice's session and lease, bob's token: the store checks the fence under bob's id
            (dict(lease=alice_holds["lease"], lease_tokens=tokens(1), session=w.sessions["alice"]),
             (409, "session_fenced")),
            # bob's own session, alice's lease
            (dict(lease=alice_holds["lease"], lease_tokens=tokens(1)), (409, "lease_fenced")),
            # his own lease with a token he never held
            (dict(lease={**bob_holds["lease"], "token": b64(new_lease_token())}, lease_tokens=tokens(1)),
             (409, "lease_fenced")),
            # more tokens than the registered capacity (1): refused before the completion
            (dict(lease=bob_holds["lease"], lease_tokens=tokens(2)), (400, "bad_worker_call")),
            (dict(lease=bob_holds["lease"], lease_tokens=["not base64!"]), (400, "bad_worker_call")),
        ]
        for call, expected in refused:
            status, answer = w.complete_and_claim("bob", **call)
            assert (status, answer["error"]["code"]) == expected, (call, answer)
            assert dump(cluster) == snapshot, call
        assert attempt_of(cluster, bobs) == ("running", "bob")
        assert attempt_of(cluster, alices) == ("running", "alice")
        # bob's own completion: accepted, and nothing he may not run is claimed for his free slot
        status, answer = w.complete_and_claim("bob", bob_holds["lease"], tokens(1))
        assert status == 200, answer
        assert (answer["completion"]["result"], answer["claimed"]) == ("accepted", [])
        assert [run_state(cluster, r) for r in (gpu, linux, elsewhere)] == ["queued"] * 3
        # alice's: her label's Run, never the gpu one nor another project's
        status, answer = w.complete_and_claim("alice", alice_holds["lease"], tokens(2))
        assert status == 200, answer
        assert [c["run_id"] for c in answer["claimed"]] == [linux]
        assert [run_state(cluster, r) for r in (gpu, elsewhere)] == ["queued"] * 2
    finally:
        w.close()


def test_a_worker_ends_each_job_with_one_request_that_also_claims_the_next(cluster, tmp_path):
    """A worker that completed, then claimed, would send two requests (two store transactions,
    two round trips during which the slot idles) per job; counted in front of the gateway, each
    job's end must be one ``complete_and_claim`` and the queue must be drained without a claim
    per job."""
    jobs = 8
    runs = [admit(cluster, publish_task(cluster, f"one-by-one-{n}", {"command": py_job("pass")}))
            for n in range(jobs)]
    plane = GatewayPlane(cluster, tmp_path / "plane")
    proxy = SniffingProxy(("127.0.0.1", plane.api.port), name="count-requests", watch=(
        b"POST /worker/v1/claim ", b"POST /worker/v1/complete ", b"POST /worker/v1/complete_and_claim ")).start()
    worker = None
    try:
        token = plane.register("w-one", capacity=1)
        worker = start_gateway_worker(f"http://127.0.0.1:{proxy.port}", token, tmp_path, "w-one", max_running=1)
        for run_id in runs:
            assert wait_run_state(cluster, run_id) == "succeeded"

        def requests(call: str) -> int:
            return proxy.count(TO_SERVER, f"POST /worker/v1/{call} ".encode())

        wait_until(lambda: requests("complete_and_claim") >= jobs, "every job's end to reach the gateway")
        assert requests("complete_and_claim") == jobs and requests("complete") == 0
        # the first claim, the one waiting after the last job, and any that waited out their time:
        # never one per job
        assert requests("claim") <= 3, requests("claim")
        assert "worker.bad_call" not in worker.text() and "worker.store_unavailable" not in worker.text()
    finally:
        if worker is not None:
            worker.stop()
        proxy.close()
        plane.stop()


def test_a_connection_the_gateway_closed_while_idle_does_not_cost_the_combined_call(cluster, tmp_path):
    """A job that prints nothing for longer than the gateway's keep-alive finds its connection
    closed when it ends. The combined call is never resent once it may have reached the gateway
    (its claim is not idempotent), so a connection found closed must be replaced before it is
    sent: otherwise every such job's end would fail, wait, and fall back to two requests."""
    import asyncio

    from qinglong.contracts.execution import AttemptOutcome, AttemptState
    from qinglong.contracts.worker import CompletionResult
    from qinglong.worker.http_client import HttpWorkerProtocol
    from tests.gateway.helpers import write_gateway_worker_settings

    first, second = queued(cluster, "idle-1", "idle-2")
    settings = plane_settings(cluster, tmp_path)
    # the gateway closes a kept-alive connection idle for a second
    settings.write_text(settings.read_text().replace("request_timeout_ms = 60000", "request_timeout_ms = 1000"))
    token = register(settings, "w-idle", capacity=1)
    api = ApiGateway(settings, tmp_path / "api.stderr")
    write_gateway_worker_settings(tmp_path / "w-idle.toml", url=api.url, token=token, worker_id="w-idle",
                                  log_dir=tmp_path / "logs")

    async def body() -> None:
        protocol = HttpWorkerProtocol(api.url, str(tmp_path / "w-idle.token"), "qinglong worker w-idle")
        try:
            session = await protocol.open_session("w-idle", (), 1, LEASE_MS)
            (held,) = await protocol.claim(session.fence, [new_lease_token()])
            assert held.run_id == first
            await protocol.started(session.fence, held.lease)
            link = protocol._control
            deadline = asyncio.get_running_loop().time() + 30
            while not link._dropped():  # the gateway's keep-alive ran out and it closed the link
                assert asyncio.get_running_loop().time() < deadline, "the gateway never closed the idle link"
                await asyncio.sleep(0.05)
            calls = protocol.calls
            done = AttemptOutcome(AttemptState.SUCCEEDED, exit_code=0, log_bytes=0)
            reply, claimed = await protocol.complete_and_claim(session.fence, held.lease, done,
                                                               [new_lease_token()])
            assert reply.result is CompletionResult.ACCEPTED
            assert [c.run_id for c in claimed] == [second]
            assert protocol.calls == calls + 1
        finally:
            await protocol.close()

    try:
        asyncio.run(body())
        assert run_state(cluster, first) == "succeeded" and attempt_of(cluster, second) == ("dispatching", "w-idle")
    finally:
        api.stop()
