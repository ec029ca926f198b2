"""The store conformance suites, for Qinglong's backends and a third party's alike.

Every scheduler backend must behave the same way for every store behaviour of the contracts
(publishing and its refusals, initialization, exactly-once admission, misfires, republishing,
recovery, round accounting, listings and paging). Qinglong runs these suites on SQLite,
PostgreSQL 18 and PostgreSQL 15; a backend from another distribution runs the very same tests:

1. Subclass :class:`~.harness.Harness` for your backend (``create_backend``, the clock, row counts;
   the harness module says what each method must do).
2. In your ``conftest.py``, provide a ``harness`` fixture and bring in the async runner::

       import pytest
       from qinglong.testing.conformance.runner import pytest_pyfunc_call  # noqa: F401

       @pytest.fixture
       def harness(tmp_path):
           return AcmeHarness(tmp_path)       # created here; the runner opens and closes it

3. In a test module, import the suites::

       from qinglong.testing.conformance.store import *   # noqa: F401,F403
       from qinglong.testing.conformance.paging import *  # noqa: F401,F403

Every test is an ``async def`` taking ``harness``; parametrise the fixture to run them on several
servers or versions, as ``tests/conformance/conftest.py`` does. ``pip install
'qinglong[testing]'`` brings pytest and hypothesis.
"""
