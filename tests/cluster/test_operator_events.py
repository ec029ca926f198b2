"""Operator events on the cluster, each from the SQL path that reveals it: a worker whose session
ended with Runs held (the control plane's expiry, the session's close, a newer session of the same
worker), and queued Runs no live worker can take past a grace (``check_stranded_runs``, every
replica calling it). Each must be written once per worker session or per episode, in the same
transaction as the change."""

from __future__ import annotations

import psycopg

from tests.cluster.test_worker_functions import Worker, admit, age_session, publish, run_row
from tests.support.cluster import arun, expire

RUNTIME = "qinglong_runtime"


def operator_rows(db) -> list[tuple]:
    return db.sql("SELECT kind, subject, detail_json, project_id, run_id FROM qinglong.event_outbox "
                  "WHERE kind NOT LIKE 'run.%%' ORDER BY seq")


def stranded(db, grace_ms: int) -> int:
    """One replica's check, as the runtime role (its own autocommit transaction)."""
    with psycopg.connect(db.dsn(RUNTIME), autocommit=True) as conn:
        return conn.execute("SELECT qinglong.check_stranded_runs(%s::bigint)",
                            (grace_ms,)).fetchone()[0]


def test_an_expired_session_with_runs_held_writes_one_worker_lost_event(cluster):
    """A worker that vanished with two jobs is one lost worker: the event must come with the
    expiry of its first Attempt and not again with the second (a duplicate page at night)."""
    publish(cluster, "t", {"command": ["true"]})
    runs = [r for r, _ in admit(cluster, "t", 2)]
    w = Worker(cluster, "w1")
    for c in w.claim(2):
        w.started(c)
    age_session(cluster, w)
    assert sorted(a for _, _, a in expire(cluster, 10)) == ["lost", "lost"]
    [(kind, subject, detail, project, run)] = operator_rows(cluster)
    assert (kind, subject, project, run) == ("worker.lost", "worker/w1", "", None)
    assert detail["cause"] == "session_expired" and detail["runs_held"] == 2
    assert detail["session"] == str(w.session_id) and detail["worker"] == "w1"
    assert all(run_row(cluster, r)[0] == "lost" for r in runs)
    assert expire(cluster, 10) == [] and len(operator_rows(cluster)) == 1


def test_closing_a_session_with_runs_held_writes_one_worker_lost_event(cluster):
    """A session closed while jobs still run ends them lost in the close: the close is the change
    that reveals the lost worker, so its transaction writes the event, once."""
    publish(cluster, "t", {"command": ["true"]})
    admit(cluster, "t", 2)
    w = Worker(cluster, "w1")
    for c in w.claim(2):
        w.started(c)
    w.close()
    [(kind, _, detail, _, _)] = operator_rows(cluster)
    assert (kind, detail["cause"], detail["runs_held"]) == ("worker.lost", "session_closed", 2)


def test_a_replaced_session_is_a_lost_worker_when_its_runs_expire(cluster):
    """A worker that restarted under the same id opens a new session; the old session's job is
    lost, and that loss must be announced (the new session is no sign the job survived)."""
    publish(cluster, "t", {"command": ["true"]})
    admit(cluster, "t", 1)
    old = Worker(cluster, "w1")
    (c,) = old.claim(1)
    old.started(c)
    Worker(cluster, "w1")  # the restart: generation 2
    age_session(cluster, old, attempts_only=True)
    assert [a for _, _, a in expire(cluster, 10)] == ["lost"]
    [(kind, _, detail, _, _)] = operator_rows(cluster)
    assert (kind, detail["cause"], detail["session"]) == (
        "worker.lost", "session_replaced", str(old.session_id))


def test_a_live_workers_completion_and_a_clean_close_write_no_operator_event(cluster):
    """A worker that reports its job and closes with nothing held lost nothing: an event here
    would be a false alarm on every deploy."""
    publish(cluster, "t", {"command": ["true"]})
    admit(cluster, "t", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    assert w.complete(c, "succeeded", exit_code=0)[0] == "accepted"
    w.close()
    assert operator_rows(cluster) == []


def test_runs_no_worker_can_take_open_one_episode_and_close_it_once(cluster):
    """Queued Runs no live worker can take past the grace are one queue.stalled event however
    many replicas check how often, and one queue.resumed when a worker that can take them
    appears; the next stall is a new episode."""
    publish(cluster, "t", {"command": ["true"], "labels": ["gpu"]})
    admit(cluster, "t", 2)
    assert stranded(cluster, 3_600_000) == 0  # within the grace: nothing yet
    assert operator_rows(cluster) == []
    cpu = Worker(cluster, "cpu", labels=["cpu"])
    assert stranded(cluster, 0) == 2 and stranded(cluster, 0) == 2
    [(kind, subject, detail, _, _)] = operator_rows(cluster)
    assert (kind, subject, detail["runs"], detail["labels"]) == (
        "queue.stalled", "queue", 2, [["gpu"]])
    gpu = Worker(cluster, "gpu", labels=["gpu", "x"])
    assert stranded(cluster, 0) == 0 and stranded(cluster, 0) == 0
    assert [r[0] for r in operator_rows(cluster)] == ["queue.stalled", "queue.resumed"]
    assert operator_rows(cluster)[1][2]["since_ms"] > 0
    gpu.close()
    cpu.close()
    assert stranded(cluster, 0) == 2
    assert [r[0] for r in operator_rows(cluster)] == ["queue.stalled", "queue.resumed",
                                                      "queue.stalled"]


def test_the_runtime_role_cannot_write_an_operator_event_of_another_kind(cluster):
    """The runtime role reaches the outbox only through the episode function: an arbitrary kind
    would let it forge a run's end for the receivers."""
    with psycopg.connect(cluster.dsn(RUNTIME), autocommit=True) as conn:
        try:
            conn.execute("SELECT qinglong.operator_episode('k', 'run.failed', true, 's', 'r', "
                         "'{}'::jsonb)")
        except psycopg.Error as exc:
            assert exc.sqlstate == "QL003"
        else:
            raise AssertionError("a forged kind was accepted")
    assert operator_rows(cluster) == []
