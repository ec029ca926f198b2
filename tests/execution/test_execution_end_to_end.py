"""``qinglong run`` end to end in a subprocess: scheduled jobs run and print, timeouts take the whole
process group, and a stop that detaches leaves jobs running whose outcome the next start records."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from execution_helpers import (TERMINAL, Workspace, finish_events, group_members, process_exists,
                               wait_until)


def _runs(ws: Workspace, *args: str) -> list[dict]:
    return ws.cli_json("runs", *args)


def _run_of_task(ws: Workspace, task: str) -> dict | None:
    runs = _runs(ws, "--task", task)
    return runs[0] if runs else None


def test_per_second_trigger_runs_echo_and_its_output_is_readable(tmp_path: Path):
    """The main promise: a scheduled job runs, succeeds, and what it printed can be read. If the
    dispatcher never started jobs, `runs` would show them queued forever; if the exit code or the
    log were lost, an operator could not tell that the job ran or what it said."""
    ws = Workspace(tmp_path)
    ws.cli("project", "create", "ops")
    ws.cli("task", "put", "ops", "tick", "--", "sh", "-c", "echo tick")
    ws.cli("trigger", "add", "ops", "every-second", "--task", "tick", "--cron", "* * * * * *")
    cp = ws.start("run")
    try:
        wait_until(lambda: sum(r["state"] == "succeeded" for r in _runs(ws)) >= 3,
                   "three Runs succeeded", alive=cp, interval=0.3)
    finally:
        rc = cp.terminate()
    assert rc == 0, cp.full_stderr()
    assert "Traceback" not in cp.full_stderr()

    everything = _runs(ws)
    ended_otherwise = [r for r in everything if r["state"] in TERMINAL - {"succeeded"}]
    assert ended_otherwise == [], ended_otherwise
    succeeded = _runs(ws, "--state", "succeeded")
    assert len(succeeded) >= 3
    for run in succeeded:
        assert run["trigger_id"] == "every-second", run
        assert run["exit_code"] == 0, run
        assert run["attempts"] == 1, run
        assert isinstance(run["duration_ms"], int) and run["duration_ms"] >= 0, run
        assert len(finish_events(ws, run["run_id"])) == 1
    for run in succeeded[:3]:
        logs = ws.cli("logs", run["run_id"])
        assert logs.stdout == "tick\n", logs.stdout + logs.stderr
    ws.close()


SLOW = ('echo $$ > "$D/{name}.shell"; sleep 600 & echo $! > "$D/{name}.child"; '
        '(sleep 600 & echo $! > "$D/{name}.grandchild"; wait) & wait')


def test_timeout_ends_timed_out_and_takes_the_whole_process_group(tmp_path: Path):
    """A job past its timeout must end ``timed_out`` with every process of its group gone, the
    grandchildren of a shell included, also when it ignores SIGTERM (KILL after the grace). If
    only the leader were signalled, the grandchild `sleep 600` would leak and keep running; if
    the KILL never came, a job ignoring TERM would hang forever, holding a running slot."""
    ws = Workspace(tmp_path, execution={"kill_grace_ms": 1000})
    d = tmp_path / "pids"
    d.mkdir()
    ws.cli("project", "create", "ops")
    ws.cli("task", "put", "ops", "slow", "--timeout", "1s", "--env", f"D={d}", "--",
           "sh", "-c", SLOW.format(name="slow"))
    ws.cli("task", "put", "ops", "stubborn", "--timeout", "1s", "--env", f"D={d}", "--",
           "sh", "-c", "trap '' TERM; " + SLOW.format(name="stubborn"))
    cp = ws.start("run")
    groups: dict[str, int] = {}
    try:
        cp.wait_ready()
        ws.cli("task", "run", "ops", "slow")
        ws.cli("task", "run", "ops", "stubborn")
        for name in ("slow", "stubborn"):
            wait_until(lambda: all((d / f"{name}.{p}").exists() and (d / f"{name}.{p}").read_text().strip()
                                   for p in ("shell", "child", "grandchild")),
                       f"{name}: its processes started", alive=cp)
        for name in ("slow", "stubborn"):
            run = wait_until(lambda: (r := _run_of_task(ws, name)) and r["state"] in TERMINAL and r,
                             f"{name}: the Run ended", alive=cp, interval=0.3)
            assert run["state"] == "timed_out", run
            assert run["attempts"] == 1, run
            # the group is the wrapper's pid, kept in the Attempt's directory (read from there,
            # not from /proc: under load the timeout may have ended the job before we looked)
            attempt_dir = ws.cli_json("runs", "show", run["run_id"])["attempts"][0]["attempt_dir"]
            groups[name] = int(Path(attempt_dir, "pid").read_text().split()[0])
            wait_until(lambda: not group_members(groups[name]), f"{name}: its process group gone",
                       timeout=30)
            for p in ("shell", "child", "grandchild"):
                assert not process_exists(int((d / f"{name}.{p}").read_text())), f"{name}.{p} still alive"
            assert len(finish_events(ws, run["run_id"])) == 1
            detail = ws.cli_json("runs", "show", run["run_id"])
            assert detail["attempts"][0]["state"] == "timed_out", detail
    finally:
        rc = cp.terminate()
        for pgid in groups.values():  # a failed test must not leave its `sleep 600` behind
            for pid in group_members(pgid):
                os.kill(pid, signal.SIGKILL)
    assert rc == 0, cp.full_stderr()
    assert "Traceback" not in cp.full_stderr()
    ws.close()


HOLD = ('echo "$$ $QINGLONG_ATTEMPT_ID" > "$D/{name}.started"; '
        'while [ ! -e "$D/{name}.release" ]; do sleep 0.05; done; exit {code}')


def test_detached_stop_leaves_jobs_running_and_the_next_start_records_each_once(tmp_path: Path):
    """SIGTERM of `qinglong run` with on_stop = "detach" must leave running jobs running (an
    upgrade or restart of the control plane must not kill a backup half-way), and the next
    `qinglong run` must record each job's true exit code exactly once: one that ended while no
    control plane ran (from its receipt) and one still running at the restart (re-adopted). If
    it failed, jobs would be killed by restarts, or their outcome lost (stuck running), invented
    (lost or succeeded without proof) or recorded twice."""
    ws = Workspace(tmp_path, execution={"on_stop": "detach"})
    d = tmp_path / "hold"
    d.mkdir()
    ws.cli("project", "create", "ops")
    for name, code in (("early", 7), ("late", 0)):
        ws.cli("task", "put", "ops", name, "--env", f"D={d}", "--",
               "sh", "-c", HOLD.format(name=name, code=code))
    try:
        _detach_and_restart(ws, d)
    finally:  # a failed test must not leave its jobs waiting forever
        for name in ("early", "late"):
            (d / f"{name}.release").touch()
        ws.close()


def _detach_and_restart(ws: Workspace, d: Path) -> None:
    first = ws.start("first")
    try:
        first.wait_ready()
        ws.cli("task", "run", "ops", "early")
        ws.cli("task", "run", "ops", "late")
        for name in ("early", "late"):
            wait_until(lambda: (d / f"{name}.started").exists() and (d / f"{name}.started").read_text().strip(),
                       f"{name} started", alive=first)
            wait_until(lambda: (r := _run_of_task(ws, name)) and r["state"] == "running",
                       f"{name} recorded running", alive=first, interval=0.2)
    finally:
        rc = first.terminate()
    assert rc == 0, first.full_stderr()
    jobs = {name: (d / f"{name}.started").read_text().split() for name in ("early", "late")}
    for name, (pid, _) in jobs.items():
        assert process_exists(int(pid)), f"{name}: the detaching stop killed the job"
        assert _run_of_task(ws, name)["state"] == "running"

    # "early" ends while no control plane runs: only its receipt can tell its exit code.
    (d / "early.release").touch()
    early_dir = ws.attempt_dir(jobs["early"][1])
    wait_until(lambda: (early_dir / "receipt").exists(), "early's receipt written")
    assert process_exists(int(jobs["late"][0]))

    second = ws.start("second")
    try:
        second.wait_ready()
        early = wait_until(lambda: (r := _run_of_task(ws, "early")) and r["state"] in TERMINAL and r,
                           "early recorded", alive=second, interval=0.2)
        assert (early["state"], early["exit_code"], early["attempts"]) == ("failed", 7, 1), early
        assert _run_of_task(ws, "late")["state"] == "running"
        (d / "late.release").touch()
        late = wait_until(lambda: (r := _run_of_task(ws, "late")) and r["state"] in TERMINAL and r,
                          "late recorded", alive=second, interval=0.2)
        assert (late["state"], late["exit_code"], late["attempts"]) == ("succeeded", 0, 1), late
    finally:
        rc = second.terminate()
    assert rc == 0, second.full_stderr()
    for text in (first.full_stderr(), second.full_stderr()):
        assert "Traceback" not in text, text
    for run in (early, late):
        assert len(finish_events(ws, run["run_id"])) == 1, ws.sql(
            "SELECT seq, type FROM run_events WHERE run_id = ?", (run["run_id"],))
        detail = ws.cli_json("runs", "show", run["run_id"])
        assert len(detail["attempts"]) == 1, json.dumps(detail)
