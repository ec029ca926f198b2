"""The cluster's store figures about its workers (``StoreStats``: sessions by state, free slots,
queued Runs no live worker can take, ended Attempts by outcome, lost ones), read from the sessions
and Attempts the worker protocol writes, on PostgreSQL 18 and 15, and the verdict they give."""

from __future__ import annotations

from tests.support.cluster import arun
from tests.cluster.control_helpers import ProtocolWorker, admit, publish

from qinglong.contracts.observe import Verdict, assess
from tests.support.aio import closing


def stats(db):
    async def body():
        backend = db.backend("stats-reader")
        async with closing(backend):
            return await backend.reader().store_stats()

    return arun(body())


def test_workers_free_slots_stranded_runs_and_ended_attempts_are_read_from_the_store(cluster):
    """With these figures fixed at "no worker registered" a cluster whose workers all stopped
    said clear while its Runs waited forever, QinglongNoFreeWorkerSlots could never fire, and
    no end or loss reported by a worker reached a metric."""
    publish(cluster, "plain", ["true"])
    publish(cluster, "gpu", ["true"], labels=["gpu"])
    first = admit(cluster, "plain")
    before = stats(cluster)
    assert before.workers_by_state == {"live": 0, "expired": 0, "closed": 0}
    assert (before.worker_free_slots, before.runs_without_worker) == (0, 1)
    finding = assess(None, before, grace_ms=60_000)
    assert finding.verdict is Verdict.ATTENTION
    assert any("no live worker able to take them" in r for r in finding.reasons), finding

    worker = ProtocolWorker(cluster, "w1", capacity=2)
    try:
        live = stats(cluster)
        assert live.workers_by_state["live"] == 1
        assert (live.worker_free_slots, live.runs_without_worker) == (2, 0)
        (lease,) = worker.claim(2)
        assert lease.run_id == first
        worker.started(lease)
        admit(cluster, "gpu")  # requires a label this worker does not offer
        busy = stats(cluster)
        assert (busy.worker_free_slots, busy.runs_without_worker) == (1, 1)
        assert worker.complete(lease, "failed", exit_code=1)[0] == "accepted"
        second = admit(cluster, "plain")
        (lease,) = worker.claim(1)
        assert lease.run_id == second
        worker.started(lease)
        assert worker.complete(lease, "lost", reason="no completion receipt")[0] == "accepted"
        ended = stats(cluster)
        assert ended.attempts_finished == {"succeeded": 0, "failed": 1, "timed_out": 0,
                                           "cancelled": 0, "lost": 1}
        assert ended.lost_recent == 1
        worker.conn.execute("SELECT qinglong.worker_close_session(%s, %s, %s)",
                            (worker.worker_id, worker.session_id, worker.generation))
    finally:
        worker.close()
    closed = stats(cluster)
    assert closed.workers_by_state == {"live": 0, "expired": 0, "closed": 1}
    assert (closed.worker_free_slots, closed.runs_without_worker) == (0, 1)
