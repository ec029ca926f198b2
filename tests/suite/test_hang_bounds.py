"""Every test has a hang bound: a hang fails with its stack instead of holding CI for its hour."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from suite_helpers import ROOT, collect
from tests.support.markers import LONG_TIMEOUT_S

HANGING = textwrap.dedent('''
    import threading

    import pytest


    @pytest.mark.timeout(3)
    def test_hangs():
        wait_for_an_event_that_never_comes()


    def wait_for_an_event_that_never_comes():
        threading.Event().wait()


    def test_after_the_hang():
        pass
''')


def test_a_hang_fails_with_its_stack_and_the_run_goes_on(tmp_path):
    """Under the suite's own settings a hung test must fail with the stack where it hung, and
    the tests after it must still run: without a bound, one hang holds the whole run until CI
    kills it, and says nothing of where."""
    test_file = tmp_path / "test_hanging.py"
    test_file.write_text(HANGING)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
         "-n", "0", "-p", "no:cacheprovider", str(test_file)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Timeout" in output, output
    assert "wait_for_an_event_that_never_comes" in output, output
    assert "1 failed, 1 passed" in output, output


def test_every_test_is_bounded_and_soaks_get_the_longer_bound(tmp_path):
    """The default bound must be generous for a loaded 2-core machine (or slow machines fail
    healthy tests), and a soak or slow test, minutes long by design, must get the longer one."""
    collected = collect(tmp_path)
    assert float(collected["timeout_ini"]) >= 300
    long_ones = [i for i in collected["items"] if {"soak", "slow"} & set(i["marks"])]
    assert long_ones
    short = [i["nodeid"] for i in long_ones if (i["timeout"] or 0) < LONG_TIMEOUT_S]
    assert not short, short
