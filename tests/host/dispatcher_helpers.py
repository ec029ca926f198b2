"""Helpers of the dispatcher tests: a real SQLite file behind the real edge backend, the real
``local_process`` executor, and the real lifecycle (in this process, or ``qinglong run`` in a child).

Jobs are small ``sh -c`` scripts that leave evidence in files: a marker created with O_EXCL per
Attempt (``set -C``), start and end lines appended to a shared file, a GO file they wait for. Every
wait polls a condition with a generous bound; nothing sleeps a fixed time and then asserts.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
import uuid
import errno
import os
import subprocess
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable, TypeVar

from qinglong.contracts.errors import AlreadyExists
from qinglong.contracts.execution import RunState
from qinglong.host.containers import build_container
from qinglong.host.settings import load_settings

from tests.support.aio import closing
from tests.support.procs import group_members, process_alive  # noqa: F401 (re-exported)

T = TypeVar("T")
WAIT_S = 60.0
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "lost"}
PROJECT = "p"


def write_settings(root: Path, *, level: str = "error", lifecycle: dict[str, Any] | None = None,
                   **execution: Any) -> Path:
    """A settings file for a fresh database ``root/q.db`` (logs in ``root/q.db.logs``)."""
    values: dict[str, Any] = {"poll_ms": 100, "kill_grace_ms": 300}
    values.update(execution)
    lines = ['profile = "edge"', "[backend]", f"path = {json.dumps(str(root / 'q.db'))}", "[execution]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    if lifecycle:
        lines += ["[lifecycle]"] + [f"{key} = {json.dumps(value)}" for key, value in lifecycle.items()]
    lines += ["[diagnostics]", f'level = "{level}"']
    path = root / "settings.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def state_of(value: Any) -> str:
    return value.value if isinstance(value, RunState) or hasattr(value, "value") else str(value)


def marker_script(marks: Path, body: str) -> list[str]:
    """``sh -c``: create this Attempt's marker with O_EXCL (fails if it exists), then ``body``."""
    return ["sh", "-c", f"set -C; : > {shlex.quote(str(marks))}/\"$QINGLONG_ATTEMPT_ID\" || exit 99; {body}"]


def wait_for_go(go: Path) -> str:
    return f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done"


async def until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll ``condition`` (a plain or async callable) until it returns something true."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not reached within {timeout:.0f} s"
        await asyncio.sleep(0.05)


class Harness:
    """A started lifecycle and what tests do with it."""

    def __init__(self, lifecycle: Any) -> None:
        self.lifecycle = lifecycle
        self.backend = lifecycle.backend
        self.store = lifecycle.backend.execution()

    @property
    def dispatcher(self) -> Any:
        return self.lifecycle.dispatcher

    async def put_task(self, task: str, command: list[str], **spec: Any) -> None:
        await put_task(self.backend, task, command, **spec)

    async def admit(self, task: str) -> str:
        run_id, created = await self.store.admit_manual_run(PROJECT, task, uuid.uuid4().hex, now_ms())
        assert created
        if self.dispatcher is not None:
            self.dispatcher.wake()
        return run_id

    async def detail(self, run_id: str) -> Any:
        return await self.store.run_detail(run_id)

    async def state(self, run_id: str) -> str:
        return state_of((await self.detail(run_id)).run.state)

    async def until_state(self, run_id: str, *states: str) -> Any:
        async def reached() -> Any:
            detail = await self.detail(run_id)
            return detail if state_of(detail.run.state) in states else None
        return await until(reached, f"run {run_id} in {states}")

    async def until_ended(self, run_id: str) -> Any:
        return await self.until_state(run_id, *TERMINAL)

    async def passes_after(self, count: int = 2) -> None:
        """Until the dispatcher ran ``count`` more passes (what it would do now, it has done)."""
        target = self.dispatcher.stats.passes + count
        self.dispatcher.wake()

        def done() -> bool:
            self.dispatcher.wake()
            return self.dispatcher.stats.passes >= target
        await until(done, f"{count} dispatcher passes")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def put_task(backend: Any, task: str, command: list[str], **spec: Any) -> None:
    publisher = backend.publisher()
    try:
        await publisher.create_project(PROJECT, "dispatcher tests")
    except AlreadyExists:
        pass
    payload: dict[str, Any] = {"command": command, **spec} if command else dict(spec)
    await publisher.put_task(PROJECT, task, payload)


@asynccontextmanager
async def running(settings: Path) -> AsyncIterator[Harness]:
    """The lifecycle of ``settings`` started in this process; stopped on exit."""
    container = build_container(load_settings(settings))
    lifecycle = container.lifecycle()
    await lifecycle.start()
    try:
        assert lifecycle.dispatcher is not None, "the edge profile must start a dispatcher"
        yield Harness(lifecycle)
    finally:
        await lifecycle.stop()


@asynccontextmanager
async def opened(settings: Path) -> AsyncIterator[Any]:
    """The backend of ``settings`` opened (and migrated) without a lifecycle: no dispatcher runs."""
    container = build_container(load_settings(settings))
    backend = container.backend()
    await backend.open()
    async with closing(backend):
        await backend.migrate()
        await backend.check_readiness()
        yield backend






@contextmanager
def small_tmpfs(mount: Path, size: str):
    """A real tmpfs of ``size`` (``8m``, ``64k``) mounted at ``mount`` (created), unmounted after."""
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path, leave_free: int = 0) -> None:
    """Write ``path`` until its filesystem has at most ``leave_free`` bytes free (0: full)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            st = os.statvfs(path)
            free = st.f_bavail * st.f_frsize
            if free <= leave_free:
                return
            os.write(fd, b"x" * min(64 * 1024, max(free - leave_free, 1)))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)


def wrapper_pid(attempt_dir: str) -> int:
    """The job wrapper's pid (its process group): written by the wrapper itself first thing, so
    it may follow the running commit by a moment; polled for until its first line is whole (its
    newline ends it; the job's status is appended as a second line when it ended)."""
    path = Path(attempt_dir, "pid")
    deadline = time.monotonic() + WAIT_S
    while True:
        text = path.read_text() if path.exists() else ""
        if "\n" in text:
            return int(text.split("\n", 1)[0])
        assert time.monotonic() < deadline, f"no whole pid file in {attempt_dir}"
        time.sleep(0.01)


def max_overlap(lines: list[str]) -> int:
    """The most ``start`` lines not yet matched by an ``end`` line, over the sequence."""
    running = peak = 0
    for line in lines:
        if line.startswith("start"):
            running += 1
            peak = max(peak, running)
        elif line.startswith("end"):
            running -= 1
    return peak
