"""Settings of the ``edge_sqlite`` backend: the ``[backend]`` section of an edge or standalone profile.

Kept free of heavy imports so the host can validate settings before anything connects.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EdgeSqliteSettings(BaseModel):
    """``[backend]`` keys of the SQLite backend. Unknown keys are refused (a typo is an error).

    ``path`` is the database file, relative to the working directory; its directory must exist.
    ``synchronous`` trades durability of the last commits on power loss (``normal``, WAL) against
    speed (``full`` syncs every commit). ``busy_timeout_ms`` is how long a statement waits for a
    lock held by another process (an operator's CLI, say). ``cache_kib`` bounds SQLite's page
    cache for the connection (SQLite's own default is 2,000 KiB; the edge profile sets less because
    one page of due schedules is all a round reads). ``auto_migrate`` applies pending migrations at
    start. ``quick_check_ms`` bounds SQLite's page-level ``PRAGMA quick_check`` when a scheduler
    starts and in ``db status`` (it reads the whole file: about 1 s per 500 MB from the page cache,
    ten times that from a cold disk); past the bound the start goes on with a warning, and ``0``
    skips the check.
    """

    model_config = ConfigDict(extra="forbid")

    path: str = Field(default="qinglong.db", min_length=1)
    synchronous: Literal["normal", "full"] = "normal"
    busy_timeout_ms: int = Field(default=5000, ge=0, le=600_000)
    cache_kib: int = Field(default=2000, ge=64, le=1_048_576)
    auto_migrate: bool = True
    quick_check_ms: int = Field(default=10_000, ge=0, le=600_000)
