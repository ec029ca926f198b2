"""SIGKILL of ``qinglong run`` at aimed moments over many short jobs: every process starts at most
once per Attempt, every outcome is recorded exactly once from its evidence, no Run ends twice.

Each job's first act is to create a marker named by its Attempt id with O_EXCL (``set -C``); a second
start of the same Attempt cannot create it and leaves a ``dup.*`` marker instead. Its exit code is
a function of its Attempt id (the case patterns of :data:`JOB`, mirrored by :func:`expected_exit`),
so the test knows every finished job's true status without trusting any record of it.

The kills are aimed by watching what the control plane leaves (its SQLite file, read-only, and the
Attempt directories) and by freezing it (SIGSTOP) the moment a wanted state shows, checking which
window it is frozen in (resuming it if it is the wrong one) and then killing it (SIGKILL):

* ``dispatching`` — the Attempt is committed ``dispatching`` and no process was spawned for it;
* ``spawned`` — a wrapper process exists (or its pid file) but ``running`` is not committed;
* ``running`` — committed ``running``, the job still going (no receipt);
* ``exited`` — the job ended (its receipt is written) but the completion is not committed;
* ``random`` — at a random moment after start-up, or during start-up itself.
"""

from __future__ import annotations

import fnmatch
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from execution_helpers import (FINISH_EVENTS, RETRY_EVENT, TERMINAL, ControlPlane, Workspace,
                               lock_is_held, wait_until)

#: The job: a marker created with O_EXCL, a short sleep, an exit code chosen by the Attempt id.
JOB = r"""set -C
: > "$MARKERS/$QINGLONG_ATTEMPT_ID" 2>/dev/null || { : > "$MARKERS/dup.$QINGLONG_ATTEMPT_ID.$$"; exit 99; }
case "$QINGLONG_ATTEMPT_ID" in
*[0-4]) sleep 0.05; exit 0;;
*[5-7]) sleep 0.3; exit 3;;
*[89]) sleep 0.6; exit 0;;
*) sleep 0.1; exit 1;;
esac
"""
EXIT_BY_PATTERN = (("*[0-4]", 0), ("*[5-7]", 3), ("*[89]", 0), ("*", 1))

#: ``flaky`` retries any non-zero exit up to 3 Attempts in all, after a short backoff.
FLAKY_RETRY = {"max_attempts": 3, "initial_backoff_ms": 100, "max_backoff_ms": 200, "jitter": 0}

AIMS = ("dispatching", "spawned", "running", "exited", "random")


def expected_exit(attempt_id: str) -> int:
    """The exit code the job of ``attempt_id`` ends with (the first ``case`` pattern it matches)."""
    return next(code for pattern, code in EXIT_BY_PATTERN if fnmatch.fnmatchcase(attempt_id, pattern))


def _publish(ws: Workspace) -> None:
    env = {"MARKERS": str(ws.markers)}
    ws.cli("project", "create", "p")
    ws.cli("task", "put", "p", "job", "--payload", json.dumps({"env": env}), "--", "sh", "-c", JOB)
    ws.cli("task", "put", "p", "flaky", "--payload", json.dumps({"env": env, "retry": FLAKY_RETRY}),
           "--", "sh", "-c", JOB)
    for trigger, task in (("t-job-a", "job"), ("t-job-b", "job"), ("t-flaky", "flaky")):
        ws.cli("trigger", "add", "p", trigger, "--task", task, "--cron", "* * * * * *")


