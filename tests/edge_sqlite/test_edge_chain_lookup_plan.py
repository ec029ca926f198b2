"""A Run's end finds the 'after' triggers that follow its task without reading the project's
other triggers: bounded work counted in SQLite's virtual-machine steps, not in time.

What is lost if this fails: every Run's end reads every trigger of its project inside the write
transaction that records the end. On a router with 10,000 cron triggers that was about 5 ms of
CPU and 50,000 steps per end, paid by every job, growing with the table.
"""

from __future__ import annotations

import sqlite3

import pytest

from edge_helpers import vm_steps
from qinglong.plugins.edge_sqlite import migrations
from qinglong.plugins.edge_sqlite.queries import query

CRON_TRIGGERS = 5_000
#: The lookup through its index: a descent and the rows it returns. A walk of the project's
#: triggers costs at least a few steps per trigger (tens of thousands here).
MAX_STEPS = 400


def _store(path) -> sqlite3.Connection:
    """A store migrated as the product migrates it, with project p1, tasks up, down and other,
    5,000 cron triggers of up and four 'after' triggers."""
    conn = sqlite3.connect(path, isolation_level=None)
    migrations.apply_pending(conn, migrations.load_migrations(), str(path), 1_000)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO projects (project_id, name, active, created_at_ms) VALUES ('p1', 'p1', 1, 1)")
    conn.executemany("INSERT INTO tasks (project_id, task_id, task_revision, payload_json, content_digest, "
                     "updated_at_ms) VALUES ('p1', ?, 1, '{}', 'sha256:0', 1)", [("up",), ("down",), ("other",)])

    def trigger(trigger_id: str, task: str, kind: str, spec: str, enabled: int = 1):
        return (trigger_id, task, kind, spec, enabled)

    rows = [trigger(f"c{i:05d}", "up", "cron", '{"expression":"* * * * *"}') for i in range(CRON_TRIGGERS)]
    rows += [trigger("after-b", "down", "after", '{"task":"up","on":"any"}'),
             trigger("after-a", "down", "after", '{"task":"up","on":"success"}'),
             trigger("after-off", "down", "after", '{"task":"up","on":"any"}', 0),
             trigger("after-other", "up", "after", '{"task":"other","on":"any"}')]
    conn.executemany("INSERT INTO triggers (trigger_id, project_id, task_id, trigger_revision, kind, spec_json, "
                     "misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms) "
                     "VALUES (?, 'p1', ?, 1, ?, ?, 'fire_once', 0, ?, 'sha256:0', 1)", rows)
    conn.execute("COMMIT")
    return conn


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "analyzed"])
def test_a_runs_end_reads_only_the_triggers_that_follow_its_task(tmp_path, analyzed):
    conn = _store(tmp_path / "q.db")
    if analyzed:  # the planner's statistics must not turn it back to the walk
        conn.execute("ANALYZE")
    rows, steps = vm_steps(conn, query("chain_triggers_of"), {"project": "p1", "task": "up"})
    # the enabled 'after' triggers following 'up', in id order (the admission order)
    assert [r[0] for r in rows] == ["after-a", "after-b"]
    assert steps <= MAX_STEPS, f"the lookup took {steps} steps beside {CRON_TRIGGERS} cron triggers"
    # the chain graph a publish checks reads the 'after' triggers alone too
    edges, steps = vm_steps(conn, query("chain_edges"), ("p1",))
    assert sorted(e[0] for e in edges) == ["after-a", "after-b", "after-off", "after-other"]
    assert steps <= MAX_STEPS, f"the chain graph took {steps} steps beside {CRON_TRIGGERS} cron triggers"
