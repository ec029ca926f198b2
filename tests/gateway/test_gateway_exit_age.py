"""The age of the job's exit in a worker's completion (``exit_age_ms``), through a real
``qinglong api`` over TCP on real PostgreSQL with real registered workers: anything but an
integer >= 0 is refused and changes nothing, another worker's Attempt is fenced, a huge age is
held at the Attempt's start, and a body without it (a worker of the earlier build) completes as
before."""

from __future__ import annotations

from tests.gateway.test_gateway_attacks import dump
from tests.gateway.test_gateway_complete_and_claim import SUCCEEDED, Workers, fence, queued, tokens


def times_of(db, run_id: str) -> tuple:
    return db.sql("SELECT a.started_at_ms, a.finished_at_ms, r.finished_at_ms FROM qinglong.attempts a "
                  "JOIN qinglong.runs r USING (run_id) WHERE a.run_id = %s", (run_id,))[0]


def test_exit_age_is_checked_fenced_clamped_and_optional(cluster, tmp_path):
    """If the gateway passed a negative or fractional age on, a worker could date a job's end
    after its report or make the store fail; if it let a worker date another's Attempt, that
    job's duration would be rewritten; if it required the key, every worker of the earlier build
    would have its completions refused and its jobs' outcomes lost."""
    w = Workers(cluster, tmp_path)
    try:
        queued(cluster, "one", "two", "three")
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
        for bad in (-1, 1.5, "10", True, 2 ** 63, -(2 ** 70), {"ms": 3}):
            status, answer = complete("alice", mine["lease"], {"exit_age_ms": bad})
            assert (status, answer["error"]["code"]) == (400, "bad_worker_call"), (bad, answer)
            assert dump(cluster) == before, bad
        status, answer = complete("bob", mine["lease"], {"exit_age_ms": 0})
        assert (status, answer["error"]["code"]) == (409, "lease_fenced"), answer
        assert dump(cluster) == before

        status, answer = complete("alice", mine["lease"], {"exit_age_ms": 2 ** 63 - 1})
        assert (status, answer["result"], answer["run_state"]) == (200, "accepted", "succeeded"), answer
        started, ended, _ = times_of(cluster, mine["run_id"])
        assert ended == started

        status, answer = complete("alice", held[1]["lease"], {"exit_age_ms": 0, "tokens": tokens(1)},
                                  route="complete_and_claim")
        assert status == 200 and answer["completion"]["result"] == "accepted", answer
        started, ended, reported = times_of(cluster, held[1]["run_id"])
        assert started <= ended == reported

        status, answer = complete("bob", bobs["lease"], {})  # as a worker of the earlier build sends it
        assert (status, answer["result"]) == (200, "accepted"), answer
        started, ended, reported = times_of(cluster, bobs["run_id"])
        assert started <= ended == reported
    finally:
        w.close()


def attempt_of(db, run_id: str) -> tuple:
    return db.sql("SELECT a.state, a.cancel_reason, a.started_at_ms, a.finished_at_ms, a.completed_late_at_ms "
                  "FROM qinglong.attempts a WHERE a.run_id = %s", (run_id,))[0]


def test_a_late_completions_stop_and_exit_age_are_checked_fenced_and_optional(cluster, tmp_path):
    """A late report (no session: the token is the proof) that passed a forged stop or age on
    would let a worker mark a job timed out or date its end after its report; one for another
    worker's Attempt would rewrite that job's outcome; one without the keys (a worker of the
    earlier build) must still be recorded, or the job's real outcome is lost."""
    w = Workers(cluster, tmp_path)
    try:
        queued(cluster, "one", "two")
        w.open("alice")
        w.open("bob")
        (mine,) = w.claim("alice", 1)
        (bobs,) = w.claim("bob", 1)
        w.started("alice", mine)
        w.started("bob", bobs)

        def late(name: str, lease: dict, extra: dict) -> tuple[int, dict]:
            return w.clients[name].call("complete_late", {"lease": lease, "outcome": SUCCEEDED, **extra})

        before = dump(cluster)
        for bad in ({"own_stop": {"reason": "operator", "age_ms": 0}},
                    {"own_stop": {"reason": "timeout", "age_ms": -1}}, {"own_stop": {"age_ms": 3}},
                    {"exit_age_ms": -1}, {"exit_age_ms": 2.5}, {"exit_age_ms": "3"}, {"exit_age_ms": 2 ** 63}):
            status, answer = late("alice", mine["lease"], bad)
            assert (status, answer["error"]["code"]) == (400, "bad_worker_call"), (bad, answer)
            assert dump(cluster) == before, bad
        status, answer = late("bob", mine["lease"], {"own_stop": {"reason": "timeout", "age_ms": 0},
                                                     "exit_age_ms": 0})
        assert (status, answer["error"]["code"]) == (409, "lease_fenced"), answer
        assert dump(cluster) == before

        status, answer = late("alice", mine["lease"], {"own_stop": {"reason": "timeout", "age_ms": 10},
                                                       "exit_age_ms": 2 ** 63 - 1})
        assert (status, answer["result"], answer["run_state"]) == (200, "accepted", "succeeded"), answer
        state, reason, started, ended, completed_late = attempt_of(cluster, mine["run_id"])
        assert (state, reason, ended) == ("succeeded", "timeout", started) and completed_late is not None

        status, answer = late("bob", bobs["lease"], {})  # as a worker of the earlier build sends it
        assert (status, answer["result"]) == (200, "accepted"), answer
        state, reason, started, ended, completed_late = attempt_of(cluster, bobs["run_id"])
        assert (state, reason, ended) == ("succeeded", None, completed_late)
    finally:
        w.close()
