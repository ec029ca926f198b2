"""Real PostgreSQL servers for the suite: :mod:`devtools.pg` (shared with the benchmarks)."""

from devtools.pg import *  # noqa: F401,F403
from devtools.pg import ROLE_PASSWORDS, PgServer, server_build  # noqa: F401
