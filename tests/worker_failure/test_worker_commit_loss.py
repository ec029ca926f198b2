"""COMMIT-response loss on ``complete``: the store commits the completion, the worker never hears.

The worker reaches the store through the gateway, and the reply is lost on either side of it:

* ``http``: the proxy in front of the gateway is armed on the gateway's answer to ``complete``
  (the first chunk naming the result ``accepted``), sent only after the store committed; that
  answer and every later one on the worker's connection are swallowed;
* ``gateway_db``: the gateway's own link to PostgreSQL is armed (as
  tests/failure/test_failure_commit_loss.py does for admission) on the store's reply to
  ``worker_complete``: its data row, the first message naming ``accepted``, which the server
  sends only after it executed the call in the transaction the same message batch commits (Bind,
  Execute and Sync travel together); the gateway never hears, and neither does the worker.

Once the completion is visible to everyone but the worker, the proxy resets that connection, so
the caller sees a broken connection, not an answer. The worker must repeat the call (its fences
unchanged) and be told ``already_done``: one completion, the exit code its job really had, and no
second execution.
"""

from __future__ import annotations

import pytest

from devtools.fault_proxy import TO_CLIENT, TO_SERVER
from tests.worker_failure.harness import (
    COMPLETE_AND_CLAIM_REQUEST,
    COMPLETE_REQUEST,
    audit_runs,
    executions,
    HEARTBEAT_MS,
    exit_codes_recorded,
    figures,
    wait_until,
)

pytestmark = pytest.mark.postgres

EXIT_CODE = 3


def _events(c, run_id: str) -> list[tuple]:
    return c.rows("SELECT seq, event_type, at_ms FROM qinglong.run_events WHERE run_id = %s "
                  "ORDER BY seq", (run_id,))


def _lossy_proxy(c, worker, side: str):
    """Where the reply is lost: the worker's proxy in front of the gateway, or the gateway's link
    to the database."""
    return worker.proxy if side == "http" else c.gateway.db_proxy


SIDES = ["http", "gateway_db"]


@pytest.mark.parametrize("wf_server", ["pg18"], indirect=True)
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("cut", ["at_once", "after_a_heartbeat_fell_due"])
def test_lost_reply_of_a_committed_completion_is_repeated_and_answered_already_done(cluster, cut, side):
    """If the worker took the broken connection for a failed completion and gave up, or ran the
    job again, the Run would end lost or run twice; if the repeat were accepted as a second
    completion (or refused as a fence violation), the outcome would be recorded twice; if the
    worker dropped the Attempt instead of repeating (taking its own ended Attempt for a lease it
    lost), it would never learn that its outcome stands. Exactly one completion must stand.

    The connection is reset either at once, or once a heartbeat fell due while the reply was
    missing (the worker's calls but claims share one connection to the gateway, so that heartbeat
    waits for it and is sent first when it is back): the repeat must come either way."""
    c = cluster
    c.publish_task("lossy", hold_s=0.2, exit_code=EXIT_CODE)
    c.start_replica("replica-1")
    w = c.add_worker("w")
    proxy = w.proxy  # what the worker was answered
    lossy = _lossy_proxy(c, w, side)
    rule = lossy.arm(TO_CLIENT, b"accepted", "swallow_replies")
    c.admit("lossy")
    (run_id,) = c.wait_runs(1)
    wait_until(rule.fired.is_set, "the worker's complete call")
    # committed: the Attempt ended for everyone but the worker
    committed = wait_until(lambda: (lambda a: a if a["state"] not in ("dispatching", "running") else None)(
        c.attempts(run_id)[0]), "the completion to commit")
    assert rule.connection is not None and not rule.connection.closed.is_set(), \
        "the caller must still be waiting for its reply"
    assert "worker.completed" not in w.codes(), "the rule must have held complete's own reply"
    events_at_commit = _events(c, run_id)
    if cut == "after_a_heartbeat_fell_due":  # (the self-fence's TERM is 2.5 heartbeats away)
        wait_until(lambda: c.db.db_now_ms() > c.sessions()["w"]["heartbeat_at_ms"] + HEARTBEAT_MS + 300,
                   "a heartbeat to fall due behind the lost reply")
    replies_before = proxy.count(TO_CLIENT, b"already_done")
    rule.connection.close(rst=True)
    # the worker either repeats the call (answered already_done) or gives the Attempt up
    gave_up = ("worker.lease_lost", "worker.lease_fenced", "worker.job_forgotten", "worker.self_fenced")

    def settled():
        if proxy.count(TO_CLIENT, b"already_done") > replies_before:
            return "repeated"
        mine = [e for e in w.diagnostics() if e.get("code") in gave_up
                and e.get("attempt_id", committed["attempt_id"]) == committed["attempt_id"]]
        return f"gave up ({mine[0]['code']})" if mine else None

    how = wait_until(settled, "the worker to repeat its complete call or give the Attempt up")
    attempts = c.attempts(run_id)
    events = _events(c, run_id)
    found, dups = executions(c.markers, c.watcher)
    audit = audit_runs(c, max_attempts=1)
    figures(f"complete_reply_lost_{side}_{cut}", attempt=(committed["state"], committed.get("exit_code")),
            already_done_replies=proxy.count(TO_CLIENT, b"already_done"),
            already_done_from_store=c.gateway.db_proxy.count(TO_CLIENT, b"already_done"),
            swallowed_bytes=lossy.swallowed_bytes, events=len(events), executions=len(found),
            worker_after_the_lost_reply=how)
    assert attempts == [committed], (attempts, committed)  # the repeat changed nothing
    assert committed["state"] == "failed" and committed["exit_code"] == EXIT_CODE
    assert c.run_states()[run_id] == "failed"
    assert len(found) == 1 and found[0].how == "done" and not dups, found
    assert not exit_codes_recorded(c, found, EXIT_CODE) and not audit.problems, audit.problems
    assert events == events_at_commit, (events, events_at_commit)  # nothing written twice
    # the worker learnt its outcome stands: its repeat was answered already_done
    assert how == "repeated", how


