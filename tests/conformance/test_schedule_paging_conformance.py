"""The paging suite of the plugin authors' kit (``qinglong.testing.conformance.paging``) on our
backends: SQLite, PostgreSQL 18 and PostgreSQL 15 (``conftest.py``)."""

from qinglong.testing.conformance.paging import *  # noqa: F401,F403
