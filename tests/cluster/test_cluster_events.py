"""The cluster's outbox on the worker's and the control plane's paths: a worker's completion,
a retry, the expiry of a vanished session, the close of a session. Each path ends a Run in its
own SQL function; the event must come from that same transaction, once, with the outcome.
"""

from __future__ import annotations

from tests.support.cluster import arun, expire
from tests.cluster.test_worker_functions import (
    RETRY_LOST,
    Worker,
    admit,
    age_session,
    publish,
    run_row,
)
from tests.support.aio import closing


def outbox_rows(db) -> list[tuple]:
    return db.sql("SELECT kind, run_id::text, state, exit_code, duration_ms IS NOT NULL, "
                  "notify_json FROM qinglong.event_outbox WHERE kind LIKE 'run.%%' ORDER BY seq")


def test_a_workers_completion_writes_one_event_with_exit_code_duration_and_notify(cluster):
    """The worker's completion is the usual end of a cluster Run: its event must carry the exit
    code and duration the message shows, and the task's notify table as it was then; the
    completion repeated (a retried call) must not write a second one."""
    publish(cluster, "t", {"command": ["false"], "env": {"TOKEN": "s3cr3t-value"},
                           "notify": {"when": "always", "channels": ["ops"]}})
    (run_id, _), = admit(cluster, "t", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    data = b"line one\nusing s3cr3t-value here\nlast line\n"
    w.append(c, 0, data)
    assert w.complete(c, "failed", exit_code=3, log_bytes=len(data))[0] == "accepted"
    assert w.complete(c, "failed", exit_code=3, log_bytes=len(data))[0] == "already_done"
    assert outbox_rows(cluster) == [("run.failed", run_id, "failed", 3, True,
                                     {"when": "always", "channels": ["ops"]})]

    async def context():
        backend = cluster.backend("events")
        async with closing(backend):
            return await backend.outbox().run_context(run_id, 20)

    ctx = arun(context())
    assert ctx.log_tail == data[-20:] and ctx.log_cut and ctx.env_values == ("s3cr3t-value",)


def test_an_attempt_followed_by_a_retry_writes_no_event_until_the_run_ends(cluster):
    """A retry is not an outcome: an event per failed Attempt would announce a failure the
    retry may still turn into a success."""
    publish(cluster, "t", {"command": ["false"],
                           "retry": {"max_attempts": 2, "initial_backoff_ms": 0, "jitter": 0}})
    (run_id, _), = admit(cluster, "t", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    w.complete(c, "failed", exit_code=1)
    assert run_row(cluster, run_id)[0] == "retry_wait"
    assert outbox_rows(cluster) == []
    (c2,) = w.claim(1)
    w.started(c2)
    w.complete(c2, "succeeded", exit_code=0)
    assert [r[:4] for r in outbox_rows(cluster)] == [("run.succeeded", run_id, "succeeded", 0)]


def test_the_expiry_of_a_vanished_session_writes_the_lost_event(cluster):
    """A worker that vanished never reports: the control plane's expiry is the only path that
    ends its Run, so it must write the event (else nobody hears of the lost job)."""
    publish(cluster, "plain", {"command": ["true"]})
    publish(cluster, "idem", RETRY_LOST)
    (plain, _), = admit(cluster, "plain", 1)
    (idem, _), = admit(cluster, "idem", 1)
    w = Worker(cluster, "w1")
    for c in w.claim(2):
        w.started(c)
    age_session(cluster, w)
    assert sorted(a for _, _, a in expire(cluster, 10)) == ["lost", "lost"]
    # the idempotent task waits for its retry: no event for it yet
    assert [r[:3] for r in outbox_rows(cluster)] == [("run.lost", plain, "lost")]
    assert run_row(cluster, idem)[0] == "retry_wait"


def test_closing_a_session_ends_its_running_jobs_lost_with_one_event_each(cluster):
    """A worker that closes its session with jobs still running ends them lost in the close;
    each must be announced once."""
    publish(cluster, "t", {"command": ["true"]})
    runs = [r for r, _ in admit(cluster, "t", 2)]
    w = Worker(cluster, "w1")
    for c in w.claim(2):
        w.started(c)
    w.close()
    assert sorted((r[0], r[1]) for r in outbox_rows(cluster)) == sorted(
        ("run.lost", r) for r in runs)


def put_after(db, trigger_id: str, task: str, upstream: str, on: str) -> None:
    """Publish an 'after' trigger through the real publisher (admin role)."""
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition
    from qinglong.plugins.chain import AfterProvider

    async def body():
        backend = db.backend("publisher")
        backend.context.providers["after"] = AfterProvider()
        async with closing(backend):
            await backend.publisher().put_trigger(TriggerDefinition(
                "p1", trigger_id, task, "after", {"task": upstream, "on": on},
                MisfirePolicy.FIRE_ONCE, 60_000))

    arun(body())


def chained(db, trigger_id: str) -> list[tuple]:
    return db.sql("SELECT idempotency_key, state FROM qinglong.runs WHERE trigger_id = %s",
                  (trigger_id,))


def test_a_workers_completion_admits_the_chained_run_in_its_transaction(cluster):
    """The worker's completion is where a cluster Run ends: the downstream Run must be admitted
    there, once, keyed by the upstream Run (a repeated completion admits none)."""
    publish(cluster, "up", {"command": ["true"]})
    publish(cluster, "down", {"command": ["true"]})
    put_after(cluster, "after-up", "down", "up", "success")
    (run_id, _), = admit(cluster, "up", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    assert w.complete(c, "succeeded", exit_code=0)[0] == "accepted"
    assert w.complete(c, "succeeded", exit_code=0)[0] == "already_done"
    assert chained(cluster, "after-up") == [(f"ql3:chain:v1:{run_id}:after-up", "queued")]
    (d,) = w.claim(1)  # the chained Run is claimable like any other
    assert d.run_id != run_id


def test_the_expiry_of_a_vanished_session_admits_an_on_failure_chain(cluster):
    """A lost Run is a failure nobody reports but the control plane's expiry: the chain 'on
    failure' (the clean-up job) must start there."""
    publish(cluster, "up", {"command": ["true"]})
    publish(cluster, "cleanup", {"command": ["true"]})
    put_after(cluster, "on-fail", "cleanup", "up", "failure")
    (run_id, _), = admit(cluster, "up", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    age_session(cluster, w)
    assert [a for _, _, a in expire(cluster, 10)] == ["lost"]
    assert chained(cluster, "on-fail") == [(f"ql3:chain:v1:{run_id}:on-fail", "queued")]