@pytest.mark.parametrize("wf_server", ["pg18"], indirect=True)
@pytest.mark.parametrize("side", SIDES)
def test_lost_reply_of_a_committed_started_is_repeated_and_the_job_spawns_once(cluster, side):
    """The store moved the Attempt to running (``worker_started`` committed) and the reply was
    lost. If the worker spawned nothing and gave the Attempt up, a Run the store calls running
    would never run (and end lost); if the repeat were refused, the same; if the worker spawned
    before the answer, or twice, the Attempt would start twice (a duplicate start marker).

    The rule is armed on the Attempt's id before the worker starts: the first bytes sent carrying
    it are ``started``'s (the claim's reply carries it the other way); on the worker's side its
    body names the lease too."""
    c = cluster
    c.publish_task("lossy", hold_s=0.2, exit_code=EXIT_CODE)
    c.start_replica("replica-1")
    c.admit("lossy")
    (run_id,) = c.wait_runs(1)
    (attempt,) = c.attempts(run_id)
    w = c.add_worker("w", start=False)
    also = (b'"lease"',) if side == "http" else ()  # the request's body (a heartbeat has no lease)
    rule = _lossy_proxy(c, w, side).arm(TO_SERVER, attempt["attempt_id"].encode(), "swallow_replies", also=also)
    w.start()
    wait_until(rule.fired.is_set, "the worker's started call")
    running = wait_until(lambda: (lambda a: a if a["state"] == "running" else None)(c.attempts(run_id)[0]),
                         "started to commit")
    assert not rule.connection.closed.is_set(), "the caller must still be waiting for its reply"
    assert not executions(c.markers, c.watcher)[0], "nothing may be spawned before started answers"
    assert "worker.job_started" not in w.codes(), "the rule must have held started's own reply"
    rule.connection.close(rst=True)
    states = c.wait_all_terminal()
    (ended,) = c.attempts(run_id)
    found, dups = executions(c.markers, c.watcher)
    figures(f"started_reply_lost_{side}", run_state=states[run_id], executions=len(found), duplicate_starts=len(dups),
            started_at_ms=[running["started_at_ms"], ended["started_at_ms"]],
            deadline_ms=[running["deadline_ms"], ended["deadline_ms"]])
    assert len(found) == 1 and not dups, (found, dups)
    assert (ended["started_at_ms"], ended["deadline_ms"]) == (running["started_at_ms"], running["deadline_ms"])
    assert ended["state"] == "failed" and ended["exit_code"] == EXIT_CODE and states[run_id] == "failed"


