"""Cluster workers for the benchmark scripts: ``qinglong worker`` processes, marker jobs, the
execution audit. Imported by ``bench/cluster.py`` and ``bench/chaos.py`` (stdlib, psycopg and the
project's contracts only).

* :class:`WorkerProcess`: one real ``qinglong worker --settings FILE`` (profile ``cluster``, a
  ``[worker]`` section with the gateway role's DSN), optionally behind its own fault proxy;
  restartable after ``kill -9`` (the same worker id: the new session fences the old one).
* The marker job (:func:`write_marker_job`, :func:`marker_command`): a stdlib Python script a task
  runs. It records its start (``RUN.ATTEMPT.start``, created ``O_EXCL``: a second start of the same
  Attempt cannot overwrite it and leaves ``RUN.ATTEMPT.again.PID`` instead), overwrites
  ``RUN.ATTEMPT.tick`` with the monotonic clock every 50 ms while it runs (the last tick is how far
  a killed job is known to have run), and, when it ends by itself, ``RUN.ATTEMPT.end`` with the
  monotonic clock and the exit code it then exits with. ``CLOCK_MONOTONIC`` is one clock for every
  process of the machine, so executions of one Run by different workers compare directly.
* :func:`audit_execution`: every Run's Attempts and markers against the task's policy (see there).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GATEWAY_ROLE = "qinglong_gateway"
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled", "lost")
ACTIVE_ATTEMPT = ("dispatching", "running")
#: The marker job's tick period: a killed job ran at most this much past its last tick.
TICK_MS = 50

# --------------------------------------------------------------------------------- processes


def write_worker_settings(path: Path, dsn: str, worker_id: str, *, log_dir: Path, max_running: int = 4,
                          session_lease_ms: int = 5000, heartbeat_ms: int = 1000,
                          self_fence_margin_ms: int = 1000, kill_grace_ms: int = 500, poll_ms: int = 200,
                          drain_timeout_ms: int = 10_000, labels: tuple[str, ...] = (),
                          level: str = "info") -> Path:
    """A ``profile = "cluster"`` settings file for ``qinglong worker`` (private: the DSN is a secret)."""
    label_list = ", ".join(f'"{label}"' for label in labels)
    path.write_text(
        'profile = "cluster"\n'
        "[worker]\n"
        f'dsn = "{dsn}"\n'
        f'worker_id = "{worker_id}"\n'
        f"labels = [{label_list}]\n"
        f"max_running = {max_running}\n"
        f"session_lease_ms = {session_lease_ms}\n"
        f"heartbeat_ms = {heartbeat_ms}\n"
        f"self_fence_margin_ms = {self_fence_margin_ms}\n"
        f"kill_grace_ms = {kill_grace_ms}\n"
        f"poll_ms = {poll_ms}\n"
        f'log_dir = "{log_dir}"\n'
        f"drain_timeout_ms = {drain_timeout_ms}\n"
        f'[diagnostics]\nlevel = "{level}"\nformat = "json"\n')
    path.chmod(0o600)
    return path


def worker_dsn(host: str, port: int, dbname: str, password: str, connect_timeout: int = 3) -> str:
    return (f"host={host} port={port} user={GATEWAY_ROLE} password={password} dbname={dbname} "
            f"connect_timeout={connect_timeout}")


class WorkerProcess:
    """One ``qinglong worker`` process; ``proxy`` (a FaultProxy) when its DSN points at one."""

    def __init__(self, worker_id: str, settings: Path, logfile: Path, proxy=None) -> None:
        self.worker_id = worker_id
        self.owner = worker_id  # the chaos schedule names its targets by owner
        self.settings = settings
        self.logfile = logfile
        self.proxy = proxy
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.kills: list[float] = []  # monotonic instants of each kill -9

    def start(self) -> "WorkerProcess":
        with self.logfile.open("a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "qinglong", "worker", "--settings", str(self.settings)],
                stdout=subprocess.DEVNULL, stderr=err, cwd=str(ROOT))
        self.starts += 1
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        import time

        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.kills.append(time.monotonic())

    def leftover_jobs(self, kill: bool = True) -> int:
        """Job wrappers of this worker still alive with no receipt (after the worker stopped there
        should be none); KILLed (their process group) with ``kill``, so a bench leaves nothing
        behind. Returns how many there were. The log directory is read from the settings file."""
        import re

        match = re.search(r'^log_dir = "(.*)"$', self.settings.read_text(), re.M)
        if not match or not os.path.isdir(match[1]):
            return 0
        found = 0
        for entry in os.scandir(match[1]):
            attempt = Path(entry.path)
            if (attempt / "receipt").exists() or not (attempt / "pid").exists():
                continue
            try:
                pid = int((attempt / "pid").read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if str(attempt).encode() not in cmdline:
                continue  # the pid is another process's now
            found += 1
            if kill:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        return found

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (drain: running jobs finish, outcomes reported, the session closed); KILL after
        ``timeout``. The exit code, or None when it had to be killed."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
                return None
        return self.proc.returncode if self.proc else None


# --------------------------------------------------------------------------------- marker jobs

MARKER_JOB = r'''
import os, random, sys, time
marks, lo, hi, fail_pct = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
run, n, aid = os.environ["QINGLONG_RUN_ID"], os.environ["QINGLONG_ATTEMPT"], os.environ["QINGLONG_ATTEMPT_ID"]
base = os.path.join(marks, run + "." + n)
t0, w0 = time.monotonic_ns(), time.time_ns()
flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
try:
    fd = os.open(base + ".start", flags, 0o644)
except FileExistsError:
    fd = os.open("%s.again.%d" % (base, os.getpid()), flags, 0o644)
    os.write(fd, ("%d %d %s\n" % (t0, w0, aid)).encode())
    os.close(fd)
    sys.exit(97)
os.write(fd, ("%d %d %s %d\n" % (t0, w0, aid, os.getpid())).encode())
os.close(fd)
tick = os.open(base + ".tick", flags, 0o644)
rng = random.Random()
code = 3 if rng.random() * 100 < fail_pct else 0
end = time.monotonic() + rng.uniform(lo, hi) / 1000.0
while True:
    os.pwrite(tick, b"%020d\n" % time.monotonic_ns(), 0)
    now = time.monotonic()
    if now >= end:
        break
    time.sleep(min(0.05, end - now))
fd = os.open(base + ".end", flags, 0o644)
os.write(fd, ("%d %d\n" % (time.monotonic_ns(), code)).encode())
os.close(fd)
sys.exit(code)
'''


def write_marker_job(directory: Path) -> Path:
    """The marker job's script in ``directory`` (and the marks directory beside it); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "marker_job.py"
    path.write_text(MARKER_JOB.lstrip())
    (directory / "marks").mkdir(exist_ok=True)
    os.chmod(directory / "marks", 0o777)
    return path


