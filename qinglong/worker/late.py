"""Late completions: an outcome that exists is reported, even after the worker lost its lease.

A job can end on its own while its worker is frozen, cut off or killed. The outcome is real (the
wrapper's receipt holds the exit status) and the Attempt's lease token proves it is this
Attempt's, so the worker reports it through ``complete_late``; the store accepts it while no
other Attempt of the Run has been leased, and records it as late.

Before it spawns a job the worker writes the lease (``worker-lease``: the Attempt, its lease
version and its token, mode 0600 in the private Attempt directory); when it takes up a stop
request of its own (its timeout, its drain's shutdown) it writes ``worker-stop`` (the reason and
when, before its signals); once an outcome was accepted or definitely refused it writes
``worker-reported``. At start a worker looks through
its log directory for Attempt directories with a lease, a receipt of a job that exited with a
status, and no ``worker-reported``: the outcomes of the jobs its previous process did not
report. A receipt of a job ended by a signal is not reported that way: the fence keeper sends
those when the worker dies, so they say nothing about the job. A late report states the worker's
own stop request and how long ago the job exited (from the receipt's end, on this host's clock),
so the store keeps the request and dates the end as for a completion in time.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING, Any, Mapping

from qinglong.contracts.frozen import record
from qinglong.contracts.errors import StoreUnavailable
from qinglong.contracts.execution import (
    AttemptOutcome,
    AttemptState,
    CancelReason,
    Executor,
    ProcessState,
    classify_outcome,
)
from qinglong.contracts.worker import (
    OWN_STOP_REASONS,
    BadWorkerCall,
    CompletionResult,
    LeaseFence,
    LeaseFenced,
    OwnStop,
)
from qinglong.supervisor import wall_clock_ms

from .logship import log_size
from .retention import _ATTEMPT_DIR

if TYPE_CHECKING:
    from .core import WorkerCore

LEASE_FILE = "worker-lease"
REPORTED_FILE = "worker-reported"
STOP_FILE = "worker-stop"
#: Between tries of a late report the store did not answer, seconds.
LATE_RETRY_S = 1.0
#: Tries of one late report before it is left for the next start.
LATE_TRIES = 30


@record
class StoredLease:
    """What ``worker-lease`` holds."""

    run_id: str
    attempt_id: str
    attempt_no: int
    executor: str
    lease: LeaseFence


def write_lease(attempt_dir: str, run_id: str, attempt_no: int, executor: str, lease: LeaseFence) -> None:
    """Write the lease into the (private) Attempt directory before the job is spawned."""
    os.makedirs(attempt_dir, mode=0o700, exist_ok=True)
    os.chmod(attempt_dir, 0o700)
    body = json.dumps({"run_id": run_id, "attempt_id": lease.attempt_id, "attempt_no": attempt_no,
                       "executor": executor, "lease_version": lease.lease_version,
                       "token": lease.token.hex()})
    _write_private(os.path.join(attempt_dir, LEASE_FILE), body, sync=True)


def _write_private(path: str, body: str, *, sync: bool) -> None:
    """Write ``body`` to ``path`` (0600, never through a link) by a scratch file renamed over it,
    so a reader sees the old file or the new one whole."""
    scratch = f"{path}.{os.getpid()}"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, body.encode("ascii"))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(scratch, path)


def _read_private(path: str) -> Any:
    """The JSON ``path`` holds (never read through a link), or None if it cannot be read as JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return json.loads(os.read(fd, 4096).decode("ascii"))
    except ValueError:  # UnicodeDecodeError is one
        return None
    finally:
        os.close(fd)


def read_lease(attempt_dir: str) -> StoredLease | None:
    """The lease written before the spawn, or None (none, or not readable as one)."""
    data = _read_private(os.path.join(attempt_dir, LEASE_FILE))
    try:
        return StoredLease(str(data["run_id"]), str(data["attempt_id"]), int(data["attempt_no"]),
                           str(data["executor"]),
                           LeaseFence(str(data["attempt_id"]), int(data["lease_version"]),
                                      bytes.fromhex(data["token"])))
    except (ValueError, KeyError, TypeError):
        return None


@record
class StoredStop:
    """A stop request the worker took up for its job itself (what ``worker-stop`` holds)."""

    reason: CancelReason
    #: when it was taken up, epoch ms on this host's clock (the receipt's end is on the same)
    at_ms: int


def write_own_stop(attempt_dir: str, stop: StoredStop) -> None:
    """Keep the worker's own stop request beside the job's receipt, so a restarted worker reports
    it with the outcome (best effort: without it the outcome is reported without the request)."""
    try:
        _write_private(os.path.join(attempt_dir, STOP_FILE),
                       json.dumps({"reason": stop.reason.value, "at_ms": int(stop.at_ms)}), sync=False)
    except OSError:
        pass


def read_own_stop(attempt_dir: str) -> StoredStop | None:
    """The stop request ``worker-stop`` holds, or None (none, or not one a worker makes)."""
    try:
        data = _read_private(os.path.join(attempt_dir, STOP_FILE))
        reason, at_ms = CancelReason(data["reason"]), data["at_ms"]
    except (ValueError, KeyError, TypeError, OSError):
        return None
    if reason not in OWN_STOP_REASONS or not isinstance(at_ms, int) or isinstance(at_ms, bool):
        return None
    return StoredStop(reason, at_ms)


