"""The harness of the worker failure tests: real ``qinglong run`` replicas, a real ``qinglong api``
serving the worker gateway, and ``qinglong worker`` processes that reach the store only through
that gateway, each worker through its own fault proxy, a job that marks its start and end on the
machine's monotonic clock, and the audits.

* :class:`Cluster`: one migrated database, a task published through the real publisher, Runs
  admitted by real replicas (triggers whose cursor is put just behind the database clock: one
  Run each), replicas, gateways and workers as subprocesses with their stderr kept for their
  diagnostics;
* :class:`Gateway`: one ``qinglong api`` with ``[api] gateway_dsn`` set, its link to the database
  through its own :class:`SniffingProxy` (gateway<->database faults), started on the first
  worker, killed and restarted by the test;
* :class:`WorkerProcess`: one ``python -m qinglong worker --settings FILE`` (profile ``cluster``,
  ``[worker] url`` and ``token_file``), registered with the real CLI (its labels, capacity =
  ``max_running``), with short leases, behind its own proxy in front of the gateway's HTTP port
  (worker<->gateway faults; a namespace bridge is such a proxy on the namespace's host address),
  killed, stopped, continued and restarted by the test;
* :class:`JobWatcher`: a thread that opens a pidfd on every job as soon as its start marker
  appears, so a job ended by KILL (no end marker) still has an upper bound on its end;
* :func:`executions`, :func:`overlaps` and :func:`audit_runs`: what ran, whether two executions
  of one Run overlapped, and whether every Run ended in one terminal state within its policy.

Nothing here sleeps a fixed time before asserting: :func:`wait_until` polls a condition within
the failure tests' generous bound (:data:`~tests.failure.failure_helpers.PATIENCE_S`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cluster import ClusterDb, set_cursor
from tests.failure.failure_helpers import (
    PATIENCE_S,
    parse_diagnostics,
    qinglong_command,
    sql,
    write_cluster_settings,
)
from devtools.fault_proxy import FaultProxy
from tests.gateway.helpers import plane_settings, register
from tests.support.pg import ROLE_PASSWORDS
from tests.support import procs as proc_helpers

JOB = Path(__file__).with_name("marker_job.py")
PROJECT = "wf"

#: Short leases: a lost worker is noticed in seconds. check_worker_timing accepts them:
#: 2 x 1000 + 500 + 1000 + 1000 = 4500 <= 5000.
SESSION_LEASE_MS = 5000
HEARTBEAT_MS = 1000
SELF_FENCE_MARGIN_MS = 1000
KILL_GRACE_MS = 500
POLL_MS = 100

TERMINAL_RUN_STATES = ("succeeded", "failed", "timed_out", "cancelled", "lost")
ACTIVE_ATTEMPT_STATES = ("claimed", "dispatching", "running")


def wait_until(condition, what: str, timeout_s: float = PATIENCE_S, interval_s: float = 0.05):
    """Poll ``condition`` until truthy (its value), or fail naming ``what``, never sooner than
    :data:`PATIENCE_S`."""
    return proc_helpers.wait_until(condition, what, timeout=max(timeout_s, PATIENCE_S), interval=interval_s)

def job_command(markers: Path, hold_s: float = 60.0, exit_code: int = 0) -> list[str]:
    """The marker job's argv: hold ``hold_s`` seconds or until ``markers/release`` exists."""
    return [sys.executable, str(JOB), str(markers), str(hold_s), str(exit_code)]


# ---------------------------------------------------------------------------------- the proxy


