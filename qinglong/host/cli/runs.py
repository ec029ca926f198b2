"""Runs and their output: ``qinglong runs`` (list, ``show``, ``cancel``) and ``qinglong logs``.

On a store that executes Runs (edge, standalone: ``backend.execution()``) the listing shows what
each Run did: state, exit code, duration, Attempts. A store whose Runs are executed elsewhere (the
cluster, whose workers are remote) offers the same through ``backend.run_control()``
(:class:`~qinglong.contracts.execution.RunControl`), from any machine; a store with neither keeps
the admission listing of the reader. These commands never create or migrate a store, and print no
environment value of a task.

``logs`` prints an Attempt's log byte for byte (it may hold any bytes: binary output, text that is
not UTF-8): the log file where the Run executed here, the chunks the worker shipped to the store
where it executed elsewhere. A log deleted by retention is a tombstone: ``logs`` says so on stderr
and exits 3 (:class:`~qinglong.contracts.errors.NotFound`); a log cut at the task's log limit
prints what was kept and says on stderr how many bytes were dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, BinaryIO, Generator, Sequence

from qinglong.contracts.errors import ExitCode, NotFound, UserError

from .boot import container_of, execution_of, need_runs, on_backend, run_control_of, runs_of
from .output import iso, now_ms, print_json, print_table
from .parsing import add_json_flag, positive_count

#: How often ``logs --follow`` looks for new output and for the Attempt's end, in seconds.
FOLLOW_POLL_S = 0.2
#: Bytes read at a time when copying a log or looking for its last lines.
CHUNK = 64 * 1024


def _value(enum_or_text: Any) -> Any:
    return getattr(enum_or_text, "value", enum_or_text)


from ..views import attempt_json, run_summary_json as summary_json  # noqa: E402,F401 (shared with the API)


def _ms(value: int | None) -> str:
    return "-" if value is None else str(value)


def state_words(state: Any, exit_code: int | None) -> str:
    """A state as the tables show it: a Run ended by a timeout or a cancel whose job still
    exited with a code says so, so `timed_out` beside exit 0 is never left unexplained."""
    state = _value(state)
    if state in ("timed_out", "cancelled") and exit_code is not None:
        return f"{state} (exited {exit_code} after the request)"
    return state


def print_run_table(runs: Sequence[Any], notes: dict[str, str] | None = None) -> None:
    """The runs table: what each Run did (``notes``: what keeps a running Run from being stopped,
    by Run id, shown where the Run has no reason of its own)."""
    notes = notes or {}
    print_table(["run", "task", "scheduled_for", "state", "exit", "duration_ms", "attempts", "reason"],
                [[r.run_id, f"{r.project_id}/{r.task_id}", iso(r.scheduled_for_ms), state_words(r.state, r.exit_code),
                  _ms(r.exit_code), _ms(r.duration_ms), r.attempts, r.reason or notes.get(r.run_id, "")]
                 for r in runs])


async def list_runs(backend: Any, *, state: str | None, project: str | None, task: str | None,
                    trigger: str | None, limit: int) -> list[Any] | None:
    """The newest Runs with their outcome, or None when the store does not execute Runs."""
    from qinglong.contracts.execution import RunState

    store = execution_of(backend)
    if store is None:
        control = run_control_of(backend)
        if control is None:
            return None
        return list(await control.list_runs(state=RunState(state) if state else None, project_id=project,
                                            task_id=task, trigger_id=trigger, limit=limit))
    if trigger is None:
        return list(await store.list_runs(state=RunState(state) if state else None, project_id=project,
                                          task_id=task, limit=limit))
    # The execution listing has no trigger filter: take the trigger's newest Runs from the reader
    # and read each one's outcome (at most ``limit`` short reads).
    runs = []
    for view in await backend.reader().recent_runs(limit, trigger):
        run = (await store.run_detail(view.run_id)).run
        if ((state is None or _value(run.state) == state) and (project is None or run.project_id == project)
                and (task is None or run.task_id == task)):
            runs.append(run)
    return runs


def _check_filters(args: argparse.Namespace) -> None:
    """A filter no Run can match (not an identifier) is a typo, refused naming its flag rather
    than listed as "no Runs"."""
    from qinglong.contracts.store import check_identifier

    for flag, label in (("--project", "project_id"), ("--task", "task_id"), ("--trigger", "trigger_id")):
        value = getattr(args, flag[2:])
        if value is not None:
            try:
                check_identifier(label, value)
            except UserError as exc:
                raise UserError(f"{flag}: {exc}") from None


def cmd_runs(args: argparse.Namespace) -> int:
    """Recent Runs, newest first: state, exit code, duration, Attempts."""
    if args.runs_command == "show":
        return _show_run(args)
    if args.runs_command == "cancel":
        return _cancel_run(args)
    _check_filters(args)
    container = container_of(args)

    async def go(backend: Any) -> tuple[list[Any] | None, dict[str, Any], dict[str, str]]:
        runs = await list_runs(backend, state=args.state, project=args.project, task=args.task,
                               trigger=args.trigger, limit=args.limit)
        keys: dict[str, Any] = {}
        notes: dict[str, str] = {}
        if runs is not None:
            store = runs_of(backend)
            for run in runs:
                # the idempotency key, for scripts that check one Run per occurrence; and the
                # note of a running Attempt (its cancel cannot reach its process), else unseen here
                if not args.json and (run.reason or _value(run.state) not in ("dispatching", "running")):
                    continue
                detail = await store.run_detail(run.run_id)
                keys[run.run_id] = detail.idempotency_key
                current = detail.attempts[-1] if detail.attempts else None
                if (not run.reason and current is not None and current.reason
                        and _value(current.state) in ("dispatching", "running")):
                    notes[run.run_id] = current.reason
        return runs, keys, notes

    runs, keys, notes = on_backend(container, go, read_only=True)
    if runs is None:
        if args.state or args.task or args.project:
            raise UserError("--state, --task and --project need a profile that runs Runs locally; "
                            f"the {container.loaded().profile.name} profile lists admitted Runs only")
        from .read import show_runs

        return show_runs(container, limit=args.limit, trigger=args.trigger, as_json=args.json)
    if args.json:
        print_json([{**summary_json(r), "idempotency_key": keys.get(r.run_id),
                     **({"reason": notes[r.run_id]} if r.run_id in notes else {})} for r in runs])
    else:
        print_run_table(runs, notes)
    return ExitCode.OK


def _outcome(a: Any) -> str:
    if a.exit_code is not None:
        return f"exit {a.exit_code}"
    if a.signal is not None:
        return f"signal {a.signal}"
    return "-"


def _attempt_reason(a: Any) -> str:
    """The Attempt's reason, and its cancel request: said to have come after the job's end when
    the job's own exit is the outcome (``succeeded`` beside a bare "cancel requested" reads as if
    the cancel had been ignored), also beside a reason of the Attempt's own (what the helpers the
    job left did), which would otherwise hide it. A ``timed_out`` or ``cancelled`` reason already
    names its request."""
    if not a.cancel_reason:
        return a.reason or ""
    if _value(a.state) in ("succeeded", "failed"):
        after = f"cancel requested ({_value(a.cancel_reason)}) after the job had ended: its own exit is the outcome"
        return f"{a.reason}; {after}" if a.reason else after
    return a.reason or f"cancel requested: {_value(a.cancel_reason)}"


def _show_run(args: argparse.Namespace) -> int:
    container = container_of(args)

    async def go(backend: Any) -> Any:
        return await need_runs(backend, container, "runs show").run_detail(args.run_id)

    detail = on_backend(container, go, read_only=True)
    run = detail.run
    if args.json:
        from ..views import run_detail_json

        print_json(run_detail_json(detail))
        return ExitCode.OK
    print(f"run {run.run_id}: {state_words(run.state, run.exit_code)}"
          + (f" (exit {run.exit_code})" if run.exit_code is not None else "")
          + (f": {run.reason}" if run.reason else ""))
    print(f"task {run.project_id}/{run.task_id} revision {detail.task_revision}, "
          f"trigger {run.trigger_id or '-'}, idempotency key {detail.idempotency_key}")
    jitter = (f" (its occurrence {iso(run.scheduled_for_ms - detail.jitter_ms)} plus a jitter of "
              f"{detail.jitter_ms} ms)" if detail.jitter_ms else "")
    print(f"scheduled for {iso(run.scheduled_for_ms)}{jitter}, admitted at {iso(run.admitted_at_ms)}, "
          f"finished at {iso(run.finished_at_ms)}, duration {_ms(run.duration_ms)} ms")
    # the worker column only where a remote worker held an Attempt (the cluster)
    workers = any(getattr(a, "worker_id", None) for a in detail.attempts)
    print_table(["attempt", "state", "outcome", "started", "ended", "duration_ms", "log_bytes", "dropped",
                 "log", "reason"] + (["worker"] if workers else []),
                [[a.attempt_no, state_words(a.state, a.exit_code), _outcome(a), iso(a.started_at_ms), iso(a.finished_at_ms),
                  _ms(a.duration_ms), _ms(a.log_bytes), a.log_dropped_bytes,
                  "deleted" if a.log_deleted else ("kept" if a.attempt_dir or workers and a.log_bytes else "-"),
                  _attempt_reason(a)]
                 + ([getattr(a, "worker_id", None) or "-"] if workers else [])
                 for a in detail.attempts])
    return ExitCode.OK


def _cancel_run(args: argparse.Namespace) -> int:
    from qinglong.contracts.execution import Actor, CancelReason

    container = container_of(args)

    async def go(backend: Any) -> tuple[Any, Any, bool]:
        store = execution_of(backend)
        if store is None:
            # executed elsewhere: the request is durable in the store, its worker reads it
            control = need_runs(backend, container, "runs cancel")
            before = (await control.run_detail(args.run_id)).run.state
            return before, await control.request_cancel(args.run_id, CancelReason.OPERATOR), True
        before = (await store.run_detail(args.run_id)).run.state
        after = await store.request_cancel(args.run_id, CancelReason.OPERATOR, now_ms(), Actor.OPERATOR)
        return before, after, False

    before, after, remote = on_backend(container, go, create=False)
    before, after = _value(before), _value(after)
    if args.json:
        from ..views import cancel_json

        print_json(cancel_json(args.run_id, before, after))
    elif before == after and after in ("succeeded", "failed", "timed_out", "cancelled", "lost"):
        print(f"run {args.run_id} had already ended: {after}; nothing to cancel")
    elif after == "cancelled":
        print(f"run {args.run_id}: cancelled (it was {before})")
    elif remote:
        print(f"run {args.run_id}: {after}, cancel requested; the worker running it stops it when "
              "its next heartbeat reads the request (`qinglong runs show` tells when it ended)")
    else:
        print(f"run {args.run_id}: {after}, cancel requested; its process is being stopped "
              "(`qinglong runs show` tells when it ended)")
    return ExitCode.OK


# --------------------------------------------------------------------------- logs


def _tail_search(size: int, lines: int) -> Generator[tuple[int, int], bytes, int]:
    """Where the last ``lines`` lines of a log of ``size`` bytes start (a final newline ends the
    last line; it does not start an empty one). A generator: it yields ``(offset, n)`` for each
    read it needs and is sent those bytes, so one search serves a file and a store alike."""
    end = size
    if size and (yield (size - 1, 1)) == b"\n":
        end = size - 1
    pos, found = end, 0
    while pos > 0:
        start = max(0, pos - CHUNK)
        block = yield (start, pos - start)
        index = len(block)
        while True:
            index = block.rfind(b"\n", 0, index)
            if index < 0:
                break
            found += 1
            if found == lines:
                return start + index + 1
        pos = start
    return 0


def tail_offset(f: BinaryIO, size: int, lines: int) -> int:
    """:func:`_tail_search` over a file."""
    search = _tail_search(size, lines)
    try:
        offset, n = next(search)
        while True:
            f.seek(offset)
            offset, n = search.send(f.read(n))
    except StopIteration as done:
        return done.value



def _copy(f: BinaryIO, offset: int, out: BinaryIO) -> int:
    """Write the file's bytes from ``offset`` to its current end; the new offset."""
    f.seek(offset)
    while True:
        block = f.read(CHUNK)
        if not block:
            break
        out.write(block)
        offset += len(block)
    out.flush()
    return offset