def marker_command(job: Path, *, min_ms: int, max_ms: int, fail_pct: int = 0) -> list[str]:
    """The argv of a task running the marker job: sleeps ``min_ms``..``max_ms``, exits 3 with
    probability ``fail_pct`` percent, 0 otherwise. ``-S -E``: no site, no environment options, so
    it costs an interpreter start and nothing else."""
    return [sys.executable, "-S", "-E", str(job), str(job.parent / "marks"), str(min_ms), str(max_ms),
            str(fail_pct)]


def start_time_command(marks: Path) -> list[str]:
    """A no-op job that records its start on the wall clock (ms) in ``marks/RUN.ATTEMPT``: the
    latency benchmark's job (a shell and ``date``: far cheaper than an interpreter)."""
    return ["/bin/sh", "-c", 'date +%s%3N > "$0/$QINGLONG_RUN_ID.$QINGLONG_ATTEMPT"', str(marks)]


@dataclass
class Execution:
    """What the markers say about one start of one Attempt."""

    run_id: str
    attempt_no: int
    attempt_id: str | None
    start_ns: int
    last_ns: int  # the end marker's time, else the last tick, else the start
    end_ns: int | None
    exit_code: int | None


def read_markers(marks: Path) -> tuple[dict[tuple[str, int], Execution], list[str]]:
    """The executions the marker files record, by (run id, attempt no), and the ``again`` files
    (a second start of an Attempt that had started already)."""
    executions: dict[tuple[str, int], Execution] = {}
    again: list[str] = []
    for entry in os.scandir(marks):
        parts = entry.name.split(".")
        if len(parts) >= 3 and parts[2] == "again":
            again.append(entry.name)
            continue
        if len(parts) != 3 or parts[2] != "start":
            continue
        run_id, attempt_no = parts[0], int(parts[1])
        fields = Path(entry.path).read_text().split()
        start_ns = int(fields[0]) if fields else 0
        base = Path(marks) / f"{run_id}.{attempt_no}"
        last_ns, end_ns, code = start_ns, None, None
        try:
            tick = (base.with_name(base.name + ".tick")).read_text().strip()
            if tick:
                last_ns = max(last_ns, int(tick))
        except (OSError, ValueError):
            pass
        try:
            end_fields = (base.with_name(base.name + ".end")).read_text().split()
            if len(end_fields) == 2:
                end_ns, code = int(end_fields[0]), int(end_fields[1])
                last_ns = max(last_ns, end_ns)
        except OSError:
            pass
        executions[(run_id, attempt_no)] = Execution(run_id, attempt_no, fields[2] if len(fields) > 2 else None,
                                                     start_ns, last_ns, end_ns, code)
    return executions, again


