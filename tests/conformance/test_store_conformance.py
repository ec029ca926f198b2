"""The store suite of the plugin authors' kit (``qinglong.testing.conformance.store``) on our
backends: SQLite, PostgreSQL 18 and PostgreSQL 15 (``conftest.py``). A third party's backend runs
the very same tests; a rule added there is checked here on every backend at once."""

from qinglong.testing.conformance.store import *  # noqa: F401,F403