def _note(text: str) -> None:
    sys.stderr.write(f"qinglong: note: {text}\n")
    sys.stderr.flush()


def _pick_attempt(detail: Any, number: int | None) -> Any:
    if not detail.attempts:
        raise NotFound(f"run {detail.run.run_id} has no attempt")
    if number is None:
        return max(detail.attempts, key=lambda a: a.attempt_no)
    for attempt in detail.attempts:
        if attempt.attempt_no == number:
            return attempt
    raise NotFound(f"run {detail.run.run_id} has no attempt {number} (it has "
                   f"{', '.join(str(a.attempt_no) for a in detail.attempts)})")


def _tombstone(run_id: str, attempt: Any, settings: str = "log_retention_days, min_free_bytes") -> NotFound:
    return NotFound(f"the log of run {run_id} attempt {attempt.attempt_no} was deleted by log retention "
                    f"([execution] {settings}); it held {_ms(attempt.log_bytes)} bytes")


async def _print_log(store: Any, run_id: str, number: int | None, tail: int | None, follow: bool,
                     out: BinaryIO) -> None:
    from qinglong.contracts.execution import AttemptState

    detail = await store.run_detail(run_id)
    attempt = _pick_attempt(detail, number)
    number = attempt.attempt_no
    offset: int | None = None
    f: BinaryIO | None = None
    try:
        while True:
            if attempt.log_deleted:
                raise _tombstone(run_id, attempt)
            ended = AttemptState(_value(attempt.state)).terminal
            if f is None and attempt.attempt_dir:
                try:
                    f = open(os.path.join(attempt.attempt_dir, "log"), "rb")
                except FileNotFoundError:
                    f = None
            if f is not None:
                # An end seen before this read means the log is complete once read to its end: the
                # waiter wrote its receipt after the job's last byte.
                ended = ended or os.path.exists(os.path.join(attempt.attempt_dir, "receipt"))
                if offset is None:
                    size = os.fstat(f.fileno()).st_size
                    offset = tail_offset(f, size, tail) if tail is not None else 0
                offset = _copy(f, offset, out)
            if not follow or ended:
                break
            await asyncio.sleep(FOLLOW_POLL_S)
            attempt = _pick_attempt(await store.run_detail(run_id), number)
    finally:
        if f is not None:
            f.close()
    if f is None:
        state = getattr(attempt.state, "value", attempt.state)
        _note(f"run {run_id} attempt {number} has no log ({state}"
              + (f": {attempt.reason}" if attempt.reason else "") + ")")
    if attempt.log_dropped_bytes:
        _note(f"the log of run {run_id} attempt {number} stopped at the task's log limit: "
              f"{attempt.log_dropped_bytes} more bytes of output were dropped")