@pytest.mark.parametrize("wf_server", ["pg18"], indirect=True)
@pytest.mark.parametrize("side", SIDES)
def test_lost_reply_of_a_committed_claim_leaves_no_attempt_held_by_a_live_session(cluster, side):
    """The store leased an Attempt to the worker (``worker_claim`` committed) and the reply was
    lost, so the worker never learnt of it. If the session's heartbeat kept renewing every Attempt
    of the session, this one would stay ``dispatching`` for as long as the worker lives: the Run
    would never run and never end (held until the worker stops, then requeued). A heartbeat
    renews only the Attempts the worker holds, so the lease runs out, the control plane gives the
    Attempt back, and the Run runs once."""
    c = cluster
    c.publish_task("lossy", hold_s=0.2, exit_code=EXIT_CODE)
    c.start_replica("replica-1")
    c.admit("lossy")
    (run_id,) = c.wait_runs(1)
    (attempt,) = c.attempts(run_id)
    w = c.add_worker("w", start=False)
    # the claim's reply is the first message back carrying the Attempt's id
    rule = _lossy_proxy(c, w, side).arm(TO_CLIENT, attempt["attempt_id"].encode(), "swallow_replies")
    w.start()
    wait_until(rule.fired.is_set, "the worker's claim")
    leased = wait_until(lambda: (lambda a: a if a["state"] == "dispatching" else None)(c.attempts(run_id)[0]),
                        "the claim to commit")
    assert "worker.claimed" not in w.codes(), "the rule must have held the claim's own reply"
    rule.connection.close(rst=True)
    states = c.wait_all_terminal()
    found, dups = executions(c.markers, c.watcher)
    events = [e[1] for e in _events(c, run_id)]
    figures(f"claim_reply_lost_{side}", run_state=states[run_id], executions=len(found), duplicate_starts=len(dups),
            requeued=events.count("run.requeued"), lease_version=leased["lease_version"])
    assert "run.requeued" in events, events  # given back by the control plane, then claimed again
    assert len(found) == 1 and not dups, (found, dups)
    (ended,) = c.attempts(run_id)
    assert ended["state"] == "failed" and ended["exit_code"] == EXIT_CODE and states[run_id] == "failed"


@pytest.mark.parametrize("wf_server", ["pg18"], indirect=True)
@pytest.mark.parametrize("side", SIDES)
def test_lost_reply_of_a_committed_completion_that_claimed_is_repeated_alone(cluster, side):
    """A job's end completes its Attempt and claims the next queued one in one request and one
    transaction; both commit and the answer is lost. If the worker sent the combined request
    again, it would claim a second time (more Attempts leased to nobody who knows); if it gave
    its own Attempt up, it would never learn that its outcome stands; if the Attempt the lost
    answer claimed stayed leased while the session lives, its Run would never run. The worker
    must repeat the completion alone (answered ``already_done``), and the claimed Attempt must
    run out its lease, go back to the queue and run once."""
    c = cluster
    c.publish_task("lossy", hold_s=60, exit_code=EXIT_CODE)
    c.start_replica("replica-1")
    w = c.add_worker("w", max_running=1)
    proxy = w.proxy
    c.admit("lossy")
    (first,) = c.wait_runs(1)
    wait_until(lambda: c.attempts(first)[0]["state"] == "running", "the first job to start")
    c.admit("lossy")  # queued behind it: the worker's only slot is taken
    second = [r for r in c.wait_runs(2) if r != first][0]
    rule = _lossy_proxy(c, w, side).arm(TO_CLIENT, b"accepted", "swallow_replies")
    c.release_jobs()
    wait_until(rule.fired.is_set, "the worker's complete_and_claim call")
    committed = wait_until(lambda: (lambda a: a if a["state"] not in ("dispatching", "running") else None)(
        c.attempts(first)[0]), "the completion to commit")
    leased = wait_until(lambda: (lambda a: a if a["state"] == "dispatching" else None)(c.attempts(second)[0]),
                        "the claim made with it to commit")
    assert "worker.completed" not in w.codes(), "the rule must have held the combined call's reply"
    assert proxy.count(TO_SERVER, COMPLETE_AND_CLAIM_REQUEST) == 1
    plain_before = proxy.count(TO_SERVER, COMPLETE_REQUEST)
    replies_before = proxy.count(TO_CLIENT, b"already_done")
    rule.connection.close(rst=True)
    wait_until(lambda: proxy.count(TO_CLIENT, b"already_done") > replies_before,
               "the worker to repeat its completion and be answered already_done")
    # repeated alone: a plain complete, the combined request never sent again
    assert proxy.count(TO_SERVER, COMPLETE_REQUEST) > plain_before
    assert proxy.count(TO_SERVER, COMPLETE_AND_CLAIM_REQUEST) == 1
    assert c.attempts(first) == [committed]
    states = c.wait_all_terminal()
    found, dups = executions(c.markers, c.watcher)
    events = [e[1] for e in _events(c, second)]
    audit = audit_runs(c, max_attempts=1)
    figures(f"complete_and_claim_reply_lost_{side}", run_states=states, executions=len(found),
            duplicate_starts=len(dups), requeued=events.count("run.requeued"),
            lease_version=[leased["lease_version"], c.attempts(second)[0]["lease_version"]],
            combined_requests=proxy.count(TO_SERVER, COMPLETE_AND_CLAIM_REQUEST),
            plain_complete_requests=proxy.count(TO_SERVER, COMPLETE_REQUEST))
    assert "run.requeued" in events, events  # the lost claim's lease ran out and was given back
    assert sorted(e.run_id for e in found) == sorted([first, second]) and not dups, (found, dups)
    assert all(e.how == "done" for e in found), found
    assert not exit_codes_recorded(c, found, EXIT_CODE) and not audit.problems, audit.problems
    assert states == {first: "failed", second: "failed"}, states
