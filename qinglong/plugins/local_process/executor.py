"""The ``local_process`` executor: start an Attempt's job under the shell wrapper and watch it.

Everything after :meth:`LocalProcessExecutor.start` works from the Attempt directory and the
handle alone (see :mod:`.wrapper` for the directory's files), so a control plane restarted after
a crash probes, waits for, reads and signals a job an earlier one started.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import subprocess
import time
from typing import Mapping

from qinglong.contracts.execution import (
    EVENT_FILE_ENV,
    ExecutorContext,
    ProcessHandle,
    ProcessState,
    Receipt,
    StartError,
    StartRequest,
    job_environment,
    minimal_environment,
)

from . import procfs
from .wrapper import (FENCE, LEGACY_EXITED, LEGACY_FIFO, LEGACY_LOCK, LOG, PID, RECEIPT, WrapperToolMissing,
                      find_tools, wrapper_argv, wrapper_script)

#: How often :meth:`LocalProcessExecutor.wait` looks at the lock when it cannot be told of the
#: wrapper's exit (a kernel without pidfd), and how often it re-checks even when it can.
POLL_SECONDS = 0.2
PIDFD_RECHECK_SECONDS = 1.0
#: How long start() waits for the wrapper's pid file (written first thing) before returning.
PID_WAIT_SECONDS = 5.0
#: How long start() retries a lock that a concurrent probe holds for an instant.
LOCK_RETRY_SECONDS = 0.05


def _coarse_clock_slack_ms() -> int:
    """One tick of the coarse clock that stamps file times (Linux's CLOCK_REALTIME_COARSE, id 5),
    rounded up, plus a millisecond for the truncation of the stamp to milliseconds."""
    try:
        tick = time.clock_getres(getattr(time, "CLOCK_REALTIME_COARSE", 5))
    except OSError:
        tick = 0.01  # a kernel of 100 Hz, the coarsest Linux ships
    return int(-(-tick * 1000 // 1)) + 1


_COARSE_CLOCK_SLACK_MS = _coarse_clock_slack_ms()


class LocalProcessExecutor:
    """Starts and watches the local processes of Attempts (one instance per ``qinglong run``)."""

    name = "local_process"

    def __init__(self, context: ExecutorContext, tools: Mapping[str, str] | None = None) -> None:
        """``tools``: absolute paths of ``sh``, ``dd`` and ``wc`` (default: found on
        the minimal PATH), e.g. to run the wrapper under busybox."""
        self._context = context
        self._tools = dict(tools) if tools is not None else find_tools()
        self._script = wrapper_script(self._tools)
        self._boot_id = procfs.boot_id()
        # run_as: the job's own process drops to that user (setpriv, util-linux); the wrapper,
        # which watches, logs and signals it, stays ours
        self._drop: list[str] = []
        if context.run_as is not None:
            import shutil

            setpriv = shutil.which("setpriv", path=minimal_environment(None)["PATH"])
            if setpriv is None:
                raise WrapperToolMissing("local_process needs 'setpriv' (util-linux) to run jobs as another user")
            uid, gid = context.run_as
            self._drop = [setpriv, f"--reuid={int(uid)}", f"--regid={int(gid)}", "--init-groups", "--"]
        # wrappers we spawned and have not reaped yet: reaped by wait(), or by the next start()
        self._children: dict[int, subprocess.Popen] = {}

    @property
    def kill_grace_ms(self) -> int:
        return self._context.kill_grace_ms

    # ---------------------------------------------------------------------------------- start

    async def start(self, request: StartRequest) -> ProcessHandle:
        """Check the program and the working directory, then spawn the wrapper detached (its own
        session and process group) holding the Attempt's lock; return its verified handle.

        :raises StartError: the program is missing or not executable, the working directory is
            missing, or the Attempt directory already shows a start; nothing was spawned.
        """
        self._reap_finished()
        spec = request.spec
        env = job_environment(self._context.base_env, request)
        # without a working_dir: the control plane's HOME (never a task's env value, which an
        # error message would otherwise have to show)
        cwd = spec.working_dir or self._context.base_env.get("HOME") or "/"
        _check_working_dir(cwd)
        program = _resolve_program(spec.command[0], env.get("PATH", ""), cwd,
                                   path_is_the_tasks="PATH" in spec.env)
        attempt_dir = os.path.abspath(request.attempt_dir)
        _make_private_dir(attempt_dir)
        _refuse_a_second_start(attempt_dir)
        try:
            if request.event_payload is not None:
                env[EVENT_FILE_ENV] = _write_event_file(attempt_dir, request.event_payload)
            if request.fence_deadline_mono is not None:
                self.renew_fence(attempt_dir, request.fence_deadline_mono)
        except OSError as exc:
            # a full or read-only log filesystem: the job cannot start, said as a start error
            # (an executor error would put the Attempt back and try it again every pass)
            raise StartError(_cannot_write(attempt_dir, exc)) from None
        lock_fd = _open_lock(attempt_dir)
        read_end = write_end = -1
        try:
            _take_lock(lock_fd, attempt_dir)
            _refuse_a_second_start(attempt_dir)  # checked again under the lock
            read_end, write_end = os.pipe()  # the job's output: no file to create
            argv = wrapper_argv(self._tools, self._script, attempt_dir, spec.log_limit_bytes,
                                [*self._drop, program, *spec.command[1:]],
                                pipe_inode=os.fstat(read_end).st_ino,
                                drain_ms=self._context.orphan_drain_ms, orphans=self._context.orphans)
            try:
                proc = subprocess.Popen(argv, stdin=lock_fd, stdout=write_end, stderr=read_end,
                                        cwd=cwd, env=env, start_new_session=True, close_fds=True)
            except OSError as exc:
                raise StartError(f"could not start {spec.command[0]!r}: "
                                 f"{exc.strerror or exc}") from None
        finally:
            # the wrapper holds the lock now (its stdin, then fd 9); ours is closed only after
            # the spawn, so the lock was never free between the check and the start
            os.close(lock_fd)
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)
        self._children[proc.pid] = proc
        stat = procfs.read_stat(proc.pid)  # our unreaped child: readable even if it exited
        # None only if something else in this process reaped our child (a waitpid(-1)): it has
        # ended; a start time of -1 matches no process, so the handle is never signalled
        start_ticks = stat.start_ticks if stat is not None else -1
        await self._until_the_job_starts(proc, attempt_dir)
        return ProcessHandle(self._boot_id, proc.pid, proc.pid, start_ticks)

    async def _until_the_job_starts(self, proc: subprocess.Popen, attempt_dir: str) -> None:
        """Until the wrapper wrote its pid file (it then starts the job): a wrapper that exited
        without it never started the job, and that is a start error, said here, not an Attempt
        lost later for want of a receipt. Bounded: a wrapper still silent after
        PID_WAIT_SECONDS is returned as started (the probe and the reconciler settle it)."""
        deadline = time.monotonic() + PID_WAIT_SECONDS
        delay = 0.0005
        while _read_pid(attempt_dir) is None:
            status = proc.poll()
            if status is not None:
                if _read_pid(attempt_dir) is not None:
                    return
                self._children.pop(proc.pid, None)
                raise StartError(_why_no_start(attempt_dir, status))
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def renew_fence(self, attempt_dir: str, deadline_mono: float) -> None:
        """Write the Attempt's ``fence``: ``deadline_mono`` as an instant of ``/proc/uptime`` in
        centiseconds (rounded down: never later than asked), by renaming a new file over it."""
        with open("/proc/uptime", "rb") as f:
            uptime_s = float(f.read().split()[0])
        at_cs = int((uptime_s + (deadline_mono - time.monotonic())) * 100)
        path = os.path.join(attempt_dir, FENCE)
        scratch = f"{path}.{os.getpid()}"
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{max(at_cs, 0)}\n".encode())
        finally:
            os.close(fd)
        os.replace(scratch, path)

    # ---------------------------------------------------------------------------------- probe

    def probe(self, attempt_dir: str, handle: ProcessHandle | None) -> ProcessState:
        """Lock held: ALIVE. Lock free with a receipt or a pid file: ENDED (a pid file without a
        receipt means the wrapper died before the job's end was recorded). Nothing, or a pid file
        the wrapper did not finish writing (it died before starting the job): NEVER_STARTED."""
        if _lock_held(attempt_dir):
            return ProcessState.ALIVE
        if os.path.lexists(os.path.join(attempt_dir, RECEIPT)) or _read_pid(attempt_dir) is not None:
            return ProcessState.ENDED
        return ProcessState.NEVER_STARTED

    def find_handle(self, attempt_dir: str) -> ProcessHandle | None:
        """The handle of the live wrapper of ``attempt_dir`` from its pid file, verified: the
        lock is still held after the process was read, so the pid still names that wrapper.
        None when no wrapper is alive, or when the one alive has not written its pid file yet
        (it does so first thing: ask again a moment later). Never blocks."""
        pid = _read_pid(attempt_dir)
        if pid is None:
            return None
        stat = procfs.read_stat(pid)
        if stat is None or stat.pgrp != pid or stat.session != pid:
            return None
        if not _lock_held(attempt_dir):
            return None
        return ProcessHandle(self._boot_id, pid, pid, stat.start_ticks)

    def draining(self, attempt_dir: str) -> bool:
        """The job's own process has exited and its wrapper is still within its bounded drain
        (for ``orphans = "kill"`` the drain, the TERM and a second drain), so the Attempt ends by
        itself, what the job left handled by the orphans policy. False once that bound (plus a
        second for the wrapper's own work) has passed: a wrapper still there is then stopped as
        any job is."""
        ended_ns = _job_ended_ns(attempt_dir, "3") or _job_ended_ns(attempt_dir, "2")
        if ended_ns is None:
            return False
        bound_ms = 2 * self._context.orphan_drain_ms + 1_000
        return time.time_ns() < ended_ns + bound_ms * 1_000_000

    # ----------------------------------------------------------------------------------- wait

    async def wait(self, attempt_dir: str, handle: ProcessHandle) -> None:
        """Return once the Attempt's lock is free (its wrapper ended, receipt written if it
        could). Works for a wrapper an earlier control plane started; where the kernel offers a
        pidfd the wrapper's exit wakes us at once, otherwise the lock is polled."""
        pidfd = None
        try:
            if _lock_held(attempt_dir):
                pidfd = self._open_pidfd(handle)
                while _lock_held(attempt_dir):
                    if pidfd is not None:
                        if await _readable(pidfd, PIDFD_RECHECK_SECONDS):
                            # it exited: the lock is free now; poll if it is not (never seen)
                            os.close(pidfd)
                            pidfd = None
                    else:
                        await asyncio.sleep(POLL_SECONDS)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        await self._reap(handle.pid)

    def _open_pidfd(self, handle: ProcessHandle) -> int | None:
        if not hasattr(os, "pidfd_open") or not self._verified(handle):
            return None
        try:
            fd = os.pidfd_open(handle.pid)
        except OSError:
            return None
        if not self._verified(handle):  # the pid was reused before the open: not ours
            os.close(fd)
            return None
        return fd

    def _verified(self, handle: ProcessHandle) -> bool:
        stat = procfs.read_stat(handle.pid)
        return (handle.boot_id == self._boot_id and stat is not None
                and stat.start_ticks == handle.start_ticks)

    async def _reap(self, pid: int) -> None:
        """Reap our own wrapper (it is exiting: its lock is free) so no zombie stays behind."""
        proc = self._children.get(pid)
        if proc is None:
            return
        for _ in range(400):
            if proc.poll() is not None:
                self._children.pop(pid, None)
                return
            await asyncio.sleep(0.005)
        # still not exited (it should have): the next start() sweeps it

    def _reap_finished(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                self._children.pop(pid, None)

    # -------------------------------------------------------------------------------- receipt

    def read_receipt(self, attempt_dir: str) -> Receipt | None:
        """The wrapper's receipt, or None if it never wrote one, did not finish writing it (a
        receipt is complete once its last line, ``end``, is there), or it cannot be read as one.

        The shell reports a job killed by signal N as status 128 + N, so a status of 129 to 192
        is recorded as that signal (a program exiting with such a code on its own is
        indistinguishable from it).

        A wrapper that could not write the receipt (its filesystem full) appended the same block
        to its pid file: that one is read then, and the note says so."""
        fields, stat = _read_receipt_block(os.path.join(attempt_dir, RECEIPT))
        spilled = fields is None
        if spilled:
            fields, stat = _spilled_receipt(attempt_dir)
        if fields is None or stat is None:
            return None
        try:
            status = int(fields["status"])
        except (KeyError, ValueError):
            return None
        if not 0 <= status <= 255:
            return None
        try:
            dropped = int(fields.get("dropped", "") or 0)
        except ValueError:
            dropped = 0
        if 128 < status <= 128 + 64:
            exit_code, signal = None, status - 128
        else:
            exit_code, signal = status, None
        try:
            log_bytes = os.stat(os.path.join(attempt_dir, LOG)).st_size
        except FileNotFoundError:
            log_bytes = 0
        ended_ns = min(stat.st_mtime_ns, _job_ended_ns(attempt_dir, fields.get("format")) or stat.st_mtime_ns)
        note = _held_note(fields, attempt_dir, self._context.orphan_drain_ms)
        if spilled:
            note = "; ".join(filter(None, [_spilled_note(attempt_dir), note]))
        return Receipt(exit_code, signal, ended_ns // 1_000_000, log_bytes, max(dropped, 0), note,
                       ended_slack_ms=_COARSE_CLOCK_SLACK_MS)

    # --------------------------------------------------------------------------------- signal

    def signal(self, handle: ProcessHandle, signum: int) -> bool:
        """``killpg(handle.pgid, signum)`` only if the handle still names our process group:
        same boot, and the leader either has the handle's start time or is gone (its group id
        cannot be reused while a member lives). False, with nothing sent, otherwise."""
        if handle.boot_id != self._boot_id or handle.pgid != handle.pid:
            return False
        stat = procfs.read_stat(handle.pid)
        if stat is not None and (stat.start_ticks != handle.start_ticks or stat.pgrp != handle.pgid):
            return False  # the pid now names another process: never signal it
        if stat is None and not procfs.group_members(handle.pgid):
            return False  # leader and group gone (zombies at most): nothing of ours to signal
        try:
            os.killpg(handle.pgid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True


# ------------------------------------------------------------------------------------ helpers


def _why_no_start(attempt_dir: str, status: int) -> str:
    """Why a wrapper exited before writing its pid file: what a write to the Attempt directory
    fails with now (a full or read-only log filesystem), else its exit status."""
    probe = os.path.join(attempt_dir, "write-check")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"0123456789\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return _cannot_write(attempt_dir, exc)
    return (f"the job wrapper exited with status {status} before starting the job (it could not "
            f"write its pid file in {attempt_dir!r})")



def _cannot_write(attempt_dir: str, exc: OSError) -> str:
    """Why a file of the Attempt directory could not be written, in words."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the log filesystem (writing in {attempt_dir!r})"
    if exc.errno == errno.EROFS:
        return f"the log filesystem is read-only (writing in {attempt_dir!r})"
    return f"the attempt directory {attempt_dir!r} cannot be written: {exc.strerror or exc}"


def _read_receipt_block(path: str) -> tuple[Mapping[str, str] | None, os.stat_result | None]:
    """The fields of the receipt at ``path`` (None when missing or not written to its end), and
    the file's stat."""
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            text = f.read(4096).decode("ascii", "replace")
    except FileNotFoundError:
        return None, None
    return _receipt_fields(text), stat


def _spilled_receipt(attempt_dir: str) -> tuple[Mapping[str, str] | None, os.stat_result | None]:
    """The receipt block a wrapper appended to its pid file after the pid and status lines,
    because the receipt file could not be written; None when there is none (or not whole)."""
    try:
        with open(os.path.join(attempt_dir, PID), "rb") as f:
            stat = os.fstat(f.fileno())
            text = f.read(4096).decode("ascii", "replace")
    except FileNotFoundError:
        return None, None
    lines = text.split("\n")
    if len(lines) < 3 or not lines[2].startswith("format="):
        return None, None
    return _receipt_fields("\n".join(lines[2:])), stat


def _spilled_note(attempt_dir: str) -> str:
    """Why the receipt was read from the pid file, in words: the filesystem is full now, or was."""
    try:
        st = os.statvfs(attempt_dir)
        full = st.f_bavail * st.f_frsize < 4096
    except OSError:
        full = False
    where = ("no space left on the log filesystem" if full
             else "the receipt file could not be written (the log filesystem was full or failing)")
    return f"{where}: the job's receipt was kept in its pid file, and its log may miss output"


def _job_ended_ns(attempt_dir: str, receipt_format: str | None) -> int | None:
    """When the job's own process ended, before the drain: the mtime of the pid file once the
    status line is appended to it (``format=3``), or of ``exited`` (``format=2``); None for a
    wrapper that recorded neither."""
    if receipt_format == "2":
        try:
            return os.stat(os.path.join(attempt_dir, LEGACY_EXITED)).st_mtime_ns
        except FileNotFoundError:
            return None
    try:
        with open(os.path.join(attempt_dir, PID), "rb") as f:
            stat = os.fstat(f.fileno())
            text = f.read(128)
    except FileNotFoundError:
        return None
    if text.count(b"\n") < 2:
        return None
    return stat.st_mtime_ns


def _held_note(fields: Mapping[str, str], attempt_dir: str, drain_ms: int) -> str | None:
    """In words, what held the job's output after the job itself exited (the receipt's ``held``),
    naming the processes that still hold it; None when the output ended with the job."""
    held = fields.get("held", "")
    if held not in ("term", "killed", "left"):
        return None
    if held == "term":
        return ("after the job exited, processes it left in its process group held its output; "
                "they were sent TERM")
    pgid = _read_pid(attempt_dir)
    pipe = fields.get("pipe", "")
    if pipe.isdigit():
        writers = procfs.writers_of(f"pipe:[{pipe}]")
    elif fields.get("format") == "2":
        writers = procfs.writers_of(os.path.join(os.path.abspath(attempt_dir), LEGACY_FIFO))
    else:
        writers = []
    if held == "killed":
        note = (f"after the job exited, its output was still held {drain_ms} ms later: its process "
                "group was killed (orphans = \"kill\")")
        escaped = [w for w in writers if w.pgrp != pgid]
    else:
        note = (f"after the job exited, its output was still held {drain_ms} ms later: what holds it "
                "was left running and its output still goes to the log (orphans = \"leave\")")
        escaped = writers
    if escaped:
        named = ", ".join(f"{w.name!r} (pid {w.pid}{_how_it_left(w, pgid)})" for w in escaped[:8])
        note += f"; still running and holding it: {named}"
    return note




def _how_it_left(holder: procfs.Holder, pgid: int | None) -> str:
    """How a process holding the output left the job's process group, if it did: a session of
    its own (setsid), or a process group of its own in the wrapper's session (setpgid, a shell's
    job control); the wrapper leads both its session and its group."""
    if holder.pgrp == pgid:
        return ""
    if holder.session != pgid:
        return ", escaped its process group with setsid"
    return ", escaped its process group with setpgid"


def _check_working_dir(cwd: str) -> None:
    if not os.path.exists(cwd):
        raise StartError(f"the working directory {cwd!r} does not exist")
    if not os.path.isdir(cwd):
        raise StartError(f"the working directory {cwd!r} is not a directory")
    if not os.access(cwd, os.X_OK):
        raise StartError(f"the working directory {cwd!r} is not accessible (permission denied)")


def _resolve_program(program: str, path: str, cwd: str, *, path_is_the_tasks: bool) -> str:
    """The program as the wrapper runs it: as written if it holds a '/', else its absolute path on
    the job's PATH (so a shell builtin of the same name never stands in for it)."""
    if "/" in program:
        candidate = program if os.path.isabs(program) else os.path.join(cwd, program)
        where = "" if os.path.isabs(program) else f" (in the working directory {cwd!r})"
        if not os.path.exists(candidate):
            raise StartError(f"program {program!r} does not exist{where}")
        if os.path.isdir(candidate) or not os.access(candidate, os.X_OK):
            raise StartError(f"program {program!r} is not an executable file{where}")
        return program
    not_executable = None
    for directory in path.split(":"):
        full = os.path.join(cwd, directory or ".", program)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            return os.path.normpath(full)
        if not_executable is None and os.path.lexists(full):
            not_executable = full
    if not_executable is not None:
        raise StartError(f"program {program!r} is not executable ({not_executable})")
    # the task's PATH is one of its env values: never echoed
    shown = "the task's PATH" if path_is_the_tasks else f"PATH {path}"
    raise StartError(f"program {program!r} not found on {shown}")


def _make_private_dir(path: str) -> None:
    """Create ``path`` and any missing parent with mode 0700."""
    missing = []
    current = path
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    try:
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise
            os.chmod(directory, 0o700)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):  # no block or no inode left
            raise StartError(_cannot_write(path, exc)) from None
        raise StartError(f"cannot create the attempt directory {path!r}: {exc.strerror or exc}") from None


def _refuse_a_second_start(attempt_dir: str) -> None:
    """A receipt, or a pid file the wrapper finished writing (it then went on to start the job),
    shows an earlier start. A pid file cut short (the wrapper died writing it) does not: that
    wrapper never started the job, and the next one overwrites the file."""
    if _read_pid(attempt_dir) is not None:
        name = PID
    elif os.path.lexists(os.path.join(attempt_dir, RECEIPT)):
        name = RECEIPT
    else:
        return
    raise StartError(f"the attempt directory {attempt_dir!r} shows an earlier start "
                     f"({name} exists): not starting the job twice")


def _open_lock(attempt_dir: str) -> int:
    """A descriptor of the Attempt directory, whose flock is the Attempt's lock."""
    try:
        return os.open(attempt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise StartError(f"cannot open {attempt_dir!r}: {exc.strerror or exc}") from None


def _take_lock(fd: int, attempt_dir: str) -> None:
    deadline = time.monotonic() + LOCK_RETRY_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not _lock_held(attempt_dir, legacy_only=True):
                return
            fcntl.flock(fd, fcntl.LOCK_UN)  # a wrapper of the previous format holds ``lock``
        except BlockingIOError:
            pass
        except OSError as exc:
            raise StartError(f"cannot lock the attempt directory {attempt_dir!r}: {exc.strerror or exc} "
                             "(the log directory must be on a filesystem with locks, e.g. ext4 or "
                             "tmpfs)") from None
        if time.monotonic() > deadline:
            raise StartError(f"the attempt directory {attempt_dir!r} is in use by a live "
                             "process: not starting the job twice") from None
        time.sleep(0.005)


def _lock_held(attempt_dir: str, *, legacy_only: bool = False) -> bool:
    """Whether a wrapper (or a start in progress) holds the Attempt's lock: the directory's, or
    the ``lock`` file of a wrapper of the previous format where there is one."""
    try:
        fd = os.open(os.path.join(attempt_dir, LEGACY_LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        if legacy_only:
            return False
        try:
            fd = os.open(attempt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases our shared lock at once
    return False


def _read_pid(attempt_dir: str) -> int | None:
    """The pid the wrapper wrote, or None: no pid file, or one it has not finished writing (the
    wrapper writes it in place, the line's newline last: empty or without it means "not yet").
    A second line (the job's status, appended when it ended) is not the pid's."""
    try:
        with open(os.path.join(attempt_dir, PID), "rb") as f:
            text = f.read(64)
    except FileNotFoundError:
        return None
    line, newline, _ = text.partition(b"\n")
    if not newline:
        return None
    try:
        pid = int(line.strip())
    except ValueError:
        return None
    return pid if pid > 1 else None


def _receipt_fields(text: str) -> Mapping[str, str] | None:
    """The receipt's fields, or None when it was not written to its end. The wrapper writes it in
    place (no rename): it counts only up to a whole line ``end`` and with a ``format=`` line
    before it, so a wrapper killed while writing it leaves no receipt, as one killed before;
    what follows ``end`` (a log reader's late line) is not read. A receipt that begins with
    ``status=`` was written by an earlier wrapper (tmp + rename, so always whole): a job that
    outlived an upgrade."""
    lines = text.split("\n")
    if text.startswith("status="):
        body = lines
    elif "end" in lines[:-1]:
        body = lines[:lines.index("end")]
    else:
        return None
    fields = {}
    for line in body:
        key, sep, value = line.partition("=")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    if "status" not in fields or ("format" not in fields and not text.startswith("status=")):
        return None
    return fields


async def _readable(fd: int, timeout: float) -> bool:
    """Wait until ``fd`` is readable (a pidfd: its process exited), at most ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def _ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, _ready)
    try:
        done, _ = await asyncio.wait([ready], timeout=timeout)
        return bool(done)
    finally:
        loop.remove_reader(fd)
        ready.cancel()


def _write_event_file(attempt_dir: str, payload: str) -> str:
    """The Run's event payload as ``<attempt dir>/event.json`` (0600, replaced atomically: a
    start tried again rewrites the same bytes), for the job to read."""
    path = os.path.join(attempt_dir, "event.json")
    temp = path + ".tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        data = payload.encode("utf-8")
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError:
        os.close(fd)
        os.unlink(temp)  # no half-written payload left for a later start to read
        raise
    os.close(fd)
    os.replace(temp, path)
    return path
