"""The ``edge_sqlite`` scheduler backend: one process, one SQLite file, one page per round.

Used by the ``edge`` and ``standalone`` profiles. Importing this package is cheap: the database
driver (aiosqlite) is imported only when the host calls the factory, so a host that loads the
plugin to list it, or to validate settings, pays nothing for the driver.

Layout, one concept per module:

* :mod:`.settings` - the ``[backend]`` settings model;
* :mod:`.queries` - named SQL blocks from ``sql/*.sql``;
* :mod:`.migrations` - the ordered, checksummed migration stream in ``migrations/``;
* :mod:`.store` - the connection (WAL, foreign keys, busy timeout) and its worker thread;
* :mod:`.publisher`, :mod:`.reader` - the admin and read sides;
* :mod:`.scheduler` - the bounded round: scan one page, decide, commit each occurrence;
* :mod:`.recovery` - startup recovery of in-flight attempts;
* :mod:`.backend` - the :class:`~qinglong.contracts.store.SchedulerBackend` tying them together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.store import SchedulerBackendSpec

from .settings import EdgeSqliteSettings

if TYPE_CHECKING:  # types only
    from qinglong.contracts.store import BackendContext, SchedulerBackend

BACKEND_NAME = "edge_sqlite"


def create_backend(context: "BackendContext") -> "SchedulerBackend":
    """Build the SQLite backend from the host's context without connecting.

    The driver is imported here, not at package import, so only a process that runs this backend
    loads aiosqlite.
    """
    from .backend import EdgeSqliteBackend

    return EdgeSqliteBackend(context)


@hookimpl
def qinglong_scheduler_backends():
    """Offer the ``edge_sqlite`` backend."""
    return [
        SchedulerBackendSpec(
            name=BACKEND_NAME,
            settings_model=EdgeSqliteSettings,
            create=create_backend,
            description="SQLite file owned by one process; single-page cursor scanner",
        )
    ]
