"""A timeout or cancel that a ``qinglong worker`` acts on after its job has already exited (the
job's output still drained): the job's own exit is its outcome, as for local execution, and a
timeout during the drain leaves what the job left to ``[worker] orphans``."""

from __future__ import annotations

import os
import shlex
import shutil
import signal

from tests.cluster.control_helpers import cli, cli_json, write_settings
from tests.support.procs import process_alive
from tests.worker.helpers import admit, attempts, publish_task, start_worker, wait_run_state, wait_until


def _exited(pid_file) -> bool:
    """The wrapper appended the job's status line to its pid file: the job's own end is on disk."""
    try:
        return pid_file.read_text().count("\n") >= 2
    except FileNotFoundError:
        return False


def test_a_job_that_exited_0_before_the_workers_timeout_keeps_its_exit(cluster, tmp_path, worker_gateway):
    """The job exited 0 at once, but a helper it left holds its output past the 2 s timeout: the
    worker recorded `timed_out` beside exit 0, the job's completed work reported as a timeout
    (and a retried timeout would run it again)."""
    command = ["sh", "-c", "sleep 300 & exit 0"]
    run_id = admit(cluster, publish_task(cluster, "quick", {"command": command, "timeout_ms": 2_000}))
    worker = start_worker(worker_gateway, tmp_path, "w-quick", orphan_drain_ms=8_000)
    try:
        state = wait_run_state(cluster, run_id)
        worker.wait_event("worker.timeout", what="the timeout to land during the drain")
        (attempt,) = attempts(cluster, run_id)
        assert (state, attempt["state"], attempt["exit_code"]) == ("succeeded", "succeeded", 0), attempt
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()


def test_runs_show_on_the_cluster_says_the_workers_timeout_came_after_the_jobs_exit_0(cluster, tmp_path,
                                                                                     worker_gateway):
    """The worker's own timeout fired while the output of a job that had exited 0 still drained
    (a helper it left holds it): the store never heard of it, so `runs show` on the cluster kept
    silent about what the local profile says (cancel requested (timeout) after the job had
    ended), and `runs show --json` lacked the cancel_reason the local store keeps."""
    command = ["sh", "-c", "echo out; sleep 300 & exit 0"]
    run_id = admit(cluster, publish_task(cluster, "late", {"command": command, "timeout_ms": 1_000}))
    worker = start_worker(worker_gateway, tmp_path, "w-late", orphan_drain_ms=8_000)
    try:
        assert wait_run_state(cluster, run_id) == "succeeded"
        worker.wait_event("worker.timeout", what="the timeout to land during the drain")
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()
    settings = write_settings(tmp_path / "cli.toml", cluster)
    shown = cli_json(settings, "runs", "show", run_id)
    (attempt,) = shown["attempts"]
    assert (shown["state"], shown["exit_code"]) == ("succeeded", 0), shown
    assert (attempt["state"], attempt["exit_code"], attempt["cancel_reason"]) == ("succeeded", 0, "timeout"), attempt
    result = cli(settings, "runs", "show", run_id)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    out = result.stdout.decode()
    assert f"run {run_id}: succeeded (exit 0)" in out, out
    assert "cancel requested (timeout) after the job had ended: its own exit is the outcome" in out, out


def test_an_operator_cancel_that_reaches_the_worker_after_the_jobs_exit_keeps_its_exit(cluster, tmp_path,
                                                                                       worker_gateway):
    """The cancel was requested once the job's exit 0 was on disk, while its output drained: the
    worker recorded `cancelled`, reporting the job's completed work as stopped by the operator."""
    command = ["sh", "-c", "sleep 300 & exit 0"]
    run_id = admit(cluster, publish_task(cluster, "done", {"command": command, "timeout_ms": 3_600_000}))
    # the drain far beyond the test's bound: only the cancel's TERM ends it
    worker = start_worker(worker_gateway, tmp_path, "w-done", orphan_drain_ms=600_000)
    try:
        attempt_id = wait_until(lambda: (rows := attempts(cluster, run_id)) and rows[0]["attempt_id"],
                                "the attempt")
        wait_until(lambda: _exited(tmp_path / "w-done-logs" / attempt_id / "pid"), "the job's own exit")
        assert cluster.sql("SELECT qinglong.request_cancel(%s, 'operator')", (run_id,),
                           role="qinglong_runtime")[0][0] == "running"
        state = wait_run_state(cluster, run_id)
        worker.wait_event("worker.cancel_requested")
        (attempt,) = attempts(cluster, run_id)
        assert (state, attempt["state"], attempt["exit_code"]) == ("succeeded", "succeeded", 0), attempt
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()


def test_a_timeout_during_the_drain_leaves_what_orphans_leave_keeps(cluster, tmp_path, worker_gateway):
    """The job exited before its deadline and the drain outlasted it: the worker's timeout TERMed
    the job's whole group and killed the service the job started on purpose, although the policy
    is `leave` and the job itself was done."""
    program = tmp_path / "mydaemon"
    shutil.copy(shutil.which("sleep"), program)
    pids = tmp_path / "daemon.pids"
    script = (f"sh -c 'echo $$ >> {shlex.quote(str(pids))}; exec {shlex.quote(str(program))} 300' & "
              f"until [ -s {shlex.quote(str(pids))} ]; do sleep 0.01; done; exit 0")
    run_id = admit(cluster, publish_task(cluster, "service", {"command": ["sh", "-c", script],
                                                              "timeout_ms": 1_000}))
    worker = start_worker(worker_gateway, tmp_path, "w-service", orphans="leave", orphan_drain_ms=5_000)
    try:
        state = wait_run_state(cluster, run_id)
        worker.wait_event("worker.timeout", what="the timeout to land during the drain")
        (attempt,) = attempts(cluster, run_id)
        assert (state, attempt["exit_code"]) == ("succeeded", 0), attempt
        (left,) = [int(p) for p in pids.read_text().split()]
        assert process_alive(left), "the timeout killed what orphans = \"leave\" keeps"
        assert 'orphans = "leave"' in attempt["reason"], attempt["reason"]
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()
        if pids.exists():
            for line in pids.read_text().split():
                try:
                    os.kill(int(line), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                wait_until(lambda pid=int(line): not process_alive(pid), f"process {line} to be gone after KILL")


def test_the_attempts_duration_is_the_jobs_not_the_drain_of_its_output(cluster, tmp_path, worker_gateway):
    """The job exited at once, but a helper it left held its output open through the worker's
    5 s drain: the cluster recorded the end when the completion arrived, a duration of 5 s where
    the local profile records the job's own few milliseconds, so the operator was shown a job
    five seconds long that never was."""
    command = ["sh", "-c", "echo out; sleep 300 & exit 0"]
    run_id = admit(cluster, publish_task(cluster, "drained", {"command": command, "timeout_ms": 3_600_000}))
    worker = start_worker(worker_gateway, tmp_path, "w-drained", orphan_drain_ms=5_000)
    try:
        assert wait_run_state(cluster, run_id) == "succeeded"
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()
    ((started, ended, reported),) = cluster.sql(
        "SELECT a.started_at_ms, a.finished_at_ms, r.finished_at_ms FROM qinglong.attempts a "
        "JOIN qinglong.runs r USING (run_id) WHERE a.run_id = %s", (run_id,))
    assert reported - started >= 5_000, (started, reported)  # the completion came after the drain
    assert 0 <= ended - started < 5_000, (started, ended, reported)
    settings = write_settings(tmp_path / "cli.toml", cluster)
    (attempt,) = cli_json(settings, "runs", "show", run_id)["attempts"]
    assert attempt["duration_ms"] == ended - started, attempt