async def stored_tail_offset(read: Any, size: int, lines: int) -> int:
    """:func:`_tail_search` over a log held by a store: ``await read(offset, n)`` returns its
    ``n`` bytes from ``offset`` (all of them: the range lies within the ``size`` bytes stored)."""
    search = _tail_search(size, lines)
    try:
        offset, n = next(search)
        while True:
            offset, n = search.send(await read(offset, n))
    except StopIteration as done:
        return done.value


async def _print_stored_log(control: Any, run_id: str, number: int | None, tail: int | None,
                            follow: bool, out: BinaryIO) -> None:
    """The log a remote worker shipped to the store, from ``control``
    (:class:`~qinglong.contracts.execution.RunControl`). ``--follow`` polls for new bytes and
    stops once it has printed everything of an Attempt that ended: the state and the stored size
    are read together, and nothing is appended after the end."""
    from qinglong.contracts.execution import AttemptState

    attempt = _pick_attempt(await control.run_detail(run_id), number)
    number = attempt.attempt_no

    async def read(offset: int, size: int) -> bytes:
        return await control.read_log(attempt.attempt_id, offset, size)

    offset: int | None = None
    while True:
        stored = await control.log_state(attempt.attempt_id)
        if stored.deleted:
            raise _tombstone(run_id, attempt, "log_retention_days")
        if offset is None:
            offset = await stored_tail_offset(read, stored.stored_bytes, tail) if tail is not None else 0
        while offset < stored.stored_bytes:
            block = await read(offset, min(CHUNK * 4, stored.stored_bytes - offset))
            if not block:
                break
            out.write(block)
            offset += len(block)
        out.flush()
        if not follow or AttemptState(_value(stored.state)).terminal:
            break
        await asyncio.sleep(FOLLOW_POLL_S)
    if stored.stored_bytes == 0:
        attempt = _pick_attempt(await control.run_detail(run_id), number)
        if attempt.started_at_ms is None:
            _note(f"run {run_id} attempt {number} has no log ({_value(attempt.state)}"
                  + (f": {attempt.reason}" if attempt.reason else "") + ")")
    if stored.dropped_bytes:
        _note(f"the log of run {run_id} attempt {number} stopped at the task's log limit: "
              f"{stored.dropped_bytes} more bytes of output were dropped")


