"""The chaos soak (``bench/chaos.py``) in a short form: 4 ``qinglong run`` replicas, random
kill -9, proxy faults, backend terminations and one PostgreSQL restart, then the audit.

The fast form injects faults for about 40 s; ``QINGLONG_SOAK=full`` runs it for 10 minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.failure.failure_helpers import ROOT, env_full

pytestmark = pytest.mark.postgres


@pytest.mark.soak
def test_chaos_soak_admits_every_occurrence_exactly_once(tmp_path):
    """Under random crashes, wire faults and a database restart, an occurrence that no replica
    admitted (fire_once), or that a misfire skipped without a record (skip), is lost; an
    occurrence admitted twice is a duplicate Run. The audit counts both; both must be zero."""
    out = tmp_path / "chaos.json"
    minutes = "10" if env_full() else "0.7"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--minutes", minutes, "--fault-every", "1.5",
         "--triggers", "24", "--seed", "20261130", "--out", str(out)],
        capture_output=True, text=True, timeout=60 * 20)
    print(proc.stdout[-3000:])
    assert out.exists(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    print(f"[figures] chaos_soak: expected={result['expected']} found={result['admitted']} "
          f"duplicates={result['duplicates']} missing={result['missing']} "
          f"skipped_recorded={result['skipped_recorded']} worst_lag={result['worst_lag_ms']}ms "
          f"time_to_recover={result['caught_up_after_heal_s']}s injected={result['injected']}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["duplicates"] == 0 and result["missing"] == 0
    assert result["by_policy"]["fire_once"]["missing"] == 0
    assert result["by_policy"]["skip"]["admitted_and_skipped"] == 0
    assert result["runs_without_1_attempt_2_events"] == 0
    assert result["injected"].get("postgres_restart") == 1
    assert result["injected"].get("kill9", 0) >= 1
    assert result["replica_logs"]["recovery_candidates_max"] == 0
    assert result["expected"] > 0 and result["admitted"] > 0
