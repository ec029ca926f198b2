"""A cluster worker runs a job that leaves a helper holding its output: the job's own exit is
its outcome after the bounded drain, the helper left in its group is ended (`[worker] orphans`
= "kill"), and one that escaped with setsid is named in the Attempt's reason."""

from __future__ import annotations

import os
import shutil
import signal

from tests.support.procs import process_alive, wait_until
from tests.worker.helpers import admit, attempts, publish_task, start_worker, wait_run_state


def test_a_worker_records_exit_0_of_a_job_beside_its_setsid_daemon_without_waiting_its_timeout(cluster, tmp_path, worker_gateway):
    """Without the drain the worker's Run stays `running` (its lease renewed) until the task's
    timeout, ends `timed_out` with no exit code, and the helper in its group lives on."""
    program = tmp_path / "mydaemon"
    shutil.copy(shutil.which("sleep"), program)
    pids, helper = tmp_path / "daemon.pid", tmp_path / "helper.pid"
    command = ["sh", "-c", f"echo out; setsid sh -c 'echo $$ > {pids}; exec {program} 300' & "
                           f"sleep 300 & echo $! > {helper}; exit 0"]
    trigger = publish_task(cluster, "leaves", {"command": command, "timeout_ms": 3_600_000})
    run_id = admit(cluster, trigger)
    worker = start_worker(worker_gateway, tmp_path, "w-orphans", orphan_drain_ms=300)
    try:
        assert wait_run_state(cluster, run_id) == "succeeded"
        (attempt,) = attempts(cluster, run_id)
        assert attempt["exit_code"] == 0
        assert "'mydaemon'" in attempt["reason"] and "setsid" in attempt["reason"], attempt
        wait_until(lambda: not process_alive(int(helper.read_text())), "the helper in the job's group to end",
                   timeout=60)
    finally:
        worker.stop()
        if pids.exists():
            try:
                os.kill(int(pids.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
