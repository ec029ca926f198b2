"""``qinglong status``: a real store, a real ``qinglong run`` in a subprocess, the real command.

The exit code is what monitors and scripts act on (0 clear, 10 converging, 20 attention), so each
verdict is produced by the situation it names: a stopped scheduler with a due backlog, a running
scheduler keeping up, and a backlog a running scheduler drains between the command's two readings
(the scheduler is paused with SIGSTOP around the readings, so the drain happens exactly between
them, whatever the machine's speed).
"""

from __future__ import annotations

import json
import re
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from host_helpers import REPO, StderrLines, run_cli, wait_until

from qinglong.host.cli.main import main

MINUTE_MS = 60_000


class Store:
    """An edge store in a temporary folder, its settings, and the CLI on it."""

    def __init__(self, root: Path, page_size: int = 32) -> None:
        self.root = root
        self.db = root / "qinglong.db"
        self.settings = root / "settings.toml"
        self.settings.write_text(f'[backend]\npath = "{self.db}"\n'
                                 f"[scheduler]\npage_size = {page_size}\n"
                                 "[execution]\npoll_ms = 100\n")

    def publish(self, *args: str) -> None:
        """A publishing command, in-process (quick: no interpreter start per trigger)."""
        assert main(["--settings", str(self.settings), *args]) == 0, args

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = str(REPO)
        return env

    def status(self, *args: str) -> tuple[int, dict, str]:
        """``qinglong status --json ARGS`` in a subprocess: exit code, parsed output, stderr."""
        done = run_cli(["--settings", str(self.settings), "status", "--json", *args], cwd=self.root,
                       env=self.env(), timeout=120)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout), done.stderr

    def spawn(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "qinglong", "--settings", str(self.settings), *args],
                                cwd=self.root, env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            with conn:
                return conn.execute(query, params).fetchall()
        finally:
            conn.close()

    def due_now(self) -> int:
        now = time.time_ns() // 1_000_000
        return self.sql("SELECT count(*) FROM trigger_schedules WHERE next_fire_at_ms <= ?", (now,))[0][0]


class Scheduler:
    """``qinglong run`` in a subprocess, ready once its admission is open; stopped at the end."""

    def __init__(self, store: Store) -> None:
        self.process = store.spawn("run")
        self.stderr = StderrLines(self.process.stderr)
        self.stderr.wait_for("lifecycle.admission_open", timeout=60)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.resume()
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=30)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path)
    s.publish("project", "create", "ops")
    s.publish("task", "put", "ops", "noop", "--", "/bin/true")
    return s


def test_a_stopped_scheduler_with_a_due_backlog_is_attention(store):
    """A monitor running ``status`` must page (20) when nothing admits the occurrences that are due,
    and the screen must say so: no scheduler, and the backlog with its age."""
    store.publish("trigger", "add", "ops", "tick", "--task", "noop", "--cron", "* * * * * *")
    ran = run_cli(["--settings", str(store.settings), "run", "--for-seconds", "1"], cwd=store.root,
                  env=store.env(), timeout=120)
    assert ran.returncode == 0, ran.stderr
    # the per-second cursor the run left comes due within a second: the stalled backlog
    code, report, _ = wait_until(lambda: (lambda r: r if r[1]["stats"]["schedules_due"] else None)(
        store.status("--once")), "a due occurrence with the scheduler stopped", timeout=60)
    assert code == 20 and report["exit_code"] == 20 and report["verdict"] == "attention"
    assert report["ready"] is True and report["stats"]["live_schedulers"] == 0
    assert "no scheduler is running on this store" in report["reasons"]
    screen = run_cli(["--settings", str(store.settings), "status", "--once"], cwd=store.root,
                     env=store.env(), timeout=120)
    assert screen.returncode == 20, screen.stderr
    lines = {line.split("  ", 1)[0]: line for line in screen.stdout.splitlines()}
    assert "ready" in lines["readiness"] and "none running" in lines["scheduler"]
    assert "due, the oldest waiting" in lines["backlog"]
    assert "attention (20)" in lines["verdict"]


