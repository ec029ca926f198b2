"""Running a lifecycle until SIGTERM/SIGINT: the first signal stops in order, a second forces the exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import Any, Awaitable, Callable, Iterator

from qinglong.contracts.errors import ExitCode


async def run_lifecycle(lifecycle: Any, diagnostics: Any, for_seconds: float | None, *,
                        until: Callable[[], Awaitable[bool]] | None = None, until_at_most_s: float = 60.0,
                        until_poll_s: float = 0.2) -> int:
    """Start ``lifecycle``, run until SIGTERM/SIGINT (or ``for_seconds``), stop it in order.

    With ``until``, after ``for_seconds`` it keeps running while ``await until()`` is false, for at
    most ``until_at_most_s`` more (``qinglong demo`` waits for a Run that has ended, however slow
    the machine). A signal stops it at once either way.
    """

    from qinglong.contracts.diagnostics import DiagnosticEvent

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with two_stage_signals(diagnostics, "lifecycle.stop_requested",
                           "stopping in order (send it again to force the exit)", stop.set):
        await lifecycle.start()
        try:
            if for_seconds is not None:
                try:
                    await asyncio.wait_for(stop.wait(), for_seconds)
                except asyncio.TimeoutError:
                    pass
                if until is not None:
                    deadline = loop.time() + until_at_most_s
                    while not stop.is_set() and loop.time() < deadline and not await until():
                        try:
                            await asyncio.wait_for(stop.wait(), until_poll_s)
                        except asyncio.TimeoutError:
                            pass
            else:
                await stop.wait()
        finally:
            await lifecycle.stop()
    stats = lifecycle.last_stats
    if stats is not None:
        diagnostics.emit(DiagnosticEvent("info", "lifecycle.stopped", "stopped",
                                         {"rounds": stats.rounds, "admitted": stats.admitted,
                                          "failed_rounds": stats.failed_rounds}))
    return ExitCode.OK


@contextlib.contextmanager
def two_stage_signals(diagnostics: Any, code: str, first: str, on_first: Callable[[], None],
                      on_second: Callable[[], str] = lambda: "exiting at once") -> Iterator[None]:
    """While inside, SIGTERM/SIGINT call ``on_first`` once (logged as ``code``: "<SIG> received;
    ``first``"), and a second signal writes what ``on_second`` did to stderr and exits at once with
    ``ExitCode.INTERRUPTED``: the one rule for every long-running command."""

    from qinglong.contracts.diagnostics import DiagnosticEvent

    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) == 1:
            diagnostics.emit(DiagnosticEvent("info", code, f"{signal.Signals(signum).name} received; {first}"))
            on_first()
            return
        sys.stderr.write(f"qinglong: second signal, {on_second()}\n")
        sys.stderr.flush()
        os._exit(ExitCode.INTERRUPTED)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
