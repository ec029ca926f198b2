"""The chaos soak (``bench/chaos.py``) in a short form: 4 ``qinglong run`` replicas and 3
``qinglong worker`` processes, random kill -9, proxy faults (latency, resets, partitions, a lost
reply of a committed admission or completion), backend terminations and one PostgreSQL restart,
then the admission audit and the execution audit.

The fast form injects faults for about 25 s; ``QINGLONG_SOAK=full`` runs it for 10 minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.failure.failure_helpers import ROOT, env_full

pytestmark = pytest.mark.postgres


@pytest.mark.soak
def test_chaos_soak_admits_every_occurrence_once_and_runs_every_run_to_one_end(tmp_path):
    """Under random crashes of replicas and workers, wire faults, partitions and a database
    restart: an occurrence that no replica admitted (fire_once), or that a misfire skipped without
    a record (skip), is lost; an occurrence admitted twice is a duplicate Run; a Run left queued or
    running after the drain is hung; a lost Attempt of a task that is not idempotent retried, or
    more Attempts than the policy allows, is a job run twice; two executions of one Run
    overlapping on the machine's monotonic clock (a fenced worker still running a job another
    worker took over), or one Attempt started twice, is a Run run twice at once; a job that
    exited with a code its Attempt does not hold is an outcome lost or invented. The audits count
    each; every count must be zero."""
    out = tmp_path / "chaos.json"
    minutes = "10" if env_full() else "0.4"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--minutes", minutes, "--fault-every", "1.0",
         "--triggers", "24", "--seed", "20261201", "--out", str(out)],
        capture_output=True, text=True, timeout=60 * 20)
    print(proc.stdout[-4000:])
    assert out.exists(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    execution = result["execution"]
    print(f"[figures] chaos_soak: expected={result['expected']} found={result['admitted']} "
          f"duplicates={result['duplicates']} missing={result['missing']} "
          f"skipped_recorded={result['skipped_recorded']} worst_lag={result['worst_lag_ms']}ms "
          f"time_to_recover={result['caught_up_after_heal_s']}s injected={result['injected']} "
          f"execution={json.dumps(execution['figures'], sort_keys=True)}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # admission
    assert result["duplicates"] == 0 and result["missing"] == 0
    assert result["by_policy"]["fire_once"]["missing"] == 0
    assert result["by_policy"]["skip"]["admitted_and_skipped"] == 0
    assert result["runs_without_admission_shape"] == 0
    assert result["injected"].get("unexpected_exit", 0) == 0, proc.stdout[-4000:]
    assert result["expected"] > 0 and result["admitted"] > 0
    # execution: every Run ended once, within its policy, never two executions at once
    assert result["drained"], execution["figures"]["runs_by_state"]
    assert execution["violations"] == {k: 0 for k in execution["violations"]}, execution["examples"]
    figures = execution["figures"]
    assert figures["jobs_ended"] > 0 and figures["runs"] == result["admitted"]
    # the faults happened: a database restart, replicas and workers killed, a worker cut off
    assert result["injected"].get("postgres_restart") == 1
    assert result["injected"].get("kill9", 0) + result["injected"].get("worker_kill9", 0) >= 1
    assert result["injected"].get("worker_kill9", 0) + result["injected"].get("worker_partition", 0) >= 1
