"""The fence keeper as the process it is (``python -I -S keeper.py GRACE_S``), driven through its
stdin as the worker drives it, guarding real process groups."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import qinglong.worker as worker_package
from tests.support.procs import group_members, process_alive, wait_until

KEEPER = Path(worker_package.__file__).resolve().parent / "keeper.py"
PATIENCE_S = 60.0


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _job(*argv: str) -> subprocess.Popen:
    """A job in its own process group, as the executor starts one."""
    return subprocess.Popen(list(argv), start_new_session=True, stdout=subprocess.PIPE)


def _order(keeper: subprocess.Popen, *lines: str) -> None:
    assert keeper.stdin is not None
    keeper.stdin.write("".join(line + "\n" for line in lines).encode("ascii"))
    keeper.stdin.flush()


def test_a_job_that_ended_on_term_before_its_kill_point_leaves_the_keeper_guarding_the_others():
    """After a self-fence the keeper TERMs a generation's jobs and KILLs at the kill point. A job
    that ended on the TERM (and was reaped) is gone at the kill point; the keeper must drop it and
    go on. If it failed there (it did: it removed the job twice and died of the KeyError), the
    worker's next order found no keeper, and until one was started again a kill -9 of the worker
    would leave every job it runs unguarded, running on beside the worker that takes its Runs
    over."""
    keeper = subprocess.Popen([sys.executable, "-I", "-S", str(KEEPER), "0.2"], stdin=subprocess.PIPE)
    polite = _job("sh", "-c", "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done")
    stubborn = None
    try:
        assert polite.stdout is not None and polite.stdout.readline() == b"ready\n"
        # TERM now, KILL only once the polite job has ended on the TERM: a kill point a fixed
        # time away would KILL it first on a loaded machine, and test nothing
        term_at = time.monotonic()
        _order(keeper, f"deadline 1 {term_at:.6f} {term_at + 3600:.6f}",
               f"job 1 {polite.pid} {polite.pid} {_start_ticks(polite.pid)}")
        assert polite.wait(timeout=PATIENCE_S) == 0  # TERMed by the keeper, and reaped

        # the kill point moved to now (a renewed schedule), then a job registered under the same
        # generation after it: the keeper drops the ended job and stops the new one at once, if
        # it is still guarding anything
        kill_at = time.monotonic()
        stubborn = _job("sleep", "600")
        _order(keeper, f"deadline 1 {term_at:.6f} {kill_at:.6f}",
               f"job 1 {stubborn.pid} {stubborn.pid} {_start_ticks(stubborn.pid)}")
        wait_until(lambda: keeper.poll() is not None or stubborn.poll() is not None,
                   "the keeper to stop the job registered after the kill point", timeout=PATIENCE_S)
        assert keeper.poll() is None, f"the keeper died (exit {keeper.returncode})"
        assert stubborn.wait(timeout=PATIENCE_S) < 0 and not group_members(stubborn.pid)

        _order(keeper, "exit")
        assert keeper.wait(timeout=PATIENCE_S) == 0
    finally:
        for proc in (polite, stubborn, keeper):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not process_alive(keeper.pid)


def test_end_of_input_stops_every_guarded_group_and_the_keeper_exits():
    """The worker killed -9: the keeper reads the end of its input and stops every job it guards
    (TERM, then KILL after the grace to a job ignoring TERM), then exits. If it did not, the jobs
    of a killed worker would run on beside their Runs' next Attempts."""
    keeper = subprocess.Popen([sys.executable, "-I", "-S", str(KEEPER), "0.2"], stdin=subprocess.PIPE)
    deaf = _job("sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done")
    try:
        assert deaf.stdout is not None and deaf.stdout.readline() == b"ready\n"
        far = time.monotonic() + 3600
        _order(keeper, f"deadline 1 {far:.6f} {far + 1:.6f}",
               f"job 1 {deaf.pid} {deaf.pid} {_start_ticks(deaf.pid)}")
        assert keeper.stdin is not None
        keeper.stdin.close()
        assert deaf.wait(timeout=PATIENCE_S) < 0  # KILLed: it ignores TERM
        assert keeper.wait(timeout=PATIENCE_S) == 0
    finally:
        for proc in (deaf, keeper):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not group_members(deaf.pid)
