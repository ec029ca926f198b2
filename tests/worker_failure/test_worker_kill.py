"""kill -9 of a worker in the middle of a job.

A SIGKILLed worker cannot report, renew or stop anything: its session lease runs out in the
database's time, a replica's expiry ends its started Attempt ``lost``, and the retry policy
decides: a task not marked idempotent is never retried (its job may have run to its end), an
idempotent one gets Attempt 2 on another worker. The marker job records each execution on the
monotonic clock, so the tests also see whether the killed worker's job (a process of its own
session, which the worker's death does not end) runs at the same time as Attempt 2.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.worker_failure.harness import (
    audit_runs,
    executions,
    figures,
    overlaps,
    started_keys,
    wait_until,
)

pytestmark = pytest.mark.postgres

RETRY = {"max_attempts": 3, "initial_backoff_ms": 0, "jitter": 0}


def _running_on(c, run_id: str, worker_id: str) -> dict | None:
    attempts = c.attempts(run_id)
    last = attempts[-1] if attempts else None
    if last and last["state"] == "running" and last.get("worker_id") == worker_id:
        if f"{run_id}.{last['attempt_id']}" in started_keys(c.markers):
            return last
    return None


def _group_and_session(pid: int | None) -> tuple[int, int] | None:
    """(process group, session) of a live process, from /proc/PID/stat."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[2]), int(fields[3])


