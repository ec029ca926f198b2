"""The bound on a task's waiting Runs comes from the replicas, not the workers: every path by which
a replica admits a Run writes its ``[execution] max_queued`` on it (a scheduled occurrence, an
event source's occurrence), and a key whose Run was skipped admits nothing again."""

from __future__ import annotations

import uuid

from tests.cluster.control_helpers import publish
from tests.support.aio import closing
from tests.support.cluster import arun, set_cursor


def test_every_run_a_replica_admits_carries_its_max_queued_and_a_skipped_key_admits_nothing(cluster):
    """A Run admitted without the replica's bound would let its task's backlog grow without limit
    on the cluster (75 Runs waiting and growing on one task); an event re-sent after its Run was
    skipped would run what the task's rules skipped."""
    publish(cluster, "nightly", ["true"], concurrency="forbid")
    set_cursor(cluster, "nightly", -1000)

    async def body():
        backend = cluster.backend("admitter", max_queued=5)
        async with closing(backend):
            report = await backend.run_round()
            assert report.admitted == 1, report
            now = cluster.db_now_ms()
            event = f"ev-{uuid.uuid4()}"
            first = await backend.occurrences().admit_occurrence("cron", "nightly", event, None, now)
            assert first.created
            (attempt,) = cluster.sql("SELECT attempt_id FROM qinglong.attempts WHERE run_id = %s",
                                     (first.run_id,))[0]
            cluster.sql("SELECT qinglong._skip_run(%s, %s, 'skipped: test', %s)", (first.run_id, attempt, now))
            again = await backend.occurrences().admit_occurrence("cron", "nightly", event, None, now)
            return first.run_id, again

    skipped, again = arun(body())
    assert cluster.sql("SELECT DISTINCT max_queued FROM qinglong.runs") == [(5,)]
    assert (again.run_id, again.created) == (skipped, False)
    assert cluster.count("runs", "run_id = %s", (skipped,)) == 0
    assert cluster.count("run_skips", "run_id = %s", (skipped,)) == 1
