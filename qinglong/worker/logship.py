"""Shipping an Attempt's local log to the store: from the last offset the store holds, in chunks
of at most :data:`~qinglong.contracts.worker.MAX_LOG_CHUNK_BYTES`, each at its explicit offset.

The local file only grows (the executor appends up to the task's log limit), so what the store
holds is always a prefix of it; a chunk resent after a lost reply is the same bytes at the same
offset, which the store accepts once.
"""

from __future__ import annotations

import os
from typing import Awaitable, Callable

from qinglong.contracts.worker import MAX_LOG_CHUNK_BYTES, log_chunks

#: The log file in an Attempt directory (the executors' layout; ``qinglong logs`` reads it too).
LOG_FILE = "log"


def log_path(attempt_dir: str) -> str:
    return os.path.join(attempt_dir, LOG_FILE)


def log_size(attempt_dir: str) -> int:
    """Bytes in the Attempt's local log (0 while there is none)."""
    try:
        return os.stat(log_path(attempt_dir)).st_size
    except FileNotFoundError:
        return 0


def read_log(attempt_dir: str, offset: int, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` of the local log from ``offset`` (empty at its end or with no file)."""
    try:
        with open(log_path(attempt_dir), "rb") as f:
            f.seek(offset)
            return f.read(max_bytes)
    except FileNotFoundError:
        return b""


async def ship_log(attempt_dir: str, shipped: int, append: Callable[[int, bytes], Awaitable[int]], *,
                   until: int | None = None, max_bytes: int = MAX_LOG_CHUNK_BYTES) -> int:
    """Send the local log from ``shipped`` on (up to ``until`` bytes, default: its size now)
    through ``append(offset, data) -> bytes stored``; returns the bytes the store holds after.

    Each read is one chunk, so memory stays one chunk whatever the log's size."""
    end = log_size(attempt_dir) if until is None else until
    while shipped < end:
        data = read_log(attempt_dir, shipped, min(max_bytes, end - shipped))
        if not data:
            break  # the file is shorter than it was (it never is): nothing more to send
        for offset, chunk in log_chunks(shipped, data, max_bytes):
            stored = await append(offset, chunk)
            if stored < offset + len(chunk):
                raise RuntimeError(f"the store holds {stored} bytes of the log after a chunk ending at "
                                   f"{offset + len(chunk)}")
            shipped = stored
    return shipped