class SniffingProxy(FaultProxy):
    """A :class:`FaultProxy` that also counts the chunks carrying a watched byte pattern in each
    direction (a reply's result literal, say), so a test can tell what the worker was answered."""

    def __init__(self, *args, watch: tuple[bytes, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.watch = tuple(watch)
        self.seen: dict[tuple[str, bytes], int] = {}
        self._seen_lock = threading.Lock()

    def _take_rule(self, direction, data):
        for pattern in self.watch:
            if pattern in data:
                with self._seen_lock:
                    self.seen[(direction, pattern)] = self.seen.get((direction, pattern), 0) + 1
        return super()._take_rule(direction, data)

    def count(self, direction: str, pattern: bytes) -> int:
        with self._seen_lock:
            return self.seen.get((direction, pattern), 0)


#: What every proxy counts: the results of ``complete`` as the gateway (or the store, on the
#: gateway's database link) answers them, and the worker's completion requests (a plain one, or
#: one that also claims).
COMPLETE_REQUEST = b"POST /worker/v1/complete "
COMPLETE_AND_CLAIM_REQUEST = b"POST /worker/v1/complete_and_claim "
WATCHED = (b"accepted", b"already_done", b"log_incomplete", b"worker_complete", COMPLETE_REQUEST,
           COMPLETE_AND_CLAIM_REQUEST)

#: A claim waits at the gateway this long for a Run to become claimable.
CLAIM_WAIT_MS = 5000
#: The gateway's pool of database connections (every worker of a test shares it).
GATEWAY_POOL_SIZE = 4


# ---------------------------------------------------------------------------------- processes


class Process:
    """One child process with its stderr in a file (diagnostics are JSON lines there)."""

    def __init__(self, name: str, argv: list[str], log: Path, *, env: dict | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self._fh = log.open("ab")
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._fh,
                                      stderr=self._fh, env=env)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def kill9(self) -> int:
        self.signal(signal.SIGKILL)
        return self.popen.wait(timeout=PATIENCE_S)

    def terminate(self, timeout_s: float = PATIENCE_S) -> int:
        """SIGTERM and wait for its exit (a SIGSTOPped process is continued first)."""
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=PATIENCE_S)
            raise AssertionError(f"{self.name} did not exit within {timeout_s:.0f}s of SIGTERM")

    def close(self) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.popen.kill()
            self.popen.wait(timeout=PATIENCE_S)
        self._fh.close()

    def text(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")

    def diagnostics(self) -> list[dict]:
        return parse_diagnostics(self.text())

    def codes(self) -> list[str]:
        return [e.get("code", "") for e in self.diagnostics()]


def write_worker_settings(path: Path, *, url: str, token: str, worker_id: str, log_dir: Path,
                          max_running: int = 2,
                          session_lease_ms: int = SESSION_LEASE_MS, heartbeat_ms: int = HEARTBEAT_MS,
                          self_fence_margin_ms: int = SELF_FENCE_MARGIN_MS,
                          kill_grace_ms: int = KILL_GRACE_MS, poll_ms: int = POLL_MS,
                          drain_timeout_ms: int = 3000, claim_wait_ms: int = CLAIM_WAIT_MS) -> Path:
    """A ``profile = "cluster"`` settings file for ``qinglong worker`` reaching the gateway at
    ``url``, its token in a 0600 file beside it (the identity, labels and capacity the gateway
    uses are the registration's)."""
    token_file = path.with_suffix(".token")
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    path.write_text(
        'profile = "cluster"\n'
        "[worker]\n"
        f"url = {json.dumps(url)}\n"
        f"token_file = {json.dumps(str(token_file))}\n"
        f"worker_id = {json.dumps(worker_id)}\n"
        f"max_running = {max_running}\n"
        f"session_lease_ms = {session_lease_ms}\nheartbeat_ms = {heartbeat_ms}\n"
        f"self_fence_margin_ms = {self_fence_margin_ms}\nkill_grace_ms = {kill_grace_ms}\n"
        f"poll_ms = {poll_ms}\nclaim_wait_ms = {claim_wait_ms}\n"
        f"log_dir = {json.dumps(str(log_dir))}\n"
        f"drain_timeout_ms = {drain_timeout_ms}\n"
        '[diagnostics]\nlevel = "info"\nformat = "json"\n'
    )
    path.chmod(0o600)
    return path


def worker_command(settings: Path) -> list[str]:
    return [sys.executable, "-m", "qinglong", "worker", "--settings", str(settings)]


@dataclass
class WorkerProcess:
    """One worker: its id, its settings, its proxy in front of the gateway (None: the gateway's
    own address) and its current process (replaced by :meth:`restart`)."""

    name: str
    worker_id: str
    settings: Path
    log: Path
    proxy: FaultProxy | None
    prefix: list[str] = field(default_factory=list)  # e.g. ``ip netns exec NS``
    process: Process | None = None
    generations: list[Process] = field(default_factory=list)

    def start(self) -> "WorkerProcess":
        """A new process (its stderr in a file of its own: ``NAME.log``, then ``NAME.2.log``...)."""
        n = len(self.generations) + 1
        log = self.log if n == 1 else self.log.with_name(f"{self.name}.{n}.log")
        self.process = Process(self.name, [*self.prefix, *worker_command(self.settings)], log)
        self.generations.append(self.process)
        return self

    def restart(self) -> "WorkerProcess":
        """A new process with the same worker id (the old one is left as it is)."""
        return self.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def diagnostics(self) -> list[dict]:
        """Every process's diagnostics, one process after the other."""
        return [e for proc in self.generations for e in proc.diagnostics()]

    def codes(self) -> list[str]:
        return [e.get("code", "") for e in self.diagnostics()]


# ---------------------------------------------------------------------------------- the cluster


class Gateway:
    """One ``qinglong api`` serving ``/worker/v1``: its settings, its process, its HTTP port (from
    its ``listening on`` line) and the proxy its gateway pool reaches the database through."""

    def __init__(self, name: str, settings: Path, log_dir: Path, db_proxies: list[FaultProxy]) -> None:
        self.name = name
        self.settings = settings
        self.log_dir = log_dir
        self.db_proxies = db_proxies
        self.generations: list[Process] = []
        self.process: Process | None = None
        self.port: int | None = None

    @property
    def db_proxy(self) -> FaultProxy | None:
        """The proxy of its database link (the first, with a multi-host DSN)."""
        return self.db_proxies[0] if self.db_proxies else None

    def start(self) -> "Gateway":
        """A new process on a port of its own; returns once it listens."""
        n = len(self.generations) + 1
        log = self.log_dir / (f"{self.name}.log" if n == 1 else f"{self.name}.{n}.log")
        self.process = Process(self.name if n == 1 else f"{self.name}#{n}",
                               [sys.executable, "-m", "qinglong", "--settings", str(self.settings), "api"], log)
        self.generations.append(self.process)
        self.port = wait_until(self._listening, f"{self.name} to listen")
        return self

    def _listening(self) -> int | None:
        if not self.process.alive():
            raise AssertionError(f"{self.name} exited {self.process.popen.returncode}:\n{self.process.text()[-3000:]}")
        found = re.search(r"listening on [^ \"]+:(\d+)", self.process.text())
        return int(found.group(1)) if found else None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill9(self) -> int:
        return self.process.kill9()

    def diagnostics(self) -> list[dict]:
        return [e for proc in self.generations for e in proc.diagnostics()]

    def codes(self) -> list[str]:
        return [e.get("code", "") for e in self.diagnostics()]


class Cluster:
    """A migrated database, the marker directory, and the processes a test starts. The gateway
    starts with the first worker (or :meth:`start_gateway`, to give it a DSN of the test's)."""

    def __init__(self, db: ClusterDb, tmp: Path) -> None:
        self.db = db
        self.tmp = tmp
        self.markers = tmp / "markers"
        self.markers.mkdir(mode=0o755)
        self.replicas: list[Process] = []
        self.workers: dict[str, WorkerProcess] = {}
        self.proxies: list[FaultProxy] = []
        self._gateway: Gateway | None = None
        self._tokens: dict[str, str] = {}  # worker id -> its token
        self.watcher = JobWatcher(self.markers)
        self.watcher.start()
        self._triggers = 0

    # ---- the database -----------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        return self.db.superuser_dsn()

    def rows(self, statement: str, params=None):
        return sql(self.dsn, statement, params)

    def one(self, statement: str, params=None):
        rows = self.rows(statement, params)
        return rows[0][0] if rows else None

    def publish_task(self, task_id: str, *, hold_s: float = 60.0, exit_code: int = 0,
                     command: list[str] | None = None, **spec) -> None:
        """Publish (or revise) ``task_id`` running the marker job (or ``command``); ``spec``: the
        execution keys (retry, idempotent, timeout_ms, concurrency, labels...)."""
        from qinglong.contracts.errors import AlreadyExists

        payload = {"command": command or job_command(self.markers, hold_s, exit_code), **spec}

        async def body():
            backend = self.db.backend("publisher")
            try:
                pub = backend.publisher()
                try:
                    await pub.create_project(PROJECT)
                except AlreadyExists:
                    pass
                await pub.put_task(PROJECT, task_id, payload)
            finally:
                await backend.close()

        asyncio.run(body())

    def admit(self, task_id: str, n: int = 1) -> list[str]:
        """``n`` new triggers of ``task_id`` (once a year) whose cursor is put just behind the
        database clock: the replicas admit one Run each. Returns the trigger ids."""
        from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

        ids = [f"{task_id}-t{self._triggers + i:04d}" for i in range(n)]
        self._triggers += n

        async def body():
            backend = self.db.backend("publisher")
            try:
                pub = backend.publisher()
                for trigger_id in ids:
                    await pub.put_trigger(TriggerDefinition(
                        PROJECT, trigger_id, task_id, "cron", {"expression": "0 0 1 1 *"},
                        misfire_policy=MisfirePolicy.FIRE_ONCE, misfire_grace_ms=600_000))
            finally:
                await backend.close()

        asyncio.run(body())
        for trigger_id in ids:
            set_cursor(self.db, trigger_id, -500)
        return ids

    def wait_runs(self, n: int, what: str = "the Runs to be admitted") -> list[str]:
        """Wait for ``n`` admitted Runs, counting those a claim skipped (their record leaves the
        Runs for qinglong.run_skips); return the ids of those still Runs."""
        admitted = ("SELECT (SELECT count(*) FROM qinglong.runs) + (SELECT count(*) FROM qinglong.run_skips)")
        try:
            wait_until(lambda: self.rows(admitted)[0][0] >= n, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; replicas said: {self.tails()}") from None
        return [r[0] for r in self.rows("SELECT run_id::text FROM qinglong.runs ORDER BY scheduled_for_ms, run_id")]

    def run_states(self) -> dict[str, str]:
        return dict(self.rows("SELECT run_id::text, state FROM qinglong.runs"))

    def attempts(self, run_id: str | None = None) -> list[dict]:
        where = "" if run_id is None else "WHERE run_id = %(r)s"
        rows = self.rows(f"SELECT to_jsonb(a) FROM qinglong.attempts a {where} "
                         "ORDER BY run_id, attempt_no", {"r": run_id})
        return [r[0] for r in rows]

    def wait_all_terminal(self, what: str = "every Run to end") -> dict[str, str]:
        placeholders = ", ".join(f"'{s}'" for s in TERMINAL_RUN_STATES)
        try:
            wait_until(lambda: self.db.count("runs", f"state NOT IN ({placeholders})") == 0, what)
        except AssertionError as exc:
            open_runs = {r: s for r, s in self.run_states().items() if s not in TERMINAL_RUN_STATES}
            stuck = [(a["run_id"][:8], a["attempt_no"], a["state"], a.get("worker_id"))
                     for a in self.attempts() if a["run_id"] in open_runs]
            raise AssertionError(f"{exc}: {len(open_runs)} Runs open, their attempts {stuck[:10]}; "
                                 f"processes said: {self.tails(600)}") from None
        return self.run_states()

    def release_jobs(self) -> None:
        """Let every marker job that holds for the gate end now (and every later one at once)."""
        (self.markers / "release").touch()

    # ---- processes --------------------------------------------------------------------------
    def proxy(self, name: str, upstream: tuple[str, int] | None = None, *,
              listen_host: str = "127.0.0.1") -> SniffingProxy:
        """A proxy of the test's, to the database (or to ``upstream``), closed with the cluster."""
        proxy = SniffingProxy(upstream or (self.db.server.host, self.db.server.port), name=name,
                              listen_host=listen_host, watch=WATCHED).start()
        self.proxies.append(proxy)
        return proxy

    def start_replica(self, name: str, *, dsn: str | None = None, lease_ms: int = 2000,
                      cadence_ms: int = 200) -> Process:
        settings = write_cluster_settings(self.tmp / f"{name}.toml",
                                          dsn or self.db.dsn("qinglong_runtime"), owner=name,
                                          lease_ms=lease_ms, cadence_ms=cadence_ms)
        with settings.open("a") as fh:
            fh.write('[http]\nlisten = ""\n')  # several replicas on one machine: no HTTP surface
        proc = Process(name, qinglong_command(settings), self.tmp / f"{name}.log")
        self.replicas.append(proc)
        return proc

    def ingress_dsn(self, host: str, port: int | str, connect_timeout: int = 3) -> str:
        """The gateway's role on this database through ``host:port`` (comma lists: several hosts)."""
        return (f"host={host} port={port} user=qinglong_gateway "
                f"password={ROLE_PASSWORDS['qinglong_gateway']} dbname={self.db.dbname} "
                f"connect_timeout={connect_timeout}")

    @property
    def store_dsn(self) -> str:
        """The gateway's role on this database, directly (a test driving the store side itself)."""
        return self.ingress_dsn(self.db.server.host, self.db.server.port)

    # ---- the gateway ------------------------------------------------------------------------
    def _settings(self) -> Path:
        """The API tier's settings (also what ``qinglong worker register`` reads)."""
        root = self.tmp / "api"
        if not (root / "api.toml").exists():
            root.mkdir(exist_ok=True)
            plane_settings(self.db, root, pool_size=GATEWAY_POOL_SIZE, gateway_dsn=self.store_dsn)
        return root / "api.toml"

    def start_gateway(self, *, dsn: str | None = None, db_proxies: list[FaultProxy] | None = None) -> Gateway:
        """``qinglong api`` with the gateway on; its pool reaches the database through a proxy of
        its own (``gateway.db_proxy``), unless ``dsn`` (through ``db_proxies``) is given."""
        assert self._gateway is None, "one gateway per cluster"
        if dsn is None:
            db_proxies = [self.proxy("proxy-gateway-db")]
            dsn = self.ingress_dsn(db_proxies[0].host, db_proxies[0].port)
        settings = self._settings()
        text = settings.read_text()
        text = re.sub(r'gateway_dsn = ".*"', lambda _: f"gateway_dsn = {json.dumps(dsn)}", text)
        settings.write_text(text)
        self._gateway = Gateway("gateway", settings, self.tmp, list(db_proxies or [])).start()
        return self._gateway

    @property
    def gateway(self) -> Gateway:
        return self._gateway if self._gateway is not None else self.start_gateway()

    def restart_gateway(self) -> Gateway:
        """A new gateway process (the old one is left as it is: kill it first); every worker's
        proxy now forwards to its port (a moved service address)."""
        gateway = self.gateway.start()
        for worker in self.workers.values():
            if worker.proxy is not None and worker.proxy.upstream[1] != gateway.port:
                worker.proxy.retarget(gateway.address)
        return gateway

    def register(self, worker_id: str, *, labels: tuple[str, ...] = (), capacity: int = 2) -> str:
        """Register ``worker_id`` with the real CLI (once per cluster); its token."""
        if worker_id not in self._tokens:
            self._tokens[worker_id] = register(self._settings(), worker_id, labels=tuple(labels),
                                               capacity=capacity)
        return self._tokens[worker_id]

    def add_worker(self, name: str, *, worker_id: str | None = None, proxy: bool = True,
                   listen_host: str = "127.0.0.1", prefix: list[str] | None = None, start: bool = True,
                   labels: tuple[str, ...] = (), max_running: int = 2, **settings) -> WorkerProcess:
        """A worker ``name`` (its id defaults to the name), registered (its labels, capacity
        ``max_running``), reaching the gateway through its own proxy listening on
        ``listen_host`` (a namespace's host address: the bridge), or directly (``proxy`` False)."""
        gateway = self.gateway
        worker_id = worker_id or name
        token = self.register(worker_id, labels=labels, capacity=max_running)
        fault = None
        url = gateway.url
        if proxy:
            fault = self.proxy(f"proxy-{name}", gateway.address, listen_host=listen_host)
            url = f"http://{fault.host}:{fault.port}"
        log_dir = self.tmp / f"{name}-logs"
        log_dir.mkdir(exist_ok=True)
        path = write_worker_settings(self.tmp / f"{name}.toml", url=url, token=token, worker_id=worker_id,
                                     log_dir=log_dir, max_running=max_running, **settings)
        worker = WorkerProcess(name, worker_id, path, self.tmp / f"{name}.log", fault,
                               prefix=list(prefix or []))
        self.workers[name] = worker
        if start:
            worker.start()
        return worker

    def tails(self, chars: int = 1500) -> dict[str, str]:
        """The end of every process's stderr, for a failure message."""
        out = {p.name: p.text()[-chars:] for p in self.replicas}
        if self._gateway is not None:
            for proc in self._gateway.generations:
                out[proc.name] = proc.text()[-chars:]
        for w in self.workers.values():
            for i, proc in enumerate(w.generations):
                out[f"{w.name}#{i + 1}"] = proc.text()[-chars:]
        return out

    def sessions(self) -> dict[str, dict]:
        rows = self.rows("SELECT worker_id, to_jsonb(s) FROM qinglong.worker_sessions s")
        return {w: s for w, s in rows}

    def close(self) -> None:
        """Stop everything this cluster started (SIGKILL: the test already looked at what it
        needed), then release and reap the jobs left behind."""
        self.release_jobs()
        for worker in self.workers.values():
            for proc in worker.generations:
                proc.close()
        if self._gateway is not None:
            for proc in self._gateway.generations:
                proc.close()
        for proc in self.replicas:
            proc.close()
        for proxy in self.proxies:
            proxy.close()
        self.watcher.wait_all_gone(timeout_s=30)
        self.watcher.stop()


# ---------------------------------------------------------------------------------- jobs


class JobWatcher(threading.Thread):
    """Opens a pidfd on each job as its start marker appears and records (monotonic) when the
    job's process was seen gone: an upper bound on the end of a job ended by KILL."""

    def __init__(self, markers: Path) -> None:
        super().__init__(daemon=True, name="job-watcher")
        self.markers = markers
        self.gone_at: dict[str, float] = {}   # key "<run>.<attempt>" -> monotonic
        self.pids: dict[str, int] = {}
        self._fds: dict[int, str] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            for entry in os.scandir(self.markers):
                if not entry.name.endswith(".start"):
                    continue
                key = entry.name[:-len(".start")]
                if key in self.pids:
                    continue
                try:
                    text = Path(entry.path).read_text()
                except OSError:
                    continue
                if not text.endswith("\n"):
                    continue  # not written whole yet
                pid = int(text.split()[1])
                self.pids[key] = pid
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    with self._lock:
                        self.gone_at[key] = time.monotonic()
                    continue
                self._fds[fd] = key
            if self._fds:
                ready, _, _ = select.select(list(self._fds), [], [], 0.01)
                now = time.monotonic()
                for fd in ready:
                    key = self._fds.pop(fd)
                    os.close(fd)
                    with self._lock:
                        self.gone_at[key] = now
            else:
                time.sleep(0.01)

    def running(self) -> list[str]:
        with self._lock:
            return [k for k in self.pids if k not in self.gone_at]

    def wait_all_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.running()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        for fd in list(self._fds):
            os.close(fd)
        self._fds.clear()


@dataclass(frozen=True)
class Execution:
    """One execution of one Attempt, on the monotonic clock. ``end`` is the end marker's time,
    or (no end marker: the job was KILLed) the moment the watcher saw it gone, or None while it
    runs; ``how`` is ``done``, ``term``, ``killed`` or ``running``."""

    run_id: str
    attempt_id: str
    pid: int
    start: float
    end: float | None
    how: str


def executions(markers: Path, watcher: JobWatcher | None = None) -> tuple[list[Execution], list[str]]:
    """Every execution the markers show, and every duplicate start of one Attempt (its key)."""
    found, duplicates = [], []
    for entry in sorted(os.listdir(markers)):
        if ".dup." in entry:
            duplicates.append(entry)
            continue
        if not entry.endswith(".start"):
            continue
        key = entry[:-len(".start")]
        run_id, attempt_id = key.split(".")
        start_text = (markers / entry).read_text().split()
        end_path = markers / f"{key}.end"
        if end_path.exists() and end_path.read_text().endswith("\n"):
            mono, _, how = end_path.read_text().split()
            end, how = float(mono), how
        elif watcher is not None and key in watcher.gone_at:
            end, how = watcher.gone_at[key], "killed"
        else:
            end, how = None, "running"
        found.append(Execution(run_id, attempt_id, int(start_text[1]), float(start_text[0]), end, how))
    return found, duplicates


def overlaps(found: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of executions of one Run whose [start, end] intervals overlap (a job still running
    overlaps everything that started after it)."""
    by_run: dict[str, list[Execution]] = {}
    for e in found:
        by_run.setdefault(e.run_id, []).append(e)
    pairs = []
    for runs in by_run.values():
        runs.sort(key=lambda e: e.start)
        for i, a in enumerate(runs):
            for b in runs[i + 1:]:
                if a.end is None or b.start < a.end:
                    pairs.append((a, b))
    return pairs


def started_keys(markers: Path) -> set[str]:
    return {e[:-len(".start")] for e in os.listdir(markers) if e.endswith(".start")}


def ended_keys(markers: Path) -> set[str]:
    return {e[:-len(".end")] for e in os.listdir(markers) if e.endswith(".end")}


# ---------------------------------------------------------------------------------- the audit


@dataclass
class RunAudit:
    """Every Run against its Attempts: exactly one terminal state, Attempts numbered 1..n with
    at most one active, and the retry policy respected; figures for the report."""

    runs: int
    by_state: dict
    problems: list = field(default_factory=list)
    attempts_by_state: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"runs": self.runs, "by_state": self.by_state, "attempts": self.attempts_by_state,
                "problems": self.problems[:10]}


def audit_runs(cluster: Cluster, *, max_attempts: int | None = None, retry_lost: bool | None = None) -> RunAudit:
    """Check every Run: one terminal state (with its end time), its Attempts numbered 1..n, none
    of them still active, the last one's end matching the Run's, and (given) at most
    ``max_attempts`` Attempts; ``retry_lost`` False: a lost Attempt is never followed by another."""
    runs = cluster.rows("SELECT run_id::text, state, to_jsonb(r) FROM qinglong.runs r")
    attempts = cluster.attempts()
    by_run: dict[str, list[dict]] = {}
    for a in attempts:
        by_run.setdefault(a["run_id"], []).append(a)
    audit = RunAudit(len(runs), {})
    for a in attempts:
        audit.attempts_by_state[a["state"]] = audit.attempts_by_state.get(a["state"], 0) + 1
    for run_id, state, row in runs:
        audit.by_state[state] = audit.by_state.get(state, 0) + 1
        mine = by_run.get(run_id, [])
        numbers = [a["attempt_no"] for a in mine]
        if state not in TERMINAL_RUN_STATES:
            audit.problems.append(f"run {run_id} is {state}")
        if row.get("finished_at_ms") is None and state in TERMINAL_RUN_STATES:
            audit.problems.append(f"run {run_id} is {state} without finished_at_ms")
        if numbers != list(range(1, len(mine) + 1)):
            audit.problems.append(f"run {run_id} attempts numbered {numbers}")
        active = [a for a in mine if a["state"] in ACTIVE_ATTEMPT_STATES]
        if active:
            audit.problems.append(f"run {run_id} has active attempts {[a['state'] for a in active]}")
        if mine and state in TERMINAL_RUN_STATES and mine[-1]["state"] != state:
            audit.problems.append(f"run {run_id} is {state}, its last attempt {mine[-1]['state']}")
        if max_attempts is not None and len(mine) > max_attempts:
            audit.problems.append(f"run {run_id} has {len(mine)} attempts > {max_attempts}")
        if retry_lost is False:
            for a in mine[:-1]:
                if a["state"] == "lost":
                    audit.problems.append(f"run {run_id}: lost attempt {a['attempt_no']} was retried")
    return audit


def exit_codes_recorded(cluster: Cluster, found: list[Execution], expected_code: int) -> list[str]:
    """Problems: a job that ran to its end (end marker ``done``) whose Attempt has not recorded
    ``expected_code`` as its exit code."""
    codes = {a["attempt_id"]: (a["state"], a.get("exit_code")) for a in cluster.attempts()}
    problems = []
    for e in found:
        if e.how == "done":
            state, code = codes.get(e.attempt_id, (None, None))
            if code != expected_code:
                problems.append(f"attempt {e.attempt_id} ran to its end (exit {expected_code}) "
                                f"but is {state} with exit code {code}")
    return problems


def figures(test: str, **values) -> None:
    """One ``[figures]`` line, as the failure tests print (run with -s to see it)."""
    print(f"[figures] {test}: " + json.dumps(values, sort_keys=True, default=str), flush=True)