# --------------------------------------------------------------------------------- the audit


def audit_execution(superuser_dsn: str, marks: Path | None, payloads: dict[str, dict]) -> dict:
    """Every Run's Attempts (and, with ``marks``, the marker jobs' records) against its task's
    policy. ``payloads``: task id -> the payload published (its execution spec is parsed from it).

    Counted as violations (each must be 0):

    * ``stuck``: a Run not in a terminal state; ``active_attempts_left``: an Attempt still
      dispatching, running or claimed under a terminal Run;
    * ``attempt_numbers_not_contiguous``: a Run whose Attempts are not numbered 1..N;
    * ``over_max_attempts``: more Attempts than the task's ``retry.max_attempts``;
    * ``retried_against_policy``: an Attempt followed by another although the policy says stop for
      its outcome (``lost_retried_non_idempotent`` counts the lost ones of a task not idempotent);
      ``retry_missing``: a Run ended although the policy says its last Attempt retries;
    * ``run_state_not_last_attempt``: the Run's terminal state differs from its last Attempt's;
    * with markers: ``overlapping_executions`` (two executions of one Run whose monotonic intervals
      intersect), ``attempt_started_twice`` (an ``again`` file), ``started_without_record`` (a job
      ran for an Attempt the store never recorded started, or under another attempt id),
      ``exit_code_not_recorded`` (a job wrote its end with code C and its Attempt holds another
      outcome, other than ``lost`` with a reason), ``outcome_without_job_end`` (an Attempt
      succeeded/failed with an exit code no job reported: an invented outcome).

    Counted as figures: ``finished_but_lost`` (the job ended by itself, the worker died or was
    fenced before it reported: the Attempt is ``lost`` with a reason), the closest hand-over gap
    between two executions of one Run, Attempts by state.
    """
    import psycopg

    from qinglong.contracts.execution import (
        AttemptOutcome,
        AttemptState,
        RetryAt,
        parse_execution_spec,
        retry_decision,
    )

    specs = {task: parse_execution_spec(task, payload) for task, payload in payloads.items()}
    with psycopg.connect(superuser_dsn, autocommit=True) as conn:
        runs = conn.execute("SELECT run_id::text, task_id, state FROM qinglong.runs").fetchall()
        attempts = conn.execute(
            "SELECT run_id::text, attempt_no, attempt_id::text, state, exit_code, signal, reason, "
            "started_at_ms FROM qinglong.attempts").fetchall()
    by_run: dict[str, list[tuple]] = {}
    for row in attempts:
        by_run.setdefault(row[0], []).append(row)
    v = dict(stuck=0, active_attempts_left=0, attempt_numbers_not_contiguous=0, over_max_attempts=0,
             retried_against_policy=0, lost_retried_non_idempotent=0, retry_missing=0,
             run_state_not_last_attempt=0, overlapping_executions=0, attempt_started_twice=0,
             started_without_record=0, exit_code_not_recorded=0, outcome_without_job_end=0)
    figures = dict(runs=len(runs), attempts=len(attempts), finished_but_lost=0, lost_attempts=0,
                   lost_never_retried_non_idempotent=0, retries=0, jobs_started=0, jobs_ended=0,
                   jobs_killed_or_orphaned=0, min_handover_gap_ms=None)
    examples: dict[str, list] = {}

    def bad(kind: str, detail) -> None:
        v[kind] += 1
        examples.setdefault(kind, [])
        if len(examples[kind]) < 5:
            examples[kind].append(detail)

    runs_by_state: dict[str, int] = {}
    attempts_by_state: dict[str, int] = {}
    for row in attempts:
        attempts_by_state[row[3]] = attempts_by_state.get(row[3], 0) + 1
    task_of: dict[str, str] = {}
    for run_id, task_id, state in runs:
        task_of[run_id] = task_id
        runs_by_state[state] = runs_by_state.get(state, 0) + 1
        mine = sorted(by_run.get(run_id, []), key=lambda r: r[1])
        if state not in TERMINAL:
            bad("stuck", {"run": run_id, "state": state, "attempts": [r[3] for r in mine]})
            continue
        if any(r[3] not in TERMINAL for r in mine):
            bad("active_attempts_left", {"run": run_id, "attempts": [r[3] for r in mine]})
        if [r[1] for r in mine] != list(range(1, len(mine) + 1)):
            bad("attempt_numbers_not_contiguous", {"run": run_id, "numbers": [r[1] for r in mine]})
            continue
        spec = specs.get(task_id)
        if spec is None or not mine:
            continue
        if len(mine) > spec.retry.max_attempts:
            bad("over_max_attempts", {"run": run_id, "attempts": len(mine)})
        figures["retries"] += len(mine) - 1
        for i, (_, no, _aid, a_state, code, sig, reason, started_at) in enumerate(mine):
            if a_state not in TERMINAL:
                continue
            if a_state == "lost":
                figures["lost_attempts"] += 1
            outcome = AttemptOutcome(AttemptState(a_state), code, sig, reason=reason)
            decision = retry_decision(spec.retry, spec.idempotent, no, outcome, 0,
                                      started=started_at is not None)
            last = i == len(mine) - 1
            if not last and not isinstance(decision, RetryAt):
                bad("retried_against_policy", {"run": run_id, "attempt": no, "state": a_state,
                                               "why_not": getattr(decision, "reason", "")})
                if a_state == "lost" and not spec.idempotent:
                    v["lost_retried_non_idempotent"] += 1
            if last:
                if isinstance(decision, RetryAt):
                    bad("retry_missing", {"run": run_id, "attempt": no, "state": a_state, "code": code})
                elif a_state == "lost" and not spec.idempotent:
                    figures["lost_never_retried_non_idempotent"] += 1
                if a_state != state:
                    bad("run_state_not_last_attempt", {"run": run_id, "run_state": state, "attempt": a_state})
    figures["runs_by_state"] = runs_by_state
    figures["attempts_by_state"] = attempts_by_state

    if marks is not None:
        executions, again = read_markers(marks)
        for name in again:
            bad("attempt_started_twice", name)
        attempt_rows = {(r[0], r[1]): r for r in attempts}
        figures["jobs_started"] = len(executions)
        per_run: dict[str, list[Execution]] = {}
        for key, ex in executions.items():
            per_run.setdefault(ex.run_id, []).append(ex)
            row = attempt_rows.get(key)
            if row is None or row[7] is None or (ex.attempt_id and ex.attempt_id != row[2]):
                bad("started_without_record", {"run": ex.run_id, "attempt": ex.attempt_no,
                                               "row": None if row is None else row[3]})
                continue
            if ex.end_ns is None:
                figures["jobs_killed_or_orphaned"] += 1
                continue
            figures["jobs_ended"] += 1
            state, code, reason = row[3], row[4], row[6]
            if state in ("succeeded", "failed") and code == ex.exit_code:
                continue
            if state == "lost" and reason:
                figures["finished_but_lost"] += 1
                continue
            bad("exit_code_not_recorded", {"run": ex.run_id, "attempt": ex.attempt_no, "job_exit": ex.exit_code,
                                           "state": state, "exit_code": code, "reason": reason})
        for run_id, no, _aid, state, code, _sig, _reason, started_at in attempts:
            if state in ("succeeded", "failed") and code is not None:
                ex = executions.get((run_id, no))
                if ex is None or ex.end_ns is None or ex.exit_code != code:
                    bad("outcome_without_job_end", {"run": run_id, "attempt": no, "state": state,
                                                    "exit_code": code,
                                                    "job_exit": None if ex is None else ex.exit_code})
        gaps, after_loss = [], []
        for run_id, execs in per_run.items():
            execs.sort(key=lambda e: e.start_ns)
            for a, b in zip(execs, execs[1:]):
                gap_ns = b.start_ns - a.last_ns
                gaps.append(gap_ns)
                if a.end_ns is None or attempt_rows.get((run_id, a.attempt_no), ("",) * 4)[3] == "lost":
                    after_loss.append(gap_ns)
                # a job killed after its last tick may have run up to one tick longer
                if gap_ns <= 0 or (a.end_ns is None and gap_ns < TICK_MS * 1_000_000):
                    bad("overlapping_executions", {"run": run_id, "attempts": [a.attempt_no, b.attempt_no],
                                                   "gap_ms": round(gap_ns / 1e6, 1)})
        if gaps:
            figures["min_handover_gap_ms"] = round(min(gaps) / 1e6, 1)
        # the hand-overs that matter: after a job killed, or whose Attempt was lost
        figures["handovers_after_kill_or_loss"] = len(after_loss)
        figures["min_handover_gap_after_kill_or_loss_ms"] = round(min(after_loss) / 1e6, 1) if after_loss else None
        figures["runs_with_several_executions"] = sum(1 for e in per_run.values() if len(e) > 1)
    return {"violations": v, "violation_total": sum(v[k] for k in v if k != "lost_retried_non_idempotent"),
            "figures": figures, "examples": examples}