def test_a_running_scheduler_keeping_up_is_clear(store):
    """A healthy store must exit 0 with its two readings, or every monitor pages for nothing: a
    per-second trigger's occurrence that is due for a moment before its round is on time."""
    plane = Scheduler(store)
    try:
        # published while the scheduler runs, so its first occurrence is admitted on time
        store.publish("trigger", "add", "ops", "tick", "--task", "noop", "--cron", "* * * * * *")
        wait_until(lambda: store.sql("SELECT count(*) FROM runs WHERE state = 'succeeded'")[0][0] >= 3,
                   "three Runs of the per-second trigger to succeed", timeout=60, alive=plane.process)
        code, report, stderr = store.status("--interval", "1")
        assert code == 0, report
        assert (report["verdict"], report["reasons"]) == ("clear", [])
        stats = report["stats"]
        assert stats["live_schedulers"] == 1 and report["before"]["live_schedulers"] == 1
        assert stats["runs_by_state"]["succeeded"] >= 3 and stats["admitted_in_window"] >= 3
        assert stats["admission_lag_p99_ms"] <= report["grace_ms"]
        assert "the second in 1 s" in stderr
    finally:
        plane.stop()


def test_a_backlog_drained_between_the_two_readings_is_converging(tmp_path):
    """Converging (10) tells a monitor that a backlog drains by itself: a scheduler that resumes
    after a stall and admits the backlog between the two readings must read 10 (not 20, which would
    page for a recovery, nor 0, which would hide that Runs were just admitted minutes late)."""
    store = Store(tmp_path, page_size=2)  # a page of two: the drain takes ten pages
    store.publish("project", "create", "ops")
    store.publish("task", "put", "ops", "noop", "--", "/bin/true")
    plane = Scheduler(store)
    try:
        triggers = [f"m{i:02d}" for i in range(20)]
        for trigger in triggers:
            store.publish("trigger", "add", "ops", trigger, "--task", "noop", "--cron", "* * * * *")
        wait_until(lambda: store.sql("SELECT count(*) FROM trigger_schedules "
                                     "WHERE next_fire_at_ms IS NOT NULL")[0][0] == len(triggers),
                   "every schedule initialized", timeout=60, alive=plane.process)
        # the stall: the scheduler paused, every cursor back at an occurrence three minutes ago
        stalled_at = (time.time_ns() // 1_000_000) // MINUTE_MS * MINUTE_MS - 3 * MINUTE_MS
        plane.pause()
        store.sql("UPDATE trigger_schedules SET next_fire_at_ms = ?", (stalled_at,))
        status = store.spawn("status", "--json", "--interval", "20")
        status_err = StderrLines(status.stderr)
        status_err.wait_for("first reading taken", timeout=60)
        # Held still until the drain is over, however long a loaded machine takes: the second
        # reading (due 20 s after the first) then comes after the drain, never before it.
        status.send_signal(signal.SIGSTOP)
        try:
            plane.resume()  # the scheduler drains the stalled backlog before the second reading
            # drained: no schedule due any more (past the stalled occurrence alone is mid-drain)
            wait_until(lambda: store.sql("SELECT count(*) FROM trigger_schedules WHERE next_fire_at_ms <= ?",
                                         (time.time_ns() // 1_000_000,))[0][0] == 0,
                       "the stalled backlog to be admitted", timeout=120, every=0.05, alive=plane.process)
            drained_at = time.time_ns() // 1_000_000
        finally:
            status.send_signal(signal.SIGCONT)
        out, _ = status.communicate(timeout=120)
        report = json.loads(out)
        # the reading follows SIGCONT, which follows drained_at; the same millisecond is after
        assert report["stats"]["now_ms"] >= drained_at, "the second reading came before the drain"
        assert status.returncode == 10, (report["reasons"], report["before"], report["stats"])
        assert report["verdict"] == "converging"
        before, now = report["before"], report["stats"]
        assert (before["schedules_due"], before["oldest_due_ms"]) == (len(triggers), stalled_at)
        assert before["live_schedulers"] == 1  # paused, but holding the store
        assert now["oldest_due_ms"] is None or now["oldest_due_ms"] > stalled_at
        # fire_once recorded the three older occurrences of each trigger skipped and admitted the
        # latest, unless the drain ended past the latest's grace (60 s from a minute's start): then
        # that one is skipped too. Either way none of the four is lost.
        assert now["skipped_recent"] >= 3 * len(triggers) and now["admitted_in_window"] >= 1
        assert now["skipped_recent"] + now["admitted_in_window"] >= 4 * len(triggers)
        assert any("the backlog drained" in reason for reason in report["reasons"])
    finally:
        plane.stop()


def test_a_missing_database_and_an_unready_schema_keep_their_exit_codes(store, tmp_path):
    """Scripts tell "fix your settings" (3) and "schema not ready" (4) apart from the verdicts; a
    status that exited 20 for a typo would page on-call for a mistake in a path."""
    missing = tmp_path / "other.toml"
    missing.write_text(f'[backend]\npath = "{tmp_path / "nowhere.db"}"\n')
    done = run_cli(["--settings", str(missing), "status", "--once"], cwd=tmp_path, env=store.env())
    assert done.returncode == 3 and "does not exist" in done.stderr and not done.stdout
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE mine (x)")
    conn.commit()
    conn.close()
    missing.write_text(f'[backend]\npath = "{foreign}"\n')
    done = run_cli(["--settings", str(missing), "status", "--once", "--json"], cwd=tmp_path, env=store.env())
    assert done.returncode == 4, done.stderr
    report = json.loads(done.stdout)
    assert report["ready"] is False and "another application" in report["readiness"]
    assert report["stats"] is None and report["verdict"] is None


def test_an_unreachable_cluster_store_is_unavailable_without_its_password(tmp_path):
    """A database that cannot be reached is 5 (retry later), never a verdict, and the DSN's
    password must not reach the terminal or a monitor's log."""
    secret = "s3cret-pw-status"
    settings = tmp_path / "cluster.toml"
    dsn = f"postgresql://qinglong_runtime:{secret}@127.0.0.1:1/qinglong?connect_timeout=2"
    settings.write_text(f'profile = "cluster"\n[backend]\nruntime_dsn = "{dsn}"\n'
                        f'admin_dsn = "{dsn}"\npool_timeout_ms = 2000\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    done = run_cli(["--settings", str(settings), "status", "--once"], cwd=tmp_path, env=env)
    assert done.returncode == 5, (done.stdout, done.stderr)
    assert secret not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_a_cluster_store_reads_attention_without_a_replica_and_only_stranded_runs_with_one(tmp_path):
    """On the cluster the verdict comes from the database every replica shares: no replica
    completing rounds must page (20), a replica keeping up must give no reason but the Runs no
    worker can take (none runs here), the workers line must be there for the operator, and no
    DSN password may reach the output."""
    from tests.support import pg

    server = pg.start_server("pg18")
    try:
        pg.create_roles(server)
        pg.create_database(server, "ql_status")
        dsns = {key: server.dsn(role, pg.ROLE_PASSWORDS[role], "ql_status") for key, role in (
            ("runtime_dsn", "qinglong_runtime"), ("admin_dsn", "qinglong_admin"),
            ("owner_dsn", "qinglong_owner"))}
        store = Store(tmp_path)
        store.settings.write_text('profile = "cluster"\n[scheduler]\nlease_ms = 5000\n[backend]\n'
                                  + "".join(f'{k} = "{v}"\n' for k, v in dsns.items()))
        store.publish("db", "migrate")
        store.publish("project", "create", "ops")
        store.publish("task", "put", "ops", "hello", "--", "true")
        code, report, stderr = store.status("--once")
        assert code == 20 and "no scheduler is running on this store" in report["reasons"]
        assert report["stats"]["workers_by_state"] == {"live": 0, "expired": 0, "closed": 0}
        assert report["stats"]["worker_free_slots"] == 0 and report["stats"]["runs_without_worker"] == 0
        outputs = [json.dumps(report), stderr]
        plane = Scheduler(store)
        try:
            store.publish("trigger", "add", "ops", "tick", "--task", "hello", "--cron", "* * * * * *")

            def admitted():
                code, report, stderr = store.status("--once")
                outputs.extend([json.dumps(report), stderr])
                return (code, report) if report["stats"]["admitted_in_window"] >= 3 else None

            wait_until(admitted, "three admissions read by status", timeout=60, every=0.5, alive=plane.process)
            code, report, stderr = store.status("--interval", "1")
            # the replica keeps up; only the Runs nobody can run (no worker in this test) remain
            assert code == 20 and len(report["reasons"]) == 1, report["reasons"]
            assert "no live worker able to take them" in report["reasons"][0]
            assert report["stats"]["live_schedulers"] == 1 and report["grace_ms"] == 3 * 1000 + 5000
            screen = run_cli(["--settings", str(store.settings), "status", "--once"], cwd=store.root,
                             env=store.env(), timeout=120)
            assert screen.returncode == 20, screen.stdout + screen.stderr
            assert re.search(r"workers +0 live; 0 free slots; \d+ queued run\(s\) no live worker can take",
                             screen.stdout), screen.stdout
            outputs.extend([json.dumps(report), stderr, screen.stdout, screen.stderr,
                            plane.stderr.text()])
        finally:
            plane.stop()
        for secret in pg.ROLE_PASSWORDS.values():
            assert all(secret not in text for text in outputs)
    finally:
        server.destroy()
