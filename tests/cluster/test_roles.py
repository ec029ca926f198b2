"""The four roles, logged in for real: every allowed statement works, every denied one is refused."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.cluster import seed

OWNER, ADMIN, RUNTIME, INGRESS = ("qinglong_owner", "qinglong_admin", "qinglong_runtime",
                                  "qinglong_gateway")

SCHEDULE_UPDATE = "UPDATE qinglong.trigger_schedules SET updated_at_ms = updated_at_ms"
SCHEDULE_INSERT = ("INSERT INTO qinglong.trigger_schedules (trigger_id, project_id, trigger_revision, "
                   "state_version, claim_version, updated_at_ms) VALUES ('x', 'p1', 1, 1, 0, 0)")
SCHEDULE_DELETE = "DELETE FROM qinglong.trigger_schedules WHERE trigger_id = 'nobody'"
RUN_INSERT = ("INSERT INTO qinglong.runs (run_id, project_id, trigger_id, trigger_revision, task_id, "
              "task_revision, executor, execution_digest, scheduled_for_ms, admitted_at_ms, state, "
              "owned_by, idempotency_key, admitted_by) VALUES (gen_random_uuid(), 'p1', 'tr000', 1, "
              "'task', 1, 'remote_worker', 'd', 1, 1, 'queued', 'runtime', 'k', 'test')")


def _try(db, role, statement) -> bool:
    """True if ``statement`` succeeds as ``role`` (rolled back either way)."""
    with psycopg.connect(db.dsn(role)) as conn:
        try:
            conn.execute(statement)
            return True
        except psycopg.errors.InsufficientPrivilege:
            return False
        finally:
            conn.rollback()


def test_no_role_is_superuser_or_can_create_roles_or_databases(cluster):
    """A superuser or role-creating login would make every grant below meaningless."""
    rows = cluster.sql("SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, "
                       "rolcanlogin FROM pg_roles WHERE rolname LIKE 'qinglong_%' ORDER BY 1")
    assert [r[0] for r in rows] == sorted([OWNER, ADMIN, RUNTIME, INGRESS])
    for name, *flags, can_login in rows:
        assert flags == [False] * 5, name
        assert can_login, name
    for role in (OWNER, ADMIN, RUNTIME, INGRESS):
        assert cluster.sql("SELECT current_user, usesuper FROM pg_user WHERE usename = current_user",
                           role=role) == [(role, False)]


def test_runtime_advances_schedules_and_admits_but_never_creates_or_deletes_schedules(cluster):
    """If runtime could INSERT/DELETE schedules a replica could resurrect or erase triggers."""
    seed(cluster, 1)
    allowed = [
        "SELECT * FROM qinglong.trigger_schedules FOR UPDATE",
        SCHEDULE_UPDATE,
        "SELECT * FROM qinglong.projects, qinglong.tasks, qinglong.task_revisions, "
        "qinglong.execution_revisions, qinglong.triggers, qinglong.schema_migrations",
        RUN_INSERT,
        "SELECT * FROM qinglong.runs, qinglong.attempts, qinglong.run_events, qinglong.schedule_skips",
    ]
    denied = [
        SCHEDULE_INSERT,
        SCHEDULE_DELETE,
        "UPDATE qinglong.triggers SET enabled = false",
        "INSERT INTO qinglong.projects VALUES ('x', 'x', true, 0, 0)",
        "UPDATE qinglong.projects SET active = false",
        "UPDATE qinglong.execution_revisions SET content_digest = 'x'",
        "UPDATE qinglong.runs SET state = 'failed'",
        "DELETE FROM qinglong.runs",
        "UPDATE qinglong.attempts SET worker_id = 'w'",
        "DELETE FROM qinglong.run_events",
        "INSERT INTO qinglong.schema_migrations VALUES (50, 'x', 'x', 1, 0, 'x')",
        "TRUNCATE qinglong.trigger_schedules",
        "CREATE TABLE qinglong.extra (x int)",
        "DROP TABLE qinglong.runs",
    ]
    for statement in allowed:
        assert _try(cluster, RUNTIME, statement), statement
    for statement in denied:
        assert not _try(cluster, RUNTIME, statement), statement


def test_admin_publishes_and_resets_schedules_but_cannot_touch_runs(cluster):
    """Admin owns publishing; it must not forge or erase Runs, Attempts or Events."""
    seed(cluster, 1)
    allowed = [
        SCHEDULE_UPDATE,
        SCHEDULE_DELETE,
        "UPDATE qinglong.triggers SET enabled = enabled",
        "DELETE FROM qinglong.triggers WHERE trigger_id = 'nobody'",
        "INSERT INTO qinglong.projects VALUES ('x', 'x', true, 0, 0)",
        "SELECT * FROM qinglong.schema_migrations",
    ]
    denied = [
        RUN_INSERT,
        "SELECT * FROM qinglong.runs",
        "SELECT * FROM qinglong.attempts",
        "SELECT * FROM qinglong.run_events",
        "INSERT INTO qinglong.schedule_skips SELECT * FROM qinglong.schedule_skips",
        "DELETE FROM qinglong.projects",
        "UPDATE qinglong.execution_revisions SET content_digest = 'x'",
        "UPDATE qinglong.schema_migrations SET checksum = 'x'",
        "CREATE TABLE qinglong.extra (x int)",
    ]
    for statement in allowed:
        assert _try(cluster, ADMIN, statement), statement
    for statement in denied:
        assert not _try(cluster, ADMIN, statement), statement


def test_gateway_role_has_no_privilege_on_scheduler_state(cluster):
    """A worker-facing credential that could read or move schedules could forge occurrences."""
    seed(cluster, 1)
    tables = ["schema_migrations", "projects", "tasks", "task_revisions", "execution_revisions",
              "triggers", "trigger_schedules", "runs", "attempts", "run_events", "schedule_skips"]
    for table in tables:
        assert not _try(cluster, INGRESS, f"SELECT 1 FROM qinglong.{table} LIMIT 1"), table
    assert not _try(cluster, INGRESS, SCHEDULE_UPDATE)
    assert not _try(cluster, INGRESS, SCHEDULE_INSERT)
    assert not _try(cluster, INGRESS, RUN_INSERT)
    assert not _try(cluster, INGRESS, "CREATE TABLE qinglong.extra (x int)")


def test_owner_owns_every_object_and_roles_cannot_connect_elsewhere(cluster):
    """Objects owned by another role would escape the owner's grants and readiness's check."""
    owners = cluster.sql("SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c "
                         "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'qinglong'")
    assert owners == [(OWNER,)]
    assert _try(cluster, OWNER, "CREATE TABLE qinglong.owner_may (x int)")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(cluster.server.dsn(RUNTIME, "wrong-password", cluster.dbname)).close()


def test_runtime_updates_only_the_cursor_and_claim_columns_of_a_schedule(cluster):
    """With UPDATE on the whole row the runtime could move a schedule to another trigger, project
    or revision (or back-date its publish time): a replica bug or a stolen runtime credential
    could then admit Runs under a definition that was never published for them."""
    from qinglong.plugins.cluster_postgres.roles import RUNTIME_SCHEDULE_COLUMNS

    seed(cluster, 1)
    for column in sorted(RUNTIME_SCHEDULE_COLUMNS):
        assert _try(cluster, RUNTIME, f"UPDATE qinglong.trigger_schedules SET {column} = {column}"), column
    columns = {r[0] for r in cluster.sql(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = 'qinglong' AND table_name = 'trigger_schedules'")}
    for column in sorted(columns - RUNTIME_SCHEDULE_COLUMNS):
        assert not _try(cluster, RUNTIME, f"UPDATE qinglong.trigger_schedules SET {column} = {column}"), column
    assert {"trigger_id", "project_id", "trigger_revision", "published_at_ms"} <= columns - RUNTIME_SCHEDULE_COLUMNS
