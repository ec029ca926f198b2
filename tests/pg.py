"""Moved to :mod:`tests.support.pg`; this name stays importable for tests written against it."""

from tests.support.pg import *  # noqa: F401,F403
from tests.support.pg import ROLE_PASSWORDS, PgServer, server_build  # noqa: F401
