"""Waiting out a store that cannot be reached: the one loop of ``qinglong run``'s start and of
``qinglong db wait``.

Which errors are waited out is the contracts' rule (:func:`~qinglong.contracts.errors.outage`:
a server down or restarting, never a refused login), plus what the caller adds (``db wait``
also waits for a schema not ready yet). Each refused attempt is passed to ``waiting``; at the
bound the last error is raised, with its own exit code.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

from qinglong.contracts.errors import outage

T = TypeVar("T")

#: ``waiting(error, attempt number, seconds left)``
Waiting = Callable[[BaseException, int, float], None]


async def wait_out(attempt: Callable[[], Awaitable[T]], *, timeout_s: float, interval_s: float,
                   waiting: Waiting, also: tuple[type[BaseException], ...] = ()) -> T:
    """``await attempt()`` until it returns, at most ``timeout_s`` seconds, pausing
    ``interval_s`` after each attempt refused by an outage (or an error of a type in ``also``);
    any other error is raised at once."""
    deadline = time.monotonic() + timeout_s
    tries = 0
    while True:
        tries += 1
        try:
            return await attempt()
        except Exception as exc:
            if not (outage(exc) or isinstance(exc, also)):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            waiting(exc, tries, left)
            await asyncio.sleep(min(interval_s, left))
