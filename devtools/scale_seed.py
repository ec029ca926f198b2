"""Many schedules at once, for the tests and the benchmark that measure what a claim reads.

Publishing a million triggers one by one through the publisher would take hours; these rows are
copies of one trigger the real publisher wrote (same project, task, kind, spec and digest), with
their own ids, inserted in one statement by the superuser. Their schedules are far in the future
(``FAR_FUTURE_MS`` plus their number), except those the caller makes due.
"""

from __future__ import annotations

#: A cursor no test reaches: year 2255.
FAR_FUTURE_MS = 9_000_000_000_000


def clone_triggers(conn, template_trigger_id: str, count: int, *, prefix: str = "x") -> None:
    """Insert ``count`` copies of trigger ``template_trigger_id`` (ids ``prefix`` + 8 digits)
    with their schedules far in the future and unclaimed, then analyse the tables.

    ``conn``: an autocommit psycopg connection of the superuser."""
    conn.execute(
        "INSERT INTO qinglong.triggers (trigger_id, project_id, task_id, trigger_revision, kind, "
        "spec_json, misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms) "
        "SELECT %(prefix)s || lpad(g::text, 8, '0'), project_id, task_id, trigger_revision, kind, "
        "spec_json, misfire_policy, misfire_grace_ms, enabled, content_digest, updated_at_ms "
        "FROM qinglong.triggers, generate_series(1, %(count)s) AS g WHERE trigger_id = %(template)s",
        {"prefix": prefix, "count": count, "template": template_trigger_id})
    conn.execute(
        "INSERT INTO qinglong.trigger_schedules (trigger_id, project_id, trigger_revision, "
        "next_fire_at_ms, last_scheduled_at_ms, state_version, claim_owner, claim_token, "
        "claim_version, claim_expires_at_ms, updated_at_ms, published_at_ms) "
        "SELECT t.trigger_id, t.project_id, t.trigger_revision, "
        "%(far)s + substr(t.trigger_id, length(%(prefix)s) + 1)::bigint, NULL, 1, NULL, NULL, 0, "
        "NULL, 0, 0 "
        "FROM qinglong.triggers t "
        "WHERE t.trigger_id LIKE %(pattern)s "
        "AND NOT EXISTS (SELECT 1 FROM qinglong.trigger_schedules s WHERE s.trigger_id = t.trigger_id)",
        {"far": FAR_FUTURE_MS, "prefix": prefix, "pattern": prefix + "%"})
    conn.execute("VACUUM ANALYZE qinglong.triggers")
    conn.execute("VACUUM ANALYZE qinglong.trigger_schedules")


def make_due(conn, trigger_ids, offset_ms: int = -1000) -> None:
    """Move the cursors of ``trigger_ids`` to database now + ``offset_ms`` and clear their claims."""
    conn.execute(
        "UPDATE qinglong.trigger_schedules SET next_fire_at_ms = "
        "(SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) + %(offset)s, "
        "claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL "
        "WHERE trigger_id = ANY (%(ids)s)", {"offset": offset_ms, "ids": list(trigger_ids)})


def explain_claim(conn, *, owner: str = "explain", limit: int = 256, lease_ms: int = 60_000,
                  kinds=("cron",)) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of the real claim statement, rolled back: the
    statement runs (that is what ANALYZE measures) but claims nothing that stays.

    ``conn``: a psycopg connection NOT in autocommit. Returns the top plan object."""
    from qinglong.plugins.cluster_postgres.sql import query

    try:
        cur = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("claim_due_schedules"),
                           {"owner": owner, "limit": limit, "lease_ms": lease_ms,
                            "kinds": None if kinds is None else list(kinds)})
        [[document]] = cur.fetchall()
    finally:
        conn.rollback()
    return document[0]


def plan_nodes(plan: dict):
    """Every node of a plan (the top object of EXPLAIN's JSON, or one node), depth first."""
    node = plan.get("Plan", plan)
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def due_index_scans(plan: dict) -> list[dict]:
    """The nodes of ``plan`` that scan the due index."""
    return [n for n in plan_nodes(plan) if n.get("Index Name") == "trigger_schedules_due"]


def rows_read(node: dict) -> int:
    """Index entries a scan node returned or threw away (actual rows and every kind of removal),
    over all its loops."""
    loops = max(1, int(node.get("Actual Loops", 1)))
    returned = float(node.get("Actual Rows", 0)) * loops
    removed = sum(int(v) for k, v in node.items() if k.startswith("Rows Removed by"))
    return int(returned) + removed


def blocks_read(node: dict) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
