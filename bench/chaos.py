"""Chaos soak of the cluster profile: replicas and workers, random failures, an exactly-once audit.

Starts its own PostgreSQL 18 (the test harness ``devtools/pg.py``), migrates, publishes every-second
and every-few-seconds cron triggers (half ``fire_once`` with a 60 s grace, half ``skip`` with a
1.5 s grace) of five tasks running the marker job (``bench/cluster_workers.py``): ``plain`` (no
retry), ``flaky`` (exits 3 at times; retried on failure, not idempotent, so a lost Attempt is never
retried), ``idem`` (idempotent, retried on failure and when lost), ``slow`` (up to 1.5 s, no
retry) and ``long`` (2-6 s, idempotent: cut-off and killed workers hold these mid-job). It runs ``--replicas`` real ``qinglong run`` processes (profile ``cluster``: admission and
the expiry of Run leases) and ``--workers`` real ``qinglong worker`` processes, each reaching
PostgreSQL through its own fault proxy (``devtools/fault_proxy.py``). For ``--minutes`` it
injects, at random, on a replica or a worker: ``kill -9`` (restarted after a pause), latency and
jitter, a reset of every connection, a one-way or two-way partition (a worker's longer than its
session lease, so it must fence itself), a connection that hangs after an admission or a
completion was sent until it is reset (the reply of a committed statement lost),
``pg_terminate_backend`` of a replica's backends, and one PostgreSQL restart half way. Then it
heals everything, lets the replicas catch up and end every expired lease, stops the replicas
(admission is over), lets the workers drain the queue, stops them (SIGTERM: drain) and audits:

* admission: every trigger's expected occurrences (first fire up to its final cursor) against its
  Runs: duplicates (must be 0), missing (must be 0: for ``fire_once`` nothing may be left out; for
  ``skip`` every occurrence not admitted must be a recorded skip), and every Run born with its
  Attempt 1 and its two admission events;
* execution (``cluster_workers.audit_execution``): every Run in exactly one terminal state (0 stuck
  after the drain), Attempts numbered 1..N within the task's policy (a lost Attempt of a task not
  idempotent never retried, at most ``max_attempts``), no two executions of one Run overlapping on
  the monotonic clock, no Attempt started twice, and every job that ended by itself has its exit
  code on its Attempt (or the Attempt is ``lost`` with a reason: the worker died or was fenced
  before it reported; counted).

Prints and writes (``--out``, default ``bench/results/chaos.json``) those figures, the admission
lags and what was injected. Exit status 1 on any violation.

    python bench/chaos.py --minutes 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from qinglong.contracts.records import MisfirePolicy, TriggerDefinition  # noqa: E402
from qinglong.contracts.store import BackendContext, SchedulerLimits  # noqa: E402
from qinglong.plugins.cluster_postgres import create_backend  # noqa: E402
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings  # noqa: E402
from qinglong.plugins.cron.provider import CronProvider  # noqa: E402
from devtools.fault_proxy import BOTH, TO_CLIENT, TO_SERVER, FaultProxy  # noqa: E402
from devtools.pg import ROLE_PASSWORDS, create_database, create_roles, start_server  # noqa: E402

import cluster_workers  # noqa: E402  (bench/, this script's directory)
from cluster_workers import WorkerProcess  # noqa: E402

DBNAME = "ql_chaos"
EXPRESSIONS = ("* * * * * *", "*/2 * * * * *", "*/3 * * * * *", "*/5 * * * * *")
ADMISSION_MESSAGE = b"EXECUTE qinglong_admit_occurrence("
#: In the Bind message of a worker's completion of a job that exited 0 (its state parameter; the
#: worker's statements are prepared, so the function's name travels only once per connection):
#: held replies there lose the reply of a committed completion (the worker must repeat it and be
#: told it is already done).
COMPLETE_MESSAGE = b"succeeded"


def task_payloads(job: Path) -> dict[str, dict]:
    """The five tasks the triggers run, all the marker job (see the module docstring)."""
    fast_retry = {"initial_backoff_ms": 200, "max_backoff_ms": 1000, "jitter": 0.5}
    return {
        "plain": {"command": cluster_workers.marker_command(job, min_ms=20, max_ms=300)},
        "flaky": {"command": cluster_workers.marker_command(job, min_ms=50, max_ms=500, fail_pct=30),
                  "retry": {"max_attempts": 3, **fast_retry}},
        "idem": {"command": cluster_workers.marker_command(job, min_ms=100, max_ms=1200, fail_pct=20),
                 "idempotent": True, "retry": {"max_attempts": 4, **fast_retry}},
        "slow": {"command": cluster_workers.marker_command(job, min_ms=300, max_ms=1500)},
        # longer than the time a cut-off worker has before it must stop its jobs: partitions and
        # kills catch these mid-job, and their Runs are handed over
        "long": {"command": cluster_workers.marker_command(job, min_ms=2000, max_ms=6000),
                 "idempotent": True, "retry": {"max_attempts": 3, **fast_retry}},
    }


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


class NullSink:
    def emit(self, event) -> None:
        pass


def _backend(settings: ClusterPostgresSettings, owner: str, lease_ms: int = 30_000, cadence_ms: int = 1000):
    context = BackendContext(
        settings=settings,
        limits=SchedulerLimits(page_size=32, claim_budget=16, lease_ms=lease_ms, cadence_ms=cadence_ms),
        providers={"cron": CronProvider()}, diagnostics=NullSink(),
        clock_ms=lambda: int(time.time() * 1000), owner=owner)
    return create_backend(context)


def dsn(server, role: str, port: int | None = None) -> str:
    return (f"host=127.0.0.1 port={port or server.port} user={role} "
            f"password={ROLE_PASSWORDS[role]} dbname={DBNAME} connect_timeout=3")


def sql(server, statement: str, params=None):
    with psycopg.connect(server.superuser_dsn(DBNAME), autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def prepare(server, triggers: int, lease_ms: int, cadence_ms: int, payloads: dict[str, dict]) -> dict[str, int]:
    """Roles, database, migrations, triggers; returns each trigger's first occurrence.

    Published under the replicas' own lease and cadence, so the skip triggers' grace is checked
    against the floor they will run under (cadence + lease), and set 1.5 s above it."""
    create_roles(server)
    create_database(server, DBNAME)
    settings = ClusterPostgresSettings(runtime_dsn=dsn(server, "qinglong_runtime"),
                                       admin_dsn=dsn(server, "qinglong_admin"),
                                       owner_dsn=dsn(server, "qinglong_owner"))

    async def body():
        backend = _backend(settings, "chaos-setup", lease_ms, cadence_ms)
        try:
            await backend.migrate()
            pub = backend.publisher()
            await pub.create_project("chaos")
            for task_id, payload in payloads.items():
                await pub.put_task("chaos", task_id, payload)
            tasks = list(payloads)
            for i in range(triggers):
                fire_once = i % 2 == 0
                task_id = tasks[(i // len(EXPRESSIONS)) % len(tasks)]  # each task gets every expression
                await pub.put_trigger(TriggerDefinition(
                    "chaos", f"t{i:03d}", task_id, "cron", {"expression": EXPRESSIONS[i % len(EXPRESSIONS)]},
                    misfire_policy=MisfirePolicy.FIRE_ONCE if fire_once else MisfirePolicy.SKIP,
                    misfire_grace_ms=60_000 if fire_once else cadence_ms + lease_ms + 1500))
        finally:
            await backend.close()

    asyncio.run(body())
    provider = CronProvider()
    now = sql(server, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]
    start = now + 4000  # the replicas are up by then
    first = {}
    for trigger_id, spec in sql(server, "SELECT trigger_id, spec_json FROM qinglong.triggers"):
        first[trigger_id] = provider.next_after(spec, start)
        sql(server, "UPDATE qinglong.trigger_schedules SET next_fire_at_ms = %s WHERE trigger_id = %s",
            (first[trigger_id], trigger_id))
    return first


class Replica:
    """One ``qinglong run`` process behind its own proxy; restartable after kill -9."""

    def __init__(self, index: int, server, workdir: Path, lease_ms: int, cadence_ms: int) -> None:
        self.owner = f"chaos-{index}"
        self.proxy = FaultProxy(("127.0.0.1", server.port), name=self.owner).start()
        self.settings = workdir / f"{self.owner}.toml"
        self.settings.write_text(
            'profile = "cluster"\n[scheduler]\n'
            f'cadence_ms = {cadence_ms}\nclaim_budget = 16\nlease_ms = {lease_ms}\nowner = "{self.owner}"\n'
            '[lifecycle]\nstop_timeout_ms = 5000\nstart_step_timeout_ms = 20000\n'
            '[diagnostics]\nlevel = "info"\nformat = "json"\n'
            f'[backend]\nruntime_dsn = "{dsn(server, "qinglong_runtime", self.proxy.port)}"\n'
            'pool_min_size = 1\npool_max_size = 2\npool_timeout_ms = 2000\n')
        self.settings.chmod(0o600)
        self.logfile = workdir / f"{self.owner}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        with self.logfile.open("a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "qinglong", "run", "--settings", str(self.settings)],
                stdout=subprocess.DEVNULL, stderr=err, cwd=str(ROOT))
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int | None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()
                return None
        return self.proc.returncode if self.proc else None


def make_worker(index: int, server, workdir: Path, args) -> WorkerProcess:
    """One ``qinglong worker`` behind its own proxy, with short leases (the chaos needs many
    expiries in a few minutes; ``check_worker_timing`` accepts them)."""
    worker_id = f"chaos-w{index}"
    proxy = FaultProxy(("127.0.0.1", server.port), name=worker_id).start()
    settings = cluster_workers.write_worker_settings(
        workdir / f"{worker_id}.toml",
        cluster_workers.worker_dsn("127.0.0.1", proxy.port, DBNAME, ROLE_PASSWORDS["qinglong_gateway"]),
        worker_id, log_dir=workdir / f"{worker_id}-logs", max_running=args.worker_slots,
        session_lease_ms=args.session_lease_ms, heartbeat_ms=args.heartbeat_ms,
        self_fence_margin_ms=1000, kill_grace_ms=500, poll_ms=200, drain_timeout_ms=10_000)
    return WorkerProcess(worker_id, settings, workdir / f"{worker_id}.log", proxy=proxy)


class Chaos:
    """The fault schedule: one random fault every few seconds, each undone after a while."""

    def __init__(self, server, replicas: list[Replica], rng: random.Random,
                 workers: list[WorkerProcess] = (), session_lease_ms: int = 5000) -> None:
        self.server = server
        self.replicas = replicas
        self.workers = list(workers)
        self.session_lease_s = session_lease_ms / 1000
        self.complete_rules: list = []
        self.rng = rng
        self.injected: dict[str, int] = {}
        self.pending: list[tuple[float, str, object]] = []  # (when, what, replica) undo actions
        self.restarted = False
        self.restart_s: float | None = None

    def note_unexpected_exits(self) -> None:
        """A process that exited by itself (not killed by the schedule) is counted, restarted, and
        its log's tail printed: a replica refusing to start (readiness) would otherwise leave the
        soak admitting nothing."""
        waiting = {id(r) for _, what, r in self.pending if what == "restart"}
        for process in self.replicas + self.workers:
            if id(process) not in waiting and process.proc is not None and process.proc.poll() is not None:
                self._count("unexpected_exit")
                tail = process.logfile.read_text(errors="replace")[-1500:] if process.logfile.exists() else ""
                log(f"{process.owner} exited by itself ({process.proc.returncode}); restarting. Log tail:\n{tail}")
                process.start()

    def _count(self, name: str) -> None:
        self.injected[name] = self.injected.get(name, 0) + 1

    def undo_due(self, now: float, force: bool = False) -> None:
        keep = []
        for when, what, replica in self.pending:
            if not force and when > now:
                keep.append((when, what, replica))
                continue
            if what == "restart":
                if not replica.alive():
                    replica.start()
            elif what == "heal":
                replica.proxy.heal()
                replica.proxy.set_latency(0)
            elif what == "reset":
                replica.proxy.disarm()
                replica.proxy.cut_all()
        self.pending = keep

    def restart_postgres(self) -> None:
        log("fault: PostgreSQL restart")
        started = time.monotonic()
        self.server.restart()
        self.restart_s = time.monotonic() - started
        self.restarted = True
        self._count("postgres_restart")

    def inject(self, now: float) -> None:
        busy = {id(r) for _, _, r in self.pending}
        free = [r for r in self.replicas + self.workers if id(r) not in busy and r.alive()]
        if not free:
            return
        replica = self.rng.choice(free)
        if isinstance(replica, WorkerProcess):
            self.inject_worker(now, replica)
            return
        fault = self.rng.choice(["kill9", "kill9", "latency", "reset", "partition", "hang",
                                 "terminate_backends"])
        self._count(fault)
        if fault == "kill9":
            # rounds start a few ms after each whole second: aim there, so the process often
            # dies holding claims (or mid-admission) rather than asleep between rounds
            time.sleep((1.0 - time.time() % 1.0) + self.rng.uniform(0.004, 0.040))
            replica.kill9()
            self.pending.append((now + self.rng.uniform(0.5, 4.0), "restart", replica))
        elif fault == "latency":
            replica.proxy.set_latency(self.rng.uniform(20, 150), jitter_ms=self.rng.uniform(0, 100))
            self.pending.append((now + self.rng.uniform(2, 8), "heal", replica))
        elif fault == "reset":
            replica.proxy.cut_all()
        elif fault == "partition":
            replica.proxy.partition(self.rng.choice([TO_SERVER, TO_CLIENT, BOTH]))
            self.pending.append((now + self.rng.uniform(1, 8), "heal", replica))
        elif fault == "hang":
            replica.proxy.arm(TO_SERVER, ADMISSION_MESSAGE, "hold_replies")
            self.pending.append((now + self.rng.uniform(2, 8), "reset", replica))
        elif fault == "terminate_backends":
            rows = sql(self.server, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE application_name = %s", (f"qinglong runtime {replica.owner}",))
            self.injected["backends_terminated"] = self.injected.get("backends_terminated", 0) + len(rows)
        log(f"fault: {fault} on {replica.owner}")

    def inject_worker(self, now: float, worker: WorkerProcess) -> None:
        fault = self.rng.choice(["kill9", "kill9", "latency", "reset", "partition", "partition",
                                 "hang_complete"])
        self._count("worker_" + fault)
        if fault == "kill9":
            worker.kill9()
            self.pending.append((now + self.rng.uniform(0.5, 4.0), "restart", worker))
        elif fault == "latency":
            worker.proxy.set_latency(self.rng.uniform(20, 150), jitter_ms=self.rng.uniform(0, 100))
            self.pending.append((now + self.rng.uniform(2, 8), "heal", worker))
        elif fault == "reset":
            worker.proxy.cut_all()
        elif fault == "partition":
            # half of them outlast the session lease: the worker must stop its jobs by itself
            # before any other worker may be handed them
            seconds = self.rng.uniform(0.5, self.session_lease_s) if self.rng.random() < 0.5 else \
                self.rng.uniform(self.session_lease_s, 2.5 * self.session_lease_s)
            worker.proxy.partition(self.rng.choice([TO_SERVER, TO_CLIENT, BOTH, BOTH]))
            if seconds > self.session_lease_s:
                self._count("worker_partition_past_lease")
            self.pending.append((now + seconds, "heal", worker))
        elif fault == "hang_complete":
            self.complete_rules.append(worker.proxy.arm(TO_SERVER, COMPLETE_MESSAGE, "hold_replies"))
            self.pending.append((now + self.rng.uniform(2, 8), "reset", worker))
        log(f"fault: {fault} on {worker.worker_id}")


def audit(server, first: dict[str, int]) -> dict:
    """Expected occurrences per trigger against Runs and recorded skips."""
    provider = CronProvider()
    rows = sql(server, "SELECT t.trigger_id, t.spec_json, t.misfire_policy, s.next_fire_at_ms, s.claim_owner "
                       "FROM qinglong.triggers t JOIN qinglong.trigger_schedules s USING (trigger_id)")
    runs = sql(server, "SELECT trigger_id, scheduled_for_ms, admitted_at_ms FROM qinglong.runs")
    skips = sql(server, "SELECT trigger_id, first_skipped_ms, last_skipped_ms FROM qinglong.schedule_skips")
    # a Run is born with its Attempt 1 and its two admission events; retries add Attempts and
    # execution adds events later, so only what admission writes is checked here
    shape_bad = sql(server, """
        SELECT count(*) FROM qinglong.runs r
        WHERE (SELECT count(*) FROM qinglong.attempts a WHERE a.run_id = r.run_id AND a.attempt_no = 1) <> 1
           OR (SELECT count(*) FROM qinglong.run_events e WHERE e.run_id = r.run_id
               AND (e.seq, e.event_type) IN ((1, 'run.created'), (2, 'run.queued'))) <> 2""")[0][0]
    now = sql(server, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]
    admitted: dict[str, list[int]] = {}
    for trigger_id, scheduled, _ in runs:
        admitted.setdefault(trigger_id, []).append(scheduled)
    totals = {policy: dict(triggers=0, expected=0, admitted=0, duplicates=0, missing=0,
                           skipped_recorded=0, admitted_and_skipped=0)
              for policy in ("fire_once", "skip")}
    worst_cursor_lag = -(1 << 62)
    for trigger_id, spec, policy, cursor, _owner in rows:
        expected = []
        occurrence = first[trigger_id]
        while occurrence < cursor:
            expected.append(occurrence)
            occurrence = provider.next_after(spec, occurrence)
        got = admitted.get(trigger_id, [])
        skipped = {o for o in expected for t, lo, hi in skips if t == trigger_id and lo <= o <= hi}
        t = totals[policy]
        t["triggers"] += 1
        t["expected"] += len(expected)
        t["admitted"] += len(got)
        t["duplicates"] += len(got) - len(set(got))
        t["missing"] += len(set(expected) - set(got) - skipped)
        t["skipped_recorded"] += len(skipped)
        t["admitted_and_skipped"] += len(skipped & set(got))
        worst_cursor_lag = max(worst_cursor_lag, now - cursor)
    lags = sorted(admitted_at - scheduled for _, scheduled, admitted_at in runs)
    return {
        "by_policy": totals,
        "expected": sum(t["expected"] for t in totals.values()),
        "admitted": sum(t["admitted"] for t in totals.values()),
        "duplicates": sum(t["duplicates"] for t in totals.values()),
        "missing": sum(t["missing"] for t in totals.values()),
        "skipped_recorded": sum(t["skipped_recorded"] for t in totals.values()),
        "runs_without_admission_shape": shape_bad,
        "worst_lag_ms": lags[-1] if lags else None,
        "p50_lag_ms": lags[len(lags) // 2] if lags else None,
        "p99_lag_ms": lags[int(len(lags) * 0.99)] if lags else None,
        "cursor_behind_now_ms_at_end": max(0, worst_cursor_lag),
    }


def replica_log_figures(replicas: list[Replica]) -> dict:
    """What the replicas reported: startup recoveries, candidates, unique-key refusals."""
    figures = dict(startups=0, recovery_candidates_max=0, pristine_queued_max=0, failed_rounds=0,
                   unique_violations=0, fence_lost_warnings=0)
    for replica in replicas:
        if not replica.logfile.exists():
            continue
        for line in replica.logfile.read_text(errors="replace").splitlines():
            if "23505" in line:
                figures["unique_violations"] += 1
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            code = event.get("code")
            if code == "lifecycle.recovered":
                figures["startups"] += 1
                figures["recovery_candidates_max"] = max(figures["recovery_candidates_max"],
                                                         event.get("candidates", 0))
                figures["pristine_queued_max"] = max(figures["pristine_queued_max"],
                                                     event.get("pristine_queued", 0))
            elif code in ("cluster_postgres.round_failed", "scheduler.round_failed"):
                figures["failed_rounds"] += 1
            elif code == "scheduler.round_incomplete" and event.get("fence_lost"):
                figures["fence_lost_warnings"] += 1
    return figures


def worker_log_figures(workers: list[WorkerProcess]) -> dict:
    """What the workers reported: their diagnostic codes, counted (self-fences, refusals, ...)."""
    codes: dict[str, int] = {}
    for worker in workers:
        if not worker.logfile.exists():
            continue
        for line in worker.logfile.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                code = json.loads(line).get("code")
            except ValueError:
                continue
            if code:
                codes[code] = codes.get(code, 0) + 1
    return dict(sorted(codes.items()))


def db_now(server) -> int:
    return sql(server, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]


def wait_until(what: str, predicate, timeout_s: float, every_s: float = 0.5) -> tuple[bool, float]:
    """Poll ``predicate`` until true or ``timeout_s``; (met, seconds waited)."""
    started = time.monotonic()
    while True:
        if predicate():
            return True, time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            log(f"gave up waiting for {what} after {timeout_s:.0f} s")
            return False, time.monotonic() - started
        time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--worker-slots", type=int, default=8, help="max_running of each worker")
    parser.add_argument("--triggers", type=int, default=32)
    parser.add_argument("--lease-ms", type=int, default=3000)
    parser.add_argument("--session-lease-ms", type=int, default=5000, help="the workers' session lease")
    parser.add_argument("--heartbeat-ms", type=int, default=1000)
    parser.add_argument("--cadence-ms", type=int, default=1000)
    parser.add_argument("--fault-every", type=float, default=3.0, help="mean seconds between faults")
    parser.add_argument("--drain-timeout", type=float, default=180.0,
                        help="seconds the workers get to finish the queue after admission stopped")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "chaos.json"))
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="ql-chaos-"))
    os.chmod(workdir, 0o755)
    log(f"seed {seed}; {args.replicas} replicas, {args.workers} workers, {args.triggers} triggers, "
        f"{args.minutes:g} min of faults; logs in {workdir}")
    job = cluster_workers.write_marker_job(workdir / "jobs")
    marks = job.parent / "marks"
    payloads = task_payloads(job)
    server = start_server("pg18")
    replicas: list[Replica] = []
    workers: list[WorkerProcess] = []
    started = time.monotonic()
    try:
        first = prepare(server, args.triggers, args.lease_ms, args.cadence_ms, payloads)
        replicas = [Replica(i, server, workdir, args.lease_ms, args.cadence_ms) for i in range(args.replicas)]
        workers = [make_worker(i, server, workdir, args) for i in range(args.workers)]
        for process in replicas + workers:
            process.start()
        time.sleep(4.5)
        chaos = Chaos(server, replicas, rng, workers, args.session_lease_ms)
        duration = args.minutes * 60
        fault_start = time.monotonic()
        next_fault = fault_start + rng.expovariate(1 / args.fault_every)
        while (now := time.monotonic()) - fault_start < duration:
            chaos.undo_due(now)
            chaos.note_unexpected_exits()
            if not chaos.restarted and now - fault_start > duration / 2:
                chaos.restart_postgres()
            elif now >= next_fault:
                chaos.inject(now)
                next_fault = now + rng.expovariate(1 / args.fault_every)
            time.sleep(0.05)
        log("faults stop; healing and letting the replicas catch up")
        chaos.undo_due(time.monotonic(), force=True)
        for process in replicas + workers:
            process.proxy.disarm()
            process.proxy.heal()
            process.proxy.set_latency(0)
            if not process.alive():
                process.start()
        heal_started = time.monotonic()
        # caught up: no schedule behind the database clock by more than two seconds
        _, caught_up_s = wait_until("the replicas to catch up", lambda: sql(
            server, "SELECT count(*) FROM qinglong.trigger_schedules WHERE next_fire_at_ms < "
                    "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 2000")[0][0] == 0,
            max(30.0, args.lease_ms / 1000 * 4))
        # every lease a killed or fenced worker held has expired and been ended by a replica: the
        # replicas do the expiry, so they stop only after it
        leases_from = db_now(server) + args.session_lease_ms + 1000
        expired_ok, _ = wait_until("the expired Run leases to be ended", lambda: sql(
            server, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint > %s AND NOT EXISTS ("
                    "SELECT 1 FROM qinglong.attempts WHERE state IN ('dispatching', 'running') AND "
                    "lease_expires_at_ms < floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 2000)",
            (leases_from,))[0][0], 60.0 + 4 * args.session_lease_ms / 1000)
        exit_codes = [replica.stop() for replica in replicas]
        log("replicas stopped (admission is over); the workers drain the queue")
        drained, drain_s = wait_until("the workers to finish every Run", lambda: sql(
            server, "SELECT count(*) FROM qinglong.runs WHERE state NOT IN "
                    "('succeeded', 'failed', 'timed_out', 'cancelled', 'lost')")[0][0] == 0,
            args.drain_timeout)
        worker_exit_codes = [worker.stop() for worker in workers]
        # a job wrapper still alive once its worker drained and stopped is a hung job: counted, killed
        leftover_jobs = sum(worker.leftover_jobs() for worker in workers)
        for process in replicas + workers:
            process.proxy.close()
        result = audit(server, first)
        execution = cluster_workers.audit_execution(server.superuser_dsn(DBNAME), marks, payloads)
        result.update(
            seed=seed, minutes=args.minutes, replicas=args.replicas, triggers=args.triggers,
            lease_ms=args.lease_ms, cadence_ms=args.cadence_ms, injected=chaos.injected,
            replica_starts=sum(r.starts for r in replicas), replica_exit_codes=exit_codes,
            postgres_restart_s=round(chaos.restart_s, 2) if chaos.restart_s else None,
            caught_up_after_heal_s=round(caught_up_s, 2),
            wall_s=round(time.monotonic() - started, 1), replica_logs=replica_log_figures(replicas),
            server=f"PostgreSQL {server.version_num()}",
            workers=args.workers, worker_slots=args.worker_slots, session_lease_ms=args.session_lease_ms,
            heartbeat_ms=args.heartbeat_ms, worker_starts=sum(w.starts for w in workers),
            worker_exit_codes=worker_exit_codes, worker_logs=worker_log_figures(workers),
            completion_replies_held=sum(1 for r in chaos.complete_rules if r.fired.is_set()),
            expired_leases_ended_before_stop=expired_ok, drained=drained, drain_s=round(drain_s, 2),
            job_wrappers_left_alive_after_stop=leftover_jobs,
            execution=execution, tasks={t: p for t, p in payloads.items()},
        )
    finally:
        for process in replicas + workers:
            process.kill9()
            if process.proxy is not None:
                process.proxy.close()
        for worker in workers:
            worker.leftover_jobs()
        server.destroy()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    v, f = execution["violations"], execution["figures"]
    print(f"expected={result['expected']} admitted={result['admitted']} duplicates={result['duplicates']} "
          f"missing={result['missing']} skipped_recorded={result['skipped_recorded']} "
          f"worst_lag={result['worst_lag_ms']}ms p99_lag={result['p99_lag_ms']}ms "
          f"caught_up_after_heal={result['caught_up_after_heal_s']}s")
    print(f"execution: runs={f['runs']} attempts={f['attempts']} by_state={f['runs_by_state']} "
          f"jobs_started={f['jobs_started']} jobs_ended={f['jobs_ended']} "
          f"killed_or_orphaned={f['jobs_killed_or_orphaned']} finished_but_lost={f['finished_but_lost']} "
          f"retries={f['retries']} lost_not_retried_non_idempotent={f['lost_never_retried_non_idempotent']} "
          f"min_handover_gap={f['min_handover_gap_ms']}ms drained_in={result['drain_s']}s")
    print("violations: " + ", ".join(f"{k}={n}" for k, n in v.items()))
    if execution["examples"]:
        print("examples: " + json.dumps(execution["examples"])[:3000])
    print("injected: " + ", ".join(f"{k}={n}" for k, n in sorted(result["injected"].items())))
    print(f"written to {out}")
    ok = (result["duplicates"] == 0 and result["missing"] == 0 and result["runs_without_admission_shape"] == 0
          and execution["violation_total"] == 0 and drained)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
