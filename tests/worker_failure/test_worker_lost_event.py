"""kill -9 of a worker mid-job is one ``worker.lost`` operator event.

The killed worker writes nothing; its loss is revealed when a replica's expiry ends the Attempt
it held after its session lease ran out, and the event must come from that transaction: once,
naming the worker, while the surviving worker's session (alive, heartbeating) is never reported.
"""

from __future__ import annotations

import pytest

from tests.worker_failure.harness import wait_until
from tests.worker_failure.test_worker_kill import RETRY, _kill_mid_job

pytestmark = pytest.mark.postgres


def _operator_events(c) -> list[tuple]:
    return [tuple(r) for r in c.rows(
        "SELECT kind, subject, detail_json->>'cause', (detail_json->>'runs_held')::int "
        "FROM qinglong.event_outbox WHERE kind NOT LIKE 'run.%%' ORDER BY seq")]


def test_a_worker_killed_mid_job_is_announced_lost_once_and_its_peer_never(cluster):
    """If the expiry path did not write it, nobody would hear that a worker died with a job;
    written per Attempt or per expiry pass it would page twice; written for the live peer it
    would be a false alarm."""
    c = cluster
    c.publish_task("plain", retry=RETRY)
    run_id, _, _, _, _ = _kill_mid_job(c, "plain")
    wait_until(lambda: c.run_states()[run_id] == "lost", "the Run to end lost")
    # the replica's expiry keeps running: three more heartbeats of the survivor bound the look
    beat = c.sessions()["wb"]["heartbeat_at_ms"]
    wait_until(lambda: c.sessions()["wb"]["heartbeat_at_ms"] >= beat + 3 * 1000 - 100,
               "three more heartbeats of worker wb")
    assert _operator_events(c) == [("worker.lost", "worker/wa", "session_expired", 1)]