class Aimer:
    """Watches one control plane and kills it in the window it was asked for."""

    def __init__(self, ws: Workspace, cp: ControlPlane) -> None:
        self.ws = ws
        self.cp = cp
        self.wrong: set[tuple[str, str]] = set()  # (attempt, window) already seen not to be the aim

    def _active(self) -> list[tuple[str, str]]:
        return self.ws.sql("SELECT attempt_id, state FROM attempts WHERE state IN ('dispatching', 'running')")

    def window_of(self, attempt_id: str) -> str:
        """Which window the (frozen) control plane is in for ``attempt_id``."""
        rows = self.ws.sql("SELECT state FROM attempts WHERE attempt_id = ?", (attempt_id,))
        state = rows[0][0] if rows else None
        directory = self.ws.attempt_dir(attempt_id)
        receipt = (directory / "receipt").exists()
        if state == "dispatching":
            # a child naming the Attempt is its wrapper; one with our own command line is a fork
            # that has not exec'd yet (the spawn is under way: count it as spawned)
            own = _cmdline(self.cp.pid)
            spawned = (directory / "pid").exists() or any(
                attempt_id.encode() in cmdline or cmdline == own
                for cmdline in map(_cmdline, self.cp.children()))
            return "spawned" if spawned else "dispatching"
        if state == "running":
            return "exited" if receipt else "running"
        return "other"

    def kill_in(self, aim: str, deadline_s: float) -> str:
        """Kill in the ``aim`` window if it shows before ``deadline_s``; else kill anyway. Returns
        the window the kill landed in (``missed`` when the aim never showed)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.cp.process.poll() is not None:
                raise AssertionError(f"qinglong run died by itself (rc {self.cp.process.returncode}):\n"
                                     f"{self.cp.stderr()}")
            for attempt_id, state in self._active():
                if aim in ("dispatching", "spawned") and state != "dispatching":
                    continue
                if aim in ("running", "exited") and state != "running":
                    continue
                if aim == "exited" and not (self.ws.attempt_dir(attempt_id) / "receipt").exists():
                    continue
                if aim == "running" and (self.ws.attempt_dir(attempt_id) / "receipt").exists():
                    continue
                if (attempt_id, aim) in self.wrong:
                    continue
                self.cp.stop_now()
                window = self.window_of(attempt_id)
                if window == aim:
                    self.cp.kill()
                    return aim
                self.wrong.add((attempt_id, aim))
                self.cp.resume()
            time.sleep(0.0005)
        self.cp.kill()
        return "missed"


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _check_after_kill(ws: Workspace) -> None:
    """What must hold at every moment, even with the control plane dead mid-step."""
    dups = sorted(p.name for p in ws.markers.iterdir() if p.name.startswith("dup."))
    assert dups == [], f"an Attempt's process was started twice: {dups}"
    two_ended = ws.sql(
        "SELECT run_id, group_concat(type) FROM run_events WHERE type IN "
        f"({','.join('?' * len(FINISH_EVENTS))}) GROUP BY run_id HAVING count(*) > 1", FINISH_EVENTS)
    assert two_ended == [], f"Runs ended twice: {two_ended[:5]}"
    over = ws.sql("SELECT r.run_id, r.task_id, count(*) FROM runs r JOIN attempts a USING (run_id) "
                  "GROUP BY r.run_id HAVING count(*) > CASE r.task_id WHEN 'flaky' THEN ? ELSE 1 END",
                  (FLAKY_RETRY["max_attempts"],))
    assert over == [], f"more Attempts than the retry policy allows: {over[:5]}"


def _check_final(ws: Workspace) -> dict:
    """After everything ended: the whole audit (see the module docstring). Returns counts."""
    _check_after_kill(ws)
    markers = {p.name for p in ws.markers.iterdir()}
    runs = {run_id: (task, state, key) for run_id, task, state, key in ws.sql(
        "SELECT run_id, task_id, state, idempotency_key FROM runs")}
    not_ended = {r: s for r, (_, s, _) in runs.items() if s not in TERMINAL}
    assert not_ended == {}, f"Runs left non-terminal: {list(not_ended.items())[:5]}"
    attempts: dict[str, list] = {}
    for row in ws.sql("SELECT run_id, attempt_no, attempt_id, state, exit_code, signal, reason, "
                      "finished_at_ms FROM attempts ORDER BY run_id, attempt_no"):
        attempts.setdefault(row[0], []).append(row[1:])
    events: dict[str, Counter] = {}
    for run_id, kind in ws.sql("SELECT run_id, type FROM run_events"):
        events.setdefault(run_id, Counter())[kind] += 1
    outcomes: Counter = Counter()
    for run_id, (task, run_state, _) in runs.items():
        chain = attempts[run_id]
        assert [a[0] for a in chain] == list(range(1, len(chain) + 1)), f"{run_id}: attempt numbers {chain}"
        for no, attempt_id, state, exit_code, sig, reason, finished in chain:
            where = f"run {run_id} ({task}) attempt {no} {attempt_id}"
            started = attempt_id in markers
            receipt = (ws.attempt_dir(attempt_id) / "receipt").exists()
            assert state in TERMINAL, f"{where}: attempt left {state}"
            assert finished is not None, f"{where}: ended {state} without a finish time"
            if started:
                assert receipt, f"{where}: the job ran (marker) but its wrapper wrote no receipt"
            if receipt:
                assert started, f"{where}: a receipt without the job's marker"
                want = expected_exit(attempt_id)
                assert (state, exit_code) == ("succeeded" if want == 0 else "failed", want), \
                    f"{where}: the job exited {want}, recorded {state} exit_code={exit_code} ({reason})"
                assert sig is None, f"{where}: a signal recorded for a job that exited {want}"
            elif state == "lost":
                assert reason, f"{where}: lost without a reason"
            else:
                raise AssertionError(f"{where}: ended {state} (exit {exit_code}) with no process ever "
                                     f"started for it (no marker, no receipt): an invented outcome")
            outcomes[state] += 1
        ended = sum(events.get(run_id, Counter())[k] for k in FINISH_EVENTS)
        assert ended == 1, f"run {run_id}: {ended} finish events ({events.get(run_id)})"
        retried = events.get(run_id, Counter())[RETRY_EVENT]
        assert retried == len(chain) - 1, f"run {run_id}: {len(chain)} attempts, {retried} retry events"
        last = chain[-1]
        assert run_state == last[2], f"run {run_id} is {run_state}, its last attempt {last[2]}"
        for no, attempt_id, state, exit_code, *_ in chain[:-1]:
            assert state == "failed" and exit_code not in (None, 0), \
                f"run {run_id}: attempt {no} ended {state} and yet got a successor"
        if task == "job":
            assert len(chain) == 1, f"run {run_id}: a task without retry got {len(chain)} attempts"
        elif last[2] == "failed" and len(chain) < FLAKY_RETRY["max_attempts"]:
            raise AssertionError(f"run {run_id}: attempt {len(chain)} failed with retries left and "
                                 "no successor was created (a retry lost)")
    stray = markers - {a[1] for chain in attempts.values() for a in chain}
    assert stray == set(), f"markers of Attempts the store does not know: {sorted(stray)[:5]}"
    # What an operator reads (`runs --json`) says the same as the store's rows.
    listed = {r["run_id"]: r for r in ws.cli_json("runs", "--limit", "100000")}
    assert set(listed) == set(runs), "runs --json does not list every Run"
    for run_id, chain in attempts.items():
        last = chain[-1]
        shown = listed[run_id]
        assert (shown["state"], shown["exit_code"], shown["attempts"]) == (last[2], last[3], len(chain)), \
            f"runs --json shows {shown} for run {run_id} whose attempts are {chain}"
    held = [d.name for d in ws.log_dir.iterdir() if d.is_dir() and lock_is_held(d)]
    assert held == [], f"job processes still alive after every Run ended: {held}"
    return {"runs": len(runs), "attempts": sum(len(c) for c in attempts.values()), **outcomes}


def _crash_loop(ws: Workspace, kills: int, seed_value: int) -> dict:
    rng = random.Random(seed_value)
    _publish(ws)
    landed: Counter = Counter()
    manual_keys: set[str] = set()
    current: list[ControlPlane] = []
    try:
        return _kill_and_audit(ws, kills, rng, landed, manual_keys, current)
    finally:  # a failed run must not leave a (stopped) control plane behind
        for cp in current:
            if cp.process.poll() is None:
                cp.kill()


def _kill_and_audit(ws: Workspace, kills: int, rng: random.Random, landed: Counter,
                    manual_keys: set[str], current: list[ControlPlane]) -> dict:
    for n in range(kills):
        cp = ws.start(str(n))
        current[:] = [cp]
        aim = AIMS[n % len(AIMS)]
        if aim == "random":
            if rng.random() < 0.3:
                # Somewhere in start-up: migration, recovery, the reconciler, the first dispatches.
                wait_until(lambda: cp.stderr_path.stat().st_size > 0, "qinglong run writing", alive=cp)
                time.sleep(rng.uniform(0, 0.8))
                landed["startup"] += 1
            else:
                cp.wait_ready()
                time.sleep(rng.uniform(0, 1.5))
                landed["random"] += 1
            cp.kill()
        else:
            landed[Aimer(ws, cp).kill_in(aim, deadline_s=20)] += 1
        assert cp.process.returncode == -9, cp.stderr()
        assert "Traceback" not in cp.full_stderr(), cp.full_stderr()
        _check_after_kill(ws)
        if n % 4 == 2:
            # A manual Run while the control plane is down; every other one reuses a key.
            key = f"m{n - 4}" if f"m{n - 4}" in manual_keys and n % 8 == 6 else f"m{n}"
            ws.cli("task", "run", "p", "job", "--idempotency-key", key)
            manual_keys.add(key)
        if n % 5 == 4:
            # Stay down until every job ended, so the next start finds only receipts.
            wait_until(lambda: not any(lock_is_held(d) for d in ws.log_dir.iterdir() if d.is_dir()),
                       "every job ended while the control plane is down")

    # The end: one more control plane, the triggers disabled, every Run allowed to end.
    cp = ws.start("final")
    current[:] = [cp]
    cp.wait_ready()
    for trigger in ("t-job-a", "t-job-b", "t-flaky"):
        ws.cli("trigger", "disable", "p", trigger)
    wait_until(lambda: not ws.sql("SELECT 1 FROM runs WHERE state NOT IN "
                                  f"({','.join('?' * len(TERMINAL))}) LIMIT 1", tuple(sorted(TERMINAL))),
               "every Run terminal", timeout=120, alive=cp)
    assert cp.terminate() == 0, cp.full_stderr()
    assert "Traceback" not in cp.full_stderr(), cp.full_stderr()
    counts = _check_final(ws)
    manual = ws.sql("SELECT idempotency_key FROM runs WHERE idempotency_key LIKE 'ql3:manual:v1:%'")
    assert sorted(k for k, in manual) == sorted(f"ql3:manual:v1:{k}" for k in manual_keys)
    counts["landed"] = dict(landed)
    return counts


def _kills() -> int:
    return 200 if os.environ.get("QINGLONG_SOAK") == "full" else 20


@pytest.mark.soak
def test_sigkill_at_aimed_moments_never_starts_an_attempt_twice_nor_invents_an_outcome(tmp_path: Path):
    """If a kill between the dispatching commit and the spawn made the restart start the Attempt
    again after all, its job would run twice (a second marker); if a kill after the spawn but before
    the running commit made the restart treat it as never started, the same; if a kill while it
    runs or after it exited lost its receipt or recorded it twice, its exit code would be lost,
    duplicated or invented (``succeeded`` without proof), a retry could be created twice or not
    at all, and a Run could end in two terminal states. Short form by default (20 kills);
    QINGLONG_SOAK=full runs 200."""
    # per-second triggers and manual Runs wait behind four slots: the queue bound (a skip past
    # it) is not what this test audits, so it is lifted
    ws = Workspace(tmp_path, execution={"max_running": 4, "max_queued": 100_000})
    try:
        counts = _crash_loop(ws, _kills(), seed_value=20261201)
    finally:
        ws.close()
    landed = counts["landed"]
    print(f"crash audit: {counts}")
    # The aimed windows must actually be reached, or the test proves nothing about them.
    for window in ("dispatching", "spawned", "running", "exited"):
        assert landed.get(window, 0) > 0, f"no kill landed in the {window!r} window: {counts}"
    assert counts["runs"] > _kills(), f"too few Runs to mean anything: {counts}"