def mark_reported(attempt_dir: str) -> None:
    """Nothing more to report for this Attempt (best effort: a replay is answered already_done)."""
    try:
        fd = os.open(os.path.join(attempt_dir, REPORTED_FILE),
                     os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
    except OSError:
        pass


def reported(attempt_dir: str) -> bool:
    return os.path.lexists(os.path.join(attempt_dir, REPORTED_FILE))


def found_outcome(executor: Executor, attempt_dir: str, stop: StoredStop | None = None) -> AttemptOutcome | None:
    """The outcome a restarted worker may report for a directory: its job ended and exited with
    a status (see the module docstring), else None; classified with the worker's own stop
    request ``stop`` as the worker that took it up would have (an exit after it is the stop's)."""
    try:
        if executor.probe(attempt_dir, None) is not ProcessState.ENDED:
            return None
        receipt = executor.read_receipt(attempt_dir)
    except Exception:
        return None
    if receipt is None or receipt.exit_code is None:
        return None
    if stop is None:
        return classify_outcome(receipt, None)
    return classify_outcome(receipt, stop.reason, requested_at_ms=stop.at_ms)


async def report_late(core: "WorkerCore", run_id: str, attempt_dir: str, lease: LeaseFence,
                      outcome: AttemptOutcome, stop: StoredStop | None = None) -> bool:
    """Report ``outcome`` through ``complete_late``, with the worker's own stop request ``stop``
    and the age of the job's exit; True when the store recorded it (or had). A refusal (another
    Attempt started, or the Attempt ended otherwise) is final and reported."""
    if outcome.state is AttemptState.LOST:
        return False
    final = outcome if outcome.log_bytes is not None else AttemptOutcome(
        outcome.state, outcome.exit_code, outcome.signal, outcome.ended_at_ms, log_size(attempt_dir),
        outcome.log_dropped_bytes, outcome.reason)
    for _ in range(LATE_TRIES):
        protocol = core.protocol
        if protocol is None:
            await asyncio.sleep(LATE_RETRY_S)
            continue
        # ages on this host's clock at the call: the store dates both on its own
        now = wall_clock_ms()
        keywords: dict = {}
        if stop is not None:
            keywords["own_stop"] = OwnStop(stop.reason, max(0, now - stop.at_ms))
        if final.ended_at_ms is not None:
            keywords["exit_age_ms"] = max(0, now - final.ended_at_ms)
        try:
            reply = await protocol.complete_late(core.config.worker_id, lease, final, **keywords)
        except StoreUnavailable as exc:
            core.store_down(exc)
            await asyncio.sleep(LATE_RETRY_S)
            continue
        except (LeaseFenced, BadWorkerCall) as exc:
            mark_reported(attempt_dir)
            core.emit("warning", "worker.late_refused",
                      f"run {run_id}: its job ended {final.state.value} after this worker lost its lease, "
                      f"and the store keeps another outcome: {exc}", run_id=run_id,
                      attempt_id=lease.attempt_id, state=final.state.value, exit_code=final.exit_code)
            return False
        core.store_up()
        mark_reported(attempt_dir)
        core.stats.completed_late += 1
        if reply.result is CompletionResult.ACCEPTED:
            core.emit("warning", "worker.completed_late",
                      f"run {run_id}: its job ended {final.state.value} after this worker lost its lease; "
                      "the outcome was recorded late", run_id=run_id, attempt_id=lease.attempt_id,
                      state=final.state.value, exit_code=final.exit_code, run_state=reply.run_state.value,
                      log_bytes_stored=reply.log_bytes_stored, log_bytes=final.log_bytes)
        return True
    core.emit("warning", "worker.late_unreported",
              f"run {run_id}: its late outcome could not be reported (the store did not answer); "
              "the next start of this worker tries again", run_id=run_id, attempt_id=lease.attempt_id)
    return False


async def report_found(core: "WorkerCore", executors: Mapping[str, Executor]) -> int:
    """At start: report every outcome a previous process of this worker left unreported (see the
    module docstring); how many were recorded."""
    log_dir = core.config.log_dir
    try:
        names = sorted(os.listdir(log_dir))
    except OSError:
        return 0
    recorded = 0
    for name in names:
        if core.closing or not _ATTEMPT_DIR.match(name) or name in core.jobs:
            continue
        attempt_dir = os.path.join(log_dir, name)
        if os.path.islink(attempt_dir) or reported(attempt_dir):
            continue
        stored = read_lease(attempt_dir)
        if stored is None or stored.attempt_id != name:
            continue
        executor = executors.get(stored.executor)
        stop = read_own_stop(attempt_dir)
        outcome = found_outcome(executor, attempt_dir, stop) if executor is not None else None
        if outcome is None:
            continue
        if await report_late(core, stored.run_id, attempt_dir, stored.lease, outcome, stop):
            recorded += 1
    return recorded
