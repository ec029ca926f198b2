"""A kit for plugin authors: the laws and suites Qinglong checks itself, to run on your plugin.

Installed with ``pip install 'qinglong[testing]'`` (which adds pytest and hypothesis); nothing
here is imported by ``qinglong`` itself, and importing this package imports no test library.

* :mod:`qinglong.testing.provider_laws`: the trigger-provider laws (validate is idempotent,
  purity, ``next_after`` strictly increasing, ``next_after`` and ``latest_at_or_before`` agree,
  an example spec fires at its period) as functions taking your provider, and
  :func:`~qinglong.testing.provider_laws.provider_law_test` to run them all with hypothesis::

      from hypothesis import strategies as st
      from qinglong.testing.provider_laws import provider_law_test

      test_tick_keeps_the_provider_laws = provider_law_test(
          TickProvider(), st.fixed_dictionaries({"every_ms": st.integers(1_000, 10**9)}),
          fresh=TickProvider)

* :mod:`qinglong.testing.decision_laws`: the decision contract's laws over any provider
  (``settle``, ``expected_admissions``, ``assert_decision_laws``), to prove with hypothesis that
  your kind fires every on-time occurrence exactly once and at most once per misfire.
* :mod:`qinglong.testing.conformance`: the store conformance suites and their harness, so a
  third-party scheduler backend runs the same tests as Qinglong's SQLite and PostgreSQL backends.

See docs/plugins.md, "Testing your plugin".
"""

import sys

if "pytest" in sys.modules:  # detailed assertion messages from the kit's checks, as in a test file
    sys.modules["pytest"].register_assert_rewrite(
        "qinglong.testing.decision_laws", "qinglong.testing.conformance")