def cmd_logs(args: argparse.Namespace) -> int:
    """Print an Attempt's log as it is; ``--follow`` until the Attempt ends."""
    container = container_of(args)
    sys.stdout.flush()

    async def go(backend: Any) -> None:
        store = execution_of(backend)
        if store is None or getattr(backend, "remote", False):  # a store's log, or the API's
            control = need_runs(backend, container, "logs")
            await _print_stored_log(control, args.run_id, args.attempt, args.tail, args.follow,
                                    sys.stdout.buffer)
            return
        await _print_log(store, args.run_id, args.attempt, args.tail, args.follow, sys.stdout.buffer)

    on_backend(container, go, read_only=True)
    return ExitCode.OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``runs`` (with ``show`` and ``cancel``) and ``logs``."""
    from qinglong.contracts.execution import RunState

    p = sub.add_parser("runs", parents=[common], help="recent Runs, newest first: state, exit code, duration",
                       description="Recent Runs, newest first: state, exit code, duration and attempts. "
                                   "`runs show RUN` shows one with its attempts; `runs cancel RUN` cancels it.")
    p.set_defaults(func=cmd_runs, runs_command=None)
    p.add_argument("--limit", type=positive_count, default=20, help="Runs to show (default 20)")
    p.add_argument("--state", choices=[s.value for s in RunState], default=None, help="only Runs in this state")
    p.add_argument("--project", default=None, help="only this project's Runs")
    p.add_argument("--task", default=None, help="only this task's Runs")
    p.add_argument("--trigger", default=None, help="only this trigger's Runs")
    add_json_flag(p)
    runs_sub = p.add_subparsers(dest="runs_command", metavar="SUBCOMMAND")
    show = runs_sub.add_parser("show", parents=[common], help="one Run and each of its attempts",
                               description="One Run and each of its attempts: state, exit code or signal, "
                                           "start, end, duration, log size, dropped bytes, reason.")
    show.add_argument("run_id", metavar="RUN")
    add_json_flag(show)
    cancel = runs_sub.add_parser("cancel", parents=[common], help="cancel a Run (its process is stopped)",
                                 description="Cancel a Run: a queued one ends cancelled at once; a running "
                                             "one's process is sent TERM, then KILL after the grace.")
    cancel.add_argument("run_id", metavar="RUN")
    add_json_flag(cancel)

    p = sub.add_parser("logs", parents=[common], help="print a Run's output (an attempt's log), --follow",
                       description="Print an attempt's log exactly as the job wrote it (default: the last "
                                   "attempt). A log deleted by retention exits 3; dropped bytes are "
                                   "reported on stderr.")
    p.set_defaults(func=cmd_logs)
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--attempt", type=positive_count, default=None, metavar="N", help="attempt N (default the last)")
    p.add_argument("--tail", type=positive_count, default=None, metavar="N", help="only the last N lines")
    p.add_argument("--follow", action="store_true", help="keep printing new output until the attempt ends")


async def a_run_has_ended(backend: Any, *, project: str, task: str, limit: int) -> bool:
    """Whether one of the task's newest ``limit`` Runs has ended (True when the store does not
    execute Runs: there is nothing to wait for)."""
    from qinglong.contracts.execution import TERMINAL_RUN_STATES, RunState

    store = execution_of(backend)
    if store is None:
        return True
    runs = await store.list_runs(project_id=project, task_id=task, limit=limit)
    return any(RunState(_value(r.state)) in TERMINAL_RUN_STATES for r in runs)


def show_demo_runs(container: Any, *, project: str, task: str, trigger: str, limit: int) -> int:
    """What ``qinglong demo`` prints after its run: the task's Runs with their exit codes, then the
    output of the newest Run that ended. A store that does not execute Runs lists its admissions."""
    from qinglong.contracts.execution import TERMINAL_RUN_STATES, RunState

    async def go(backend: Any) -> tuple[list[Any] | None, Any, bytes | None]:
        store = execution_of(backend)
        if store is None:
            return None, None, None
        runs = list(await store.list_runs(project_id=project, task_id=task, limit=limit))
        ended = next((r for r in runs if RunState(_value(r.state)) in TERMINAL_RUN_STATES), None)
        if ended is None:
            return runs, None, None
        detail = await store.run_detail(ended.run_id)
        last = max(detail.attempts, key=lambda a: a.attempt_no)
        output = None
        if last.attempt_dir and not last.log_deleted:
            try:
                with open(os.path.join(last.attempt_dir, "log"), "rb") as f:
                    output = f.read(CHUNK)
            except FileNotFoundError:
                output = None
        return runs, ended, output

    runs, ended, output = on_backend(container, go, read_only=True)
    if runs is None:
        from .read import show_runs

        return show_runs(container, limit=limit, trigger=trigger, as_json=False)
    print_run_table(runs)
    if ended is None:
        print("no Run has ended yet; `qinglong runs` shows them as they do")
        return ExitCode.OK
    print(f"\noutput of run {ended.run_id} (`qinglong logs {ended.run_id}`):")
    sys.stdout.flush()
    sys.stdout.buffer.write(output or b"")
    sys.stdout.buffer.flush()
    return ExitCode.OK
