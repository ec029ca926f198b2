"""A worker's own stop request in its completion (``own_stop``), through a real ``qinglong api``
over TCP on real PostgreSQL with real registered workers: a body the protocol does not allow is
refused and changes nothing, another worker's Attempt is fenced, and a body without it (a worker
of the earlier build) completes as before."""

from __future__ import annotations

from tests.gateway.test_gateway_attacks import dump
from tests.gateway.test_gateway_complete_and_claim import SUCCEEDED, Workers, fence, queued, tokens


def cancel_reason_of(db, run_id: str):
    return db.sql("SELECT cancel_reason FROM qinglong.attempts WHERE run_id = %s", (run_id,))[0][0]


def test_own_stop_is_checked_fenced_and_optional(cluster, tmp_path):
    """If the gateway passed any reason on, a worker could record an operator's cancel nobody
    made; if it let a worker state it for another's Attempt, that one's job would be reported
    stopped and its retries withheld; if it required the key, every worker of the earlier build
    would have its completions refused and its jobs' outcomes lost."""
    w = Workers(cluster, tmp_path)
    try:
        first, second, third = queued(cluster, "one", "two", "three")
        w.open("alice")
        w.open("bob")
        held = w.claim("alice", 2)
        (bobs,) = w.claim("bob", 1)
        for claimed in held:
            w.started("alice", claimed)
        w.started("bob", bobs)
        mine = held[0]

        def complete(name: str, lease: dict, extra: dict, route: str = "complete") -> tuple[int, dict]:
            body = {**fence(w.sessions[name]), "lease": lease, "outcome": SUCCEEDED, "started": True,
                    "log_missing_bytes": 0, **extra}
            return w.clients[name].call(route, body)

        before = dump(cluster)
        for bad in ({"reason": "operator", "age_ms": 0}, {"reason": "replaced", "age_ms": 0},
                    {"reason": "timeout", "age_ms": -1}, {"reason": "timeout"}, {"age_ms": 3},
                    {"reason": "nope", "age_ms": 0}, "timeout"):
            status, answer = complete("alice", mine["lease"], {"own_stop": bad})
            assert (status, answer["error"]["code"]) == (400, "bad_worker_call"), (bad, answer)
            assert dump(cluster) == before, bad
        status, answer = complete("bob", mine["lease"], {"own_stop": {"reason": "timeout", "age_ms": 0}})
        assert (status, answer["error"]["code"]) == (409, "lease_fenced"), answer
        assert dump(cluster) == before

        status, answer = complete("alice", mine["lease"], {"own_stop": {"reason": "timeout", "age_ms": 40}})
        assert (status, answer["result"], answer["run_state"]) == (200, "accepted", "succeeded"), answer
        assert cancel_reason_of(cluster, mine["run_id"]) == "timeout"

        status, answer = complete("alice", held[1]["lease"], {"own_stop": {"reason": "shutdown", "age_ms": 0},
                                                              "tokens": tokens(1)}, route="complete_and_claim")
        assert status == 200 and answer["completion"]["result"] == "accepted", answer
        assert cancel_reason_of(cluster, held[1]["run_id"]) == "shutdown"

        status, answer = complete("bob", bobs["lease"], {})  # as a worker of the earlier build sends it
        assert (status, answer["result"]) == (200, "accepted"), answer
        assert cancel_reason_of(cluster, bobs["run_id"]) is None
        assert {mine["run_id"], held[1]["run_id"], bobs["run_id"]} == {first, second, third}
    finally:
        w.close()
