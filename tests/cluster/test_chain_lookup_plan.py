"""A Run's end finds the 'after' triggers that follow its task without reading the cluster's
other triggers: plan shapes and rows read (EXPLAIN ANALYZE of the end's own trigger), not times.

5,000 cron triggers of the upstream task beside the 'after' triggers. A Run ends as every end
does, by its state's change to a final one (the completion of a worker, an expiry, a cancel),
here run by the superuser with ``auto_explain`` reporting the plans of the statements the
change's triggers run, generic and custom.

What is lost if this fails: every Run's end reads every trigger of the cluster inside the
transaction that records it (a worker's completion waits on it, holding the Run's locks): the
database's time per job grows with the number of triggers, on every replica and worker.
"""

from __future__ import annotations

import json

import pytest

from devtools.scale_seed import plan_nodes, rows_read
from qinglong.plugins.cluster_postgres.sql import query
from tests.cluster.test_cluster_events import chained, put_after
from tests.cluster.test_worker_functions import admit, publish
from tests.support.cluster import explained

CRON_TRIGGERS = 5_000
#: the 'after' triggers following the task, found through the index; a walk reads thousands
MAX_TRIGGER_ROWS = 20


@pytest.mark.parametrize("plan_mode", ["force_generic_plan", "force_custom_plan"])
def test_a_runs_end_reads_only_the_triggers_that_follow_its_task(cluster, plan_mode):
    for task in ("up", "down", "other"):
        publish(cluster, task, {"command": ["true"]})
    put_after(cluster, "after-down", "down", "up", "any")
    put_after(cluster, "after-other", "up", "other", "any")
    cluster.sql("INSERT INTO qinglong.triggers (trigger_id, project_id, task_id, trigger_revision, kind, "
                "spec_json, misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms) "
                "SELECT 'c' || g, 'p1', 'up', 1, 'cron', '{\"expression\": \"* * * * *\"}', 'fire_once', 0, "
                "true, 'sha256:0', 1 FROM generate_series(1, %s) AS g", (CRON_TRIGGERS,))
    cluster.sql("VACUUM ANALYZE qinglong.triggers")
    (run_id, _), = admit(cluster, "up", 1)

    _, plans = explained(cluster, "UPDATE qinglong.runs SET state = 'cancelled', cancelled = true, "
                                  "finished_at_ms = admitted_at_ms WHERE run_id = %s", (run_id,), plan_mode=plan_mode)

    # the end admitted its chained Run, and only the one following its task
    assert chained(cluster, "after-down") == [(f"ql3:chain:v1:{run_id}:after-down", "queued")]
    assert chained(cluster, "after-other") == []
    lookups = [p for p in plans if "FROM qinglong.triggers tr" in p.get("Query Text", "")]
    assert lookups, f"{plan_mode}: no plan of the chain lookup among {len(plans)}"
    scans = [n for p in lookups for n in plan_nodes(p) if n.get("Relation Name") == "triggers"]
    read = sum(rows_read(n) for n in scans)
    assert read <= MAX_TRIGGER_ROWS, (
        f"{plan_mode}: the end read {read} trigger rows beside {CRON_TRIGGERS} cron triggers: "
        + json.dumps([{k: n.get(k) for k in ("Node Type", "Index Name", "Index Cond", "Filter", "Actual Rows",
                                              "Actual Loops", "Rows Removed by Filter")} for n in scans])[:2000])
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], plan_mode
    # the chain graph a publish reads (every 'after' trigger of the project) uses the index too
    edges, plans = explained(cluster, query("chain_edges"), {"project_id": "p1"}, plan_mode=plan_mode)
    assert sorted(e[0] for e in edges) == ["after-down", "after-other"]
    scans = [n for p in plans for n in plan_nodes(p) if n.get("Relation Name") == "triggers"]
    assert scans and sum(rows_read(n) for n in scans) <= MAX_TRIGGER_ROWS, (plan_mode, scans)
