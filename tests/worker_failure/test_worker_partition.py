"""A real link cut under a running job: two workers, each in its own network namespace joined to
the host by a veth pair, reach the worker gateway through a pass-through proxy on the host end of
their link (the harness of tests/failure/test_failure_netns.py). The test cuts the link of
whichever worker runs the Run's current Attempt to the gateway: the kernel drops its packets, it
cannot renew its session, and it must stop its job (TERM, then KILL) before its lease can expire
in the database's time; only then does expiry end the Attempt lost and the other worker run
Attempt N+1. The marker job records every execution on the monotonic clock: no two may overlap,
over every cut.

Network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN; where the kernel refuses them the test
says so in its skip reason, as the replica's netns test does.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.failure.failure_helpers import env_full
from tests.failure.test_failure_netns import VethNamespace, _namespaces_permitted
from tests.worker_failure.harness import (
    audit_runs,
    executions,
    figures,
    overlaps,
    started_keys,
    wait_until,
)

pytestmark = pytest.mark.postgres


def _namespace(index: int) -> VethNamespace:
    """A namespace of its own per worker (the replica test's names carry one per process)."""
    ns = VethNamespace()
    tag = (os.getpid() + 7 * index) % 100000
    ns.name = f"qlw{tag}x{index}"
    ns.host_if, ns.ns_if = f"qwh{tag}x{index}", f"qwn{tag}x{index}"
    octet = (tag + 97 * index) % 250 + 1
    ns.host_ip, ns.ns_ip = f"10.214.{octet}.1", f"10.214.{octet}.2"
    return ns


@pytest.mark.soak
@pytest.mark.parametrize("wf_server", ["pg18"], indirect=True)
def test_worker_behind_a_cut_link_stops_its_job_before_the_run_moves_and_no_executions_overlap(cluster):
    """Each cut strands the running worker: if it did not stop its job before its lease expired
    in database time, the other worker would start Attempt N+1 while the first job still runs
    (an overlap of the markers), and the Run would execute twice at once; if expiry or the retry
    were missing, the Run would hang. Three cuts by default, ten with QINGLONG_SOAK=full."""
    refusal = _namespaces_permitted()
    if refusal is not None:
        pytest.skip(f"the kernel does not permit network namespaces here ({refusal})")
    c = cluster
    cuts = 10 if env_full() else 3
    c.publish_task("cut", retry={"max_attempts": cuts + 1, "initial_backoff_ms": 0, "jitter": 0},
                   idempotent=True)
    c.start_replica("replica-1")
    spaces, bridges, workers = {}, {}, {}
    try:
        for i, name in enumerate(("wa", "wb")):
            ns = _namespace(i)
            ns.destroy()  # a leftover of an interrupted run
            ns.create()
            spaces[name] = ns
            # the worker's proxy in front of the gateway listens on the link's host end: the bridge
            workers[name] = c.add_worker(name, listen_host=ns.host_ip,
                                         prefix=["ip", "netns", "exec", ns.name])
            bridges[name] = workers[name].proxy
        wait_until(lambda: {"wa", "wb"} <= set(c.sessions()), "both workers' sessions")
        c.admit("cut")
        (run_id,) = c.wait_runs(1)
        history = []
        for n in range(1, cuts + 1):
            def running_attempt(n=n):
                attempts = c.attempts(run_id)
                if len(attempts) == n and attempts[-1]["state"] == "running" and \
                        f"{run_id}.{attempts[-1]['attempt_id']}" in started_keys(c.markers):
                    return attempts[-1]
                return None

            current = wait_until(running_attempt, f"Attempt {n} to run")
            holder = current["worker_id"]
            other = "wb" if holder == "wa" else "wa"
            expires = c.attempts(run_id)[n - 1]["lease_expires_at_ms"]
            spaces[holder].cut()
            cut_mono, cut_at = time.monotonic(), c.db.db_now_ms()
            nxt = wait_until(lambda n=n: (lambda a: a[n] if len(a) > n and
                                          f"{run_id}.{a[n]['attempt_id']}" in started_keys(c.markers)
                                          else None)(c.attempts(run_id)),
                             f"Attempt {n + 1} to start after the cut")
            ended = c.attempts(run_id)[n - 1]
            history.append({"attempt": n, "holder": holder, "state": ended["state"],
                            "cut_at_ms": cut_at, "cut_mono": cut_mono, "lease_expires_at_ms": expires,
                            "ended_at_ms": ended.get("finished_at_ms"), "next_on": nxt["worker_id"]})
            spaces[holder].heal()
            generation = c.sessions()[holder]["generation"]
            wait_until(lambda h=holder, g=generation: c.sessions()[h]["generation"] > g
                       and c.sessions()[h]["closed_at_ms"] is None,
                       f"worker {holder} to open a new session after the heal")
            assert nxt["worker_id"] == other, history
        c.release_jobs()
        states = c.wait_all_terminal()
    finally:
        for bridge in bridges.values():
            bridge.close()
        for worker in workers.values():
            for proc in worker.generations:
                proc.close()
        for ns in spaces.values():
            ns.destroy()

    found, dups = executions(c.markers, c.watcher)
    pairs = overlaps(found)
    mine = sorted((e for e in found if e.run_id == run_id), key=lambda e: e.start)
    gaps = [round(b.start - a.end, 3) if a.end is not None else None for a, b in zip(mine, mine[1:])]
    attempts = c.attempts(run_id)
    audit = audit_runs(c, max_attempts=cuts + 1)
    # the lease expiry moved onto the monotonic clock at the cut (both clocks of this machine run
    # at one rate): how long before it the stranded job was gone (the lease may have been renewed
    # once more as the cut fell, so this is a lower bound)
    before_expiry = [round(h["cut_mono"] + (h["lease_expires_at_ms"] - h["cut_at_ms"]) / 1000 - e.end, 3)
                     for h, e in zip(history, mine) if e.end is not None]
    figures("worker_link_cut", cuts=cuts, run_state=states[run_id],
            attempts=[(a["attempt_no"], a["state"], a["worker_id"]) for a in attempts],
            how_jobs_ended=[e.how for e in mine], gap_between_executions_s=gaps,
            smallest_gap_s=min((g for g in gaps if g is not None), default=None),
            job_gone_s_before_lease_expiry=before_expiry, history=history)
    assert not dups and not pairs, (dups, pairs)
    assert [a["state"] for a in attempts] == ["lost"] * cuts + ["succeeded"], attempts
    # every stranded job was stopped (TERM from its worker, or KILL from its wrapper's fence),
    # not left to run to its end
    assert all(e.how in ("term", "killed") for e in mine[:-1]) and mine[-1].how == "done", mine
    assert states[run_id] == "succeeded" and not audit.problems, audit.problems
    assert all(b > 0 for b in before_expiry), before_expiry
