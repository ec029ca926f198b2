"""Deliveries on the cluster: two ``qinglong run`` replicas deliver a Run's event once between
them, and a replica SIGKILLed in the middle of a send leaves the event to the other after its
lease, sent again under the same id."""

from __future__ import annotations

import json
import os
import signal

from tests.cluster.control_helpers import Replica, wait_for, write_settings
from tests.cluster.test_worker_functions import Worker, admit, publish
from tests.receiver_helpers import Receiver

SECRET = "cluster-hook-secret-01"


def settings_with_hook(path, cluster, owner: str, receiver: Receiver):
    write_settings(path, cluster, owner=owner)
    path.write_text(path.read_text() + "\n".join([
        "[notifications]", 'default = "always"', "poll_ms = 50", "lease_ms = 2000",
        "[notifications.channels.hook]", 'kind = "webhook"', f'url = "{receiver.url}/hook"',
        f'secret = "{SECRET}"', ""]))
    return path


def ended_run(cluster) -> str:
    publish(cluster, "t", {"command": ["false"]})
    (run_id, _), = admit(cluster, "t", 1)
    w = Worker(cluster, "w1")
    (c,) = w.claim(1)
    w.started(c)
    w.complete(c, "failed", exit_code=1)
    return run_id


def delivery_rows(cluster):
    return cluster.sql("SELECT o.event_id::text, d.state, d.tries FROM qinglong.event_deliveries d "
                       "JOIN qinglong.event_outbox o ON o.seq = d.event_seq")


def test_a_replica_killed_mid_send_leaves_the_event_to_another_under_the_same_id(cluster, tmp_path):
    """A replica that dies while the receiver holds its request never records the send: the
    event must not be lost (another replica sends it once the lease ran out) nor change id."""
    receiver = Receiver()
    receiver.hold.set()
    run_id = ended_run(cluster)
    first = Replica(settings_with_hook(tmp_path / "a.toml", cluster, "replica-a", receiver))
    try:
        [(_, headers, body)] = receiver.wait_for(1)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(60)
    finally:
        first.stop()
    receiver.hold.clear()
    receiver.released.set()
    second = Replica(settings_with_hook(tmp_path / "b.toml", cluster, "replica-b", receiver))
    try:
        seen = receiver.wait_for(2)
        wait_for(lambda: delivery_rows(cluster)[0][1] == "delivered", "the redelivery recorded")
    finally:
        second.stop()
    assert {h["X-Qinglong-Event"] for _, h, _ in seen} == {headers["X-Qinglong-Event"]}
    assert json.loads(seen[-1][2])["run"] == json.loads(body)["run"] == run_id
    [(event_id, state, tries)] = delivery_rows(cluster)
    assert (event_id, state, tries) == (headers["X-Qinglong-Event"], "delivered", 1)
    receiver.close()


def test_two_replicas_deliver_each_event_once_between_them(cluster, tmp_path):
    """Every replica runs the delivery loop: without the lease each event would reach the
    receiver once per replica."""
    receiver = Receiver()
    publish(cluster, "t", {"command": ["false"]})
    runs = [r for r, _ in admit(cluster, "t", 6)]
    replicas = [Replica(settings_with_hook(tmp_path / f"{n}.toml", cluster, f"replica-{n}", receiver))
                for n in ("a", "b")]
    try:
        for r in replicas:
            r.wait_ready()
        w = Worker(cluster, "w1")
        for c in w.claim(6):
            w.started(c)
            w.complete(c, "failed", exit_code=1)
        wait_for(lambda: len(delivery_rows(cluster)) == 6
                 and all(s == "delivered" for _, s, _ in delivery_rows(cluster)),
                 "every event delivered")
    finally:
        for r in replicas:
            r.stop()
    ids = [h["X-Qinglong-Event"] for _, h, _ in receiver.received]
    assert len(ids) == len(set(ids)) == 6
    assert sorted(json.loads(b)["run"] for _, _, b in receiver.received) == sorted(runs)
    receiver.close()
