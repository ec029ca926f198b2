"""``[worker]`` checked once at start, in words naming the key: what the runtime works with."""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from qinglong.contracts.frozen import record
from qinglong.contracts.errors import SettingsError
from qinglong.contracts.worker import (
    LABEL_PATTERN,
    MAX_LABELS,
    MAX_SESSION_CAPACITY,
    MAX_WORKER_ID_CHARS,
    check_worker_timing,
)

#: Where Attempt directories go without ``[worker] log_dir`` (relative to the working directory).
DEFAULT_LOG_DIR = "qinglong-worker-logs"


@record(slots=False)
class WorkerConfig:
    """The ``[worker]`` values, validated (the DSN stays in the settings: it is a secret)."""

    worker_id: str
    labels: tuple[str, ...]
    max_running: int
    session_lease_ms: int
    heartbeat_ms: int
    self_fence_margin_ms: int
    kill_grace_ms: int
    poll_ms: int
    log_dir: str
    drain_timeout_ms: int
    log_retention_days: float
    orphans: str = "kill"
    orphan_drain_ms: int = 2_000
    #: the gateway's address (None: the direct path, ``[worker] dsn``)
    url: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    claim_wait_ms: int = 0
    #: ``(user, uid, gid, home)`` jobs run as, or None
    run_as: tuple[str, int, int, str] | None = None

    @property
    def application_name(self) -> str:
        """What the store's session list shows for this worker (63 bytes at most)."""
        return f"qinglong worker {self.worker_id}"[:63]


def worker_config(worker: Any, *, hostname: str | None = None) -> WorkerConfig:
    """``[worker]`` checked: the timing can hold the fence, ``max_running`` fits a session, ``dsn``
    is set, labels and the worker id are well formed. A refusal is a :class:`SettingsError`
    naming the key and what was expected. ``worker`` is the settings section, read by attribute
    (this package never imports the host, whose settings model defines it)."""
    problem = check_worker_timing(worker.session_lease_ms, worker.heartbeat_ms, worker.self_fence_margin_ms,
                                  worker.kill_grace_ms)
    if problem is not None:
        raise SettingsError(f"[worker] timing: {problem}")
    if worker.max_running > MAX_SESSION_CAPACITY:
        raise SettingsError(f"[worker] max_running: expected at most {MAX_SESSION_CAPACITY} "
                            f"(the most Attempts one session holds), got {worker.max_running}")
    dsn = worker.dsn.get_secret_value() if worker.dsn is not None else ""
    url = getattr(worker, "url", None)
    if url and dsn.strip():
        raise SettingsError("[worker] url and [worker] dsn: set one, not both (url: the API tier's gateway; "
                            "dsn: the direct path to the database)")
    if url and not getattr(worker, "token_file", None):
        raise SettingsError("[worker] token_file is required with [worker] url: the file holding the token "
                            "`qinglong worker register` printed (mode 0600)")
    if not url and not dsn.strip():
        raise SettingsError("[worker] url is required: the API tier's address, with [worker] token_file "
                            "(or, on the direct path, [worker] dsn: the gateway role's connection "
                            "string, also as QINGLONG_WORKER__DSN)")
    worker_id = worker.worker_id or hostname or socket.gethostname()
    if (not worker_id or len(worker_id) > MAX_WORKER_ID_CHARS
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in worker_id)):
        raise SettingsError(f"[worker] worker_id: expected 1-{MAX_WORKER_ID_CHARS} characters without "
                            "control characters")
    labels = list(worker.labels)
    if len(labels) > MAX_LABELS:
        raise SettingsError(f"[worker] labels: expected at most {MAX_LABELS} labels, got {len(labels)}")
    for label in labels:
        if not re.match(LABEL_PATTERN, label):
            raise SettingsError(f"[worker] labels: {label!r} is not a label (1-64 characters of letters, "
                                "digits and _ . : = / -)")
    run_as = None
    if getattr(worker, "run_as", None):
        import pwd

        try:
            entry = pwd.getpwnam(worker.run_as)
        except KeyError:
            raise SettingsError(f"[worker] run_as: no such user {worker.run_as!r} on this machine") from None
        if os.geteuid() != 0:
            raise SettingsError(f"[worker] run_as: running jobs as {worker.run_as!r} needs the worker to run as "
                                "root (it drops to that user for each job, and signals it)")
        if entry.pw_uid == 0:
            raise SettingsError("[worker] run_as: expected a user other than root (the point is that a job "
                                "cannot read the worker's token)")
        home = entry.pw_dir if entry.pw_dir and os.path.isdir(entry.pw_dir) else "/"
        run_as = (entry.pw_name, entry.pw_uid, entry.pw_gid, home)
    return WorkerConfig(
        worker_id=worker_id,
        labels=tuple(sorted(set(labels))),
        max_running=worker.max_running,
        session_lease_ms=worker.session_lease_ms,
        heartbeat_ms=worker.heartbeat_ms,
        self_fence_margin_ms=worker.self_fence_margin_ms,
        kill_grace_ms=worker.kill_grace_ms,
        poll_ms=worker.poll_ms,
        log_dir=os.path.abspath(worker.log_dir or DEFAULT_LOG_DIR),
        drain_timeout_ms=worker.drain_timeout_ms,
        log_retention_days=worker.log_retention_days,
        orphans=worker.orphans,
        orphan_drain_ms=worker.orphan_drain_ms,
        url=url or None,
        token_file=os.path.abspath(worker.token_file) if url else None,
        ca_file=getattr(worker, "ca_file", None),
        claim_wait_ms=getattr(worker, "claim_wait_ms", 0) if url else 0,
        run_as=run_as,
    )
