"""Marks the suite sets on its own: the hang bound of long tests.

A hang fails through pytest-timeout (``timeout`` in pyproject.toml) with every thread's stack;
``soak`` and ``slow`` tests run for minutes by design, so they get :data:`LONG_TIMEOUT_S` unless
they name their own ``@pytest.mark.timeout``.
"""

from __future__ import annotations

import pytest

#: The hang bound of a ``soak`` or ``slow`` test (the full soak forms run for about 10 minutes on
#: an idle machine; a loaded 2-core machine is several times slower).
LONG_TIMEOUT_S = 3600


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("soak") is not None or item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))