def _children_naming(parent: int, needle: bytes) -> list[int]:
    """Live children of ``parent`` whose command line contains ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if ppid == parent and needle in cmdline:
            found.append(int(entry))
    return found


def _kill_mid_job(c, task: str, how: str = "kill9"):
    """One Run of ``task`` running on worker A (alone), worker B started beside it, then A
    SIGKILLed (or frozen with SIGSTOP: ``how`` "sigstop"). Returns (run_id, A's attempt when its
    job ran, A's attempt at the kill, database time of the kill, B)."""
    c.start_replica("replica-1")
    a = c.add_worker("wa")
    c.admit(task)
    (run_id,) = c.wait_runs(1)
    first = wait_until(lambda: _running_on(c, run_id, "wa"), "the job to run on worker wa")
    b = c.add_worker("wb")
    wait_until(lambda: "wb" in c.sessions(), "worker wb's session")
    c.kill_mono = time.monotonic()
    killed_at = c.db.db_now_ms()
    if how == "kill9":
        a.process.kill9()
    elif how == "kill9_with_keeper":  # e.g. `pkill -9 -f qinglong`: the worker and its fence keeper
        keepers = _children_naming(a.pid, b"keeper")
        assert keepers, "the worker's fence keeper was not found"
        for pid in keepers:
            os.kill(pid, signal.SIGKILL)
        a.process.kill9()
    else:
        a.process.signal(signal.SIGSTOP)
    at_kill = c.attempts(run_id)[0]
    return run_id, first, at_kill, killed_at, b


def test_killed_workers_started_attempt_is_lost_after_its_lease_and_never_retried_unless_idempotent(cluster):
    """A Run of a task that is NOT idempotent (retry allows 3 Attempts) whose worker is killed -9
    mid-job. If expiry did not end the Attempt, the Run would hang 'running' forever; if it ended
    it before the lease expired, a live worker's job could be taken over; if the lost Attempt
    were retried, a job that may have run to its end would run twice."""
    c = cluster
    c.publish_task("plain", retry=RETRY)
    run_id, first, at_kill, killed_at, b = _kill_mid_job(c, "plain")
    wait_until(lambda: c.run_states()[run_id] == "lost", "the Run to end lost")
    attempts = c.attempts(run_id)
    # worker wb had its chances to claim a retry: three more heartbeats of its own
    beat = c.sessions()["wb"]["heartbeat_at_ms"]
    wait_until(lambda: c.sessions()["wb"]["heartbeat_at_ms"] >= beat + 3 * 1000 - 100,
               "three more heartbeats of worker wb")
    attempts_after = c.attempts(run_id)
    found, dups = executions(c.markers, c.watcher)
    audit = audit_runs(c, max_attempts=1, retry_lost=False)
    lost = attempts[0]
    figures("killed_worker_not_idempotent", attempts=len(attempts_after),
            lease_expires_at_ms=at_kill.get("lease_expires_at_ms"), killed_at_ms=killed_at,
            lost_at_ms=lost.get("finished_at_ms"),
            lost_ms_after_lease=(lost.get("finished_at_ms") or 0) - (at_kill.get("lease_expires_at_ms") or 0),
            executions=len(found), audit=audit.as_dict())
    assert [a["state"] for a in attempts_after] == ["lost"], attempts_after
    assert lost["finished_at_ms"] >= at_kill["lease_expires_at_ms"], (lost, at_kill)
    assert len(found) == 1 and not dups, (found, dups)
    assert not audit.problems, audit.problems


@pytest.mark.parametrize("how", ["kill9", "sigstop", "kill9_with_keeper"])
def test_killed_workers_idempotent_run_is_retried_once_elsewhere_and_never_overlaps_the_killed_job(cluster, how):
    """The same kill -9 (or a worker frozen by SIGSTOP: alive, but never scheduled; or the worker
    and its fence keeper killed together, as ``pkill -9 -f qinglong`` would), for an idempotent task: Attempt 2 must be created (policy: lost + idempotent retries), run by the
    surviving worker, and must not run while the first worker's job is still running. If it did,
    one Run would execute twice at the same time: what the self-fence exists to prevent, and a
    worker that is dead or frozen cannot self-fence."""
    c = cluster
    c.publish_task("idem", retry=RETRY, idempotent=True)
    run_id, first, at_kill, killed_at, b = _kill_mid_job(c, "idem", how)
    worker_pid = c.workers["wa"].pid
    first_key = f"{run_id}.{first['attempt_id']}"
    job_group = _group_and_session(wait_until(lambda: c.watcher.pids.get(first_key), "the first job's pid"))

    def second_started():
        attempts = c.attempts(run_id)
        if len(attempts) >= 2 and f"{run_id}.{attempts[1]['attempt_id']}" in started_keys(c.markers):
            return attempts
        return None

    first_pid = c.watcher.pids.get(first_key)
    attempts = wait_until(second_started, "Attempt 2 to start")
    first_job_alive_at_second_start = first_key in c.watcher.running()
    c.release_jobs()
    states = c.wait_all_terminal()
    attempts = c.attempts(run_id)
    found, dups = executions(c.markers, c.watcher)
    pairs = overlaps(found)
    audit = audit_runs(c, max_attempts=3)
    by_attempt = {e.attempt_id: e for e in found}
    one, two = by_attempt.get(attempts[0]["attempt_id"]), by_attempt.get(attempts[1]["attempt_id"])
    figures(f"{how}_worker_idempotent", attempts=[(a["attempt_no"], a["state"], a.get("worker_id"))
                                                  for a in attempts],
            run_state=states[run_id], first_job_alive_at_second_start=first_job_alive_at_second_start,
            worker_pid=worker_pid, first_job_pid=first_pid, first_job_pgrp_and_session=job_group,
            first_job=(one.start, one.end, one.how) if one else None,
            second_job=(two.start, two.end, two.how) if two else None,
            # the killed worker's job ran on by itself until the test released it after Attempt 2
            # had started: it would have run its whole course beside Attempt 2
            second_started_s_after_first=round(two.start - one.start, 3) if one and two else None,
            first_ended_s_after_second_started=round(one.end - two.start, 3) if one and two and one.end else None,
            lost_ms_after_lease=(attempts[0].get("finished_at_ms") or 0) - (at_kill.get("lease_expires_at_ms") or 0),
            # the lease expiry moved onto the monotonic clock at the kill (one machine, one rate)
            first_job_gone_s_before_lease_expiry=round(
                c.kill_mono + (at_kill["lease_expires_at_ms"] - killed_at) / 1000 - one.end, 3)
            if one and one.end else None,
            second_started_s_after_first_gone=round(two.start - one.end, 3) if one and two and one.end else None)
    assert attempts[0]["state"] == "lost" and attempts[0]["worker_id"] == "wa", attempts
    assert attempts[0]["finished_at_ms"] >= at_kill["lease_expires_at_ms"], (attempts, at_kill)
    assert len(attempts) == 2 and attempts[1]["worker_id"] == "wb", attempts
    assert attempts[1]["state"] == "succeeded" and states[run_id] == "succeeded", (attempts, states)
    assert not dups and not audit.problems, (dups, audit.problems)
    assert not pairs, f"the killed worker's job overlapped Attempt 2: {pairs}"


def _replay(address: tuple[str, int], token: str, chunk: bytes) -> tuple[int, bytes]:
    """``started`` again, with the body a worker sent in ``chunk`` (the request's tail: headers
    and body may travel in separate chunks) and its token; the status and body of the answer."""
    import http.client

    body = chunk.split(b"\r\n\r\n", 1)[1] if chunk.startswith(b"POST ") else chunk
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request("POST", "/worker/v1/started", body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_killed_worker_that_never_started_its_attempt_gives_it_back_and_its_late_started_is_refused(cluster):
    """Worker A claims the one Run of a task NOT idempotent, and its ``started`` call is held in
    the network (its bytes wait in the proxy in front of the gateway); A is killed -9. The
    Attempt never ran, so after the lease it must go back to the queue (not end lost) and run
    once on worker B: if expiry took it for lost, a Run that never ran would end without running;
    if it were handed on before the lease expired, A's delayed start could still land. Then A's
    held ``started`` is delivered, late (its body and token as A sent them, on a new connection:
    its own died with it): if the store accepted it, B's running Attempt would be taken back by a
    dead worker's fence."""
    from devtools.fault_proxy import TO_SERVER

    c = cluster
    c.publish_task("never", hold_s=0.5)  # not idempotent, no retry
    c.start_replica("replica-1")
    c.admit("never")
    (run_id,) = c.wait_runs(1)
    (attempt,) = c.attempts(run_id)
    a = c.add_worker("wa", start=False)
    # started's body: the first request naming the Attempt with a lease (a heartbeat has none)
    rule = a.proxy.arm(TO_SERVER, attempt["attempt_id"].encode(), "hold", also=(b'"lease"',))
    a.start()
    wait_until(rule.fired.is_set, "worker wa's started call")
    held = c.attempts(run_id)[0]
    a.process.kill9()
    b = c.add_worker("wb")
    wait_until(lambda: c.attempts(run_id)[0]["state"] == "running", "the Attempt to run on worker wb")
    taken = c.attempts(run_id)[0]
    log = c.db.server.logfile
    log_mark = log.stat().st_size
    rule.connection.close(rst=True)  # its own connection died with the worker
    a.proxy.heal()
    # the dead worker's started, now
    status, body = _replay((a.proxy.host, a.proxy.port), c.register("wa"), rule.chunk)

    def refused_in_server_log():
        with log.open("rb") as fh:
            fh.seek(log_mark)
            text = fh.read().decode(errors="replace")
        return [line for line in text.splitlines() if "fenced" in line and c.db.dbname in line]

    refusal = wait_until(refused_in_server_log, "the late started to be refused (server log)")
    states = c.wait_all_terminal()
    found, dups = executions(c.markers, c.watcher)
    (ended,) = c.attempts(run_id)
    figures("killed_before_started", held=(held["state"], held["lease_version"], held.get("worker_id")),
            taken=(taken["state"], taken["lease_version"], taken.get("worker_id")),
            taken_ms_after_lease=(taken.get("dispatched_at_ms") or 0) - (held.get("lease_expires_at_ms") or 0),
            ended=(ended["state"], ended["lease_version"], ended.get("worker_id"), ended.get("exit_code")),
            executions=len(found), run_state=states[run_id], late_started_reply=(status, body[:120]),
            late_started_refusal=refusal[0][-120:])
    assert held["state"] == "dispatching" and held["worker_id"] == "wa", held
    assert taken["worker_id"] == "wb" and taken["lease_version"] == held["lease_version"] + 1, taken
    assert taken["dispatched_at_ms"] >= held["lease_expires_at_ms"], (held, taken)
    assert status == 409 and b"fenced" in body, (status, body)
    assert ended["attempt_no"] == 1 and ended["state"] == "succeeded" and ended["worker_id"] == "wb", ended
    assert len(found) == 1 and not dups and states[run_id] == "succeeded", (found, dups)


def test_gateway_killed_9_mid_run_starts_nothing_twice_and_records_each_outcome_once(cluster):
    """The gateway (``qinglong api``) is killed -9 while two workers run jobs, and restarted on a
    port of its own (each worker's proxy, the service address, follows it). Heartbeats, log
    shipping and completions fail until it is back: if a worker retrying through the new gateway
    could start an Attempt twice, lose an outcome or record one twice, the markers and the events
    show it; if the sessions' leases did not outlast the restart, the Runs would end lost."""
    c = cluster
    lease = dict(session_lease_ms=20_000, heartbeat_ms=1000, self_fence_margin_ms=2000)
    c.publish_task("held", retry=RETRY)
    c.start_replica("replica-1")
    for name in ("wa", "wb"):
        c.add_worker(name, **lease)
    c.admit("held", 4)
    run_ids = c.wait_runs(4)
    wait_until(lambda: len(started_keys(c.markers)) == 4, "four jobs to run")
    old_port = c.gateway.port
    killed = time.monotonic()
    c.gateway.kill9()
    c.release_jobs()  # the jobs end while no gateway answers: their completions wait
    wait_until(lambda: len(c.watcher.gone_at) == 4, "the four jobs to end")
    wait_until(lambda: all("worker.store_unavailable" in w.codes() for w in c.workers.values()),
               "both workers to notice the gateway gone")
    gateway = c.restart_gateway()
    restarted_s = time.monotonic() - killed
    c.admit("held", 1)  # one more after the restart: claimed through the new gateway
    run_ids = c.wait_runs(5)
    states = c.wait_all_terminal()
    found, dups = executions(c.markers, c.watcher)
    audit = audit_runs(c, max_attempts=1)
    finished = c.rows("SELECT run_id::text, count(*) FROM qinglong.run_events "
                      "WHERE event_type = 'run.finished' GROUP BY run_id")
    figures("gateway_killed_9", runs=len(run_ids), executions=len(found), duplicate_starts=len(dups),
            ports=(old_port, gateway.port), restart_s=round(restarted_s, 2), audit=audit.as_dict(),
            worker_codes=sorted({code for w in c.workers.values() for code in w.codes()
                                 if code.startswith("worker.store")}))
    assert not dups and not overlaps(found), (dups, found)
    assert len(found) == 5 and all(e.how == "done" for e in found), found
    assert audit.by_state == {"succeeded": 5} and not audit.problems, audit.as_dict()
    assert sorted(finished) == sorted((r, 1) for r in run_ids), finished