# --------------------------------------------------------------------------------- the gateway


def write_gateway_worker_settings(path: Path, url: str, token: str, worker_id: str, *, log_dir: Path,
                                  max_running: int = 4, poll_ms: int = 1000, claim_wait_ms: int = 20_000,
                                  level: str = "warning") -> Path:
    """A ``qinglong worker`` speaking to the API tier's gateway (``[worker] url``), its token in a
    0600 file beside the settings; product defaults for the lease, heartbeat, margin and grace."""
    token_file = path.with_suffix(".token")
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    path.write_text(
        'profile = "cluster"\n[worker]\n'
        f'url = "{url}"\ntoken_file = "{token_file}"\nworker_id = "{worker_id}"\n'
        f"max_running = {max_running}\npoll_ms = {poll_ms}\nclaim_wait_ms = {claim_wait_ms}\n"
        f'log_dir = "{log_dir}"\n[diagnostics]\nlevel = "{level}"\nformat = "json"\n')
    path.chmod(0o600)
    return path


def register_workers(superuser_dsn: str, names: list[str], *, capacity: int = 8) -> dict[str, str]:
    """Register workers straight in the store (what ``qinglong worker register`` writes, without
    a process per worker); their tokens by name."""
    import time

    import psycopg

    from qinglong.contracts.worker import new_worker_token, worker_token_digest

    tokens = {name: new_worker_token() for name in names}
    now = int(time.time() * 1000)
    with psycopg.connect(superuser_dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO qinglong.worker_registrations (worker_id, labels, projects, capacity, token_digest, "
                "created_at_ms) VALUES (%s, '{}', '{}', %s, %s, %s)",
                [(name, capacity, worker_token_digest(token), now) for name, token in tokens.items()])
    return tokens


class GatewayProcess:
    """``qinglong api`` with the worker gateway on (``[api] gateway_dsn``: the gateway
    role's DSN), on a free port read from its ``http.listening`` line."""

    def __init__(self, workdir: Path, dsns: dict, gateway_dsn: str, *, pool_size: int = 4,
                 max_connections: int = 1024, claim_wait_ms: int = 20_000) -> None:
        self.settings = workdir / "gateway.toml"
        self.settings.write_text(
            'profile = "cluster"\n[backend]\n'
            f'runtime_dsn = "{dsns["qinglong_runtime"]}"\nadmin_dsn = "{dsns["qinglong_admin"]}"\n'
            f'owner_dsn = "{dsns["qinglong_owner"]}"\n'
            f'[http]\nlisten = "127.0.0.1:0"\nmax_connections = {max_connections}\nrequest_timeout_ms = 60000\n'
            f'[api]\nenabled = true\ngateway_dsn = "{gateway_dsn}"\ngateway_pool_size = {pool_size}\n'
            f'gateway_claim_wait_ms = {claim_wait_ms}\n[diagnostics]\nlevel = "info"\nformat = "json"\n')
        self.settings.chmod(0o600)
        self.logfile = workdir / "gateway.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "GatewayProcess":
        import re
        import time

        self._log = self.logfile.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "qinglong", "--settings", str(self.settings), "api"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=str(ROOT))
        deadline = time.monotonic() + 120
        seen = b""
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise SystemExit(f"the gateway exited: {seen.decode(errors='replace')}")
            seen += line
            found = re.search(rb"listening on [^ \"]+:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                import threading

                threading.Thread(target=self._copy, daemon=True).start()
                return self
        raise SystemExit("the gateway did not listen in time")

    def _copy(self) -> None:
        for line in self.proc.stderr:
            self._log.write(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill9()
