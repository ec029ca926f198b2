"""Moved to :mod:`tests.support.procs`; this name stays importable for tests written against it."""

from tests.support.procs import group_members, process_alive, wait_until  # noqa: F401
