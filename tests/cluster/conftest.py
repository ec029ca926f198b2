"""The cluster tests' fixtures come from :mod:`tests.support.postgres` (loaded for the whole suite);
their helpers live in :mod:`tests.support.cluster`, whose names stay importable from here."""

from tests.support.cluster import (  # noqa: F401
    ROOT,
    ClusterDb,
    CollectingSink,
    arun,
    claim,
    commit,
    expire,
    migrate,
    seed,
    set_cursor,
)
