"""The worker protocol's wire format (``qinglong/contracts/worker_wire.py``): every message the
gateway and the worker exchange survives JSON both ways unchanged, a refusal comes back as the
same refusal, and a registration the store would refuse is refused first."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong.contracts import worker_wire as wire
from qinglong.contracts.errors import StoreUnavailable
from qinglong.contracts.execution import AttemptOutcome, AttemptState, RunState
from qinglong.contracts.worker import (
    BadWorkerCall, ClaimedAttempt, CompletionReply, CompletionResult, HeartbeatReply, LeaseFence, LeaseFenced,
    LogRefused, Session, SessionFence, SessionFenced, StopOrder, check_registration, new_worker_token,
    worker_token_digest)

ids = st.text(st.characters(min_codepoint=33, max_codepoint=0x10FFFF, exclude_categories=("Cs",)),
              min_size=1, max_size=40)
ms = st.integers(0, 2**62)
tokens = st.binary(min_size=16, max_size=64)
leases = st.builds(LeaseFence, ids, st.integers(0, 2**31), tokens)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)


def through_json(value):
    return json.loads(json.dumps(value))


@given(ids, ids, st.integers(1, 2**40), st.integers(5000, 600000), st.integers(1, 256),
       st.lists(st.from_regex(r"[A-Za-z0-9_.:=/-]{1,10}", fullmatch=True), max_size=4), ms, ms)
def test_a_session_survives_the_wire(worker_id, session_id, generation, lease_ms, capacity, labels, expires, now):
    session = Session(SessionFence(worker_id, session_id, generation), lease_ms, capacity, tuple(labels), expires, now)
    assert wire.session_of(through_json(wire.session_json(session))) == session


@given(ids, ids, st.integers(1, 1000), ids, ids, st.integers(1, 10**6), ms,
       st.dictionaries(st.text(max_size=8), json_values, max_size=4), leases, ms, ms,
       st.none() | st.text(max_size=64))
def test_a_claimed_attempt_survives_the_wire(run_id, _unused, attempt_no, project, task, revision, scheduled,
                                             payload, lease, expires, now, event_payload):
    """An event's payload (a hook's body) crosses the gateway too, or a cluster job behind it
    would start without the file its environment names."""
    claimed = ClaimedAttempt(run_id, lease.attempt_id, attempt_no, project, task, revision, scheduled, payload,
                             lease, expires, now, event_payload)
    assert wire.claimed_of(through_json(wire.claimed_json(claimed))) == claimed


@given(st.sampled_from(list(AttemptState)), st.none() | st.integers(0, 255), st.none() | st.integers(1, 64),
       st.none() | st.integers(0, 2**40), st.integers(0, 2**40), st.none() | st.text(max_size=30))
def test_an_outcome_survives_the_wire(state, code, signal, log_bytes, dropped, reason):
    outcome = AttemptOutcome(state, code, signal, log_bytes=log_bytes, log_dropped_bytes=dropped, reason=reason)
    assert wire.outcome_of(through_json({"outcome": wire.outcome_json(outcome)})) == outcome


@given(ms, ms, st.lists(st.tuples(ids, ids), max_size=5), st.sampled_from(list(CompletionResult)),
       st.sampled_from(list(RunState)), st.integers(0, 2**40), st.none() | st.integers(1, 100))
def test_replies_survive_the_wire(expires, now, stops, result, run_state, stored, next_no):
    beat = HeartbeatReply(expires, now, tuple(StopOrder(a, r) for a, r in stops))
    assert wire.heartbeat_of(through_json(wire.heartbeat_json(beat))) == beat
    reply = CompletionReply(result, run_state, stored, next_no, None if next_no is None else now)
    assert wire.completion_of(through_json(wire.completion_json(reply))) == reply


@given(st.sampled_from([SessionFenced("session_expired", "expired"), SessionFenced("session_replaced", "new"),
                        LeaseFenced("lease_fenced", "gone"), LogRefused("full"), BadWorkerCall("bad"),
                        StoreUnavailable("down")]))
def test_a_refusal_comes_back_as_the_same_refusal(exc):
    status, body = wire.refusal_json(exc)
    back = wire.refusal_of(status, through_json(body))
    assert type(back) is type(exc)
    if isinstance(exc, SessionFenced):
        assert back.reason == exc.reason


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_a_malformed_message_is_a_bad_call_never_another_error(body):
    for parse in (lambda: wire.fence_of(body, "w"), lambda: wire.lease_of(body), lambda: wire.outcome_of(body)):
        try:
            parse()
        except BadWorkerCall:
            pass


def test_worker_tokens_are_random_and_stored_as_their_sha256():
    a, b = new_worker_token(), new_worker_token()
    assert a != b and a.startswith("qlw_") and len(a) == 4 + 43
    assert len(worker_token_digest(a)) == 32 and worker_token_digest(a) != worker_token_digest(b)


@pytest.mark.parametrize("worker_id, labels, projects, capacity", [
    ("", (), (), 1), ("a\tb", (), (), 1), ("w", ("bad label",), (), 1), ("w", (), ("-x",), 1),
    ("w", (), (), 0), ("w", (), (), 257), ("w", tuple(f"l{i}" for i in range(33)), (), 1)])
def test_a_registration_the_store_would_refuse_is_refused_first(worker_id, labels, projects, capacity):
    with pytest.raises(Exception) as err:
        check_registration(worker_id, labels, projects, capacity)
    assert type(err.value).__name__ in ("BadWorkerCall", "UserError")
