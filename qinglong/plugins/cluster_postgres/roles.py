"""The four roles and their exact privileges, and the catalog check that readiness runs.

* ``owner`` (migrator) owns the schema and every object in it;
* ``admin`` publishes projects, tasks and triggers and creates/resets/deletes schedule rows;
* ``runtime`` claims and advances schedules (SELECT/UPDATE only, never INSERT or DELETE) and
  inserts Runs, Attempts, Events and skip records;
* ``worker_ingress`` may use the schema and nothing else: no privilege on scheduler state.

The GRANTs are installed by ``migrations/0002_grants.sql``; :data:`EXPECTED_GRANTS` is the same
set, and :func:`privilege_problems` compares it with the catalog. Anything else (a GRANT added by
hand, a privilege for PUBLIC, a column grant, a table owned by someone else, a role that is a
superuser or a member of another role) is drift and readiness fails closed.

Creating the roles is a superuser's job (outside the migration stream, because roles are
cluster-wide); :func:`bootstrap_statements` prints what to run.
"""

from __future__ import annotations

from typing import Mapping

from .migrations import SCHEMA

_ALL = ("SELECT", "INSERT", "UPDATE", "DELETE")

#: ``{role function: {table: privileges}}``; tables missing from a role's map get nothing.
EXPECTED_GRANTS: dict[str, dict[str, frozenset[str]]] = {
    "admin": {
        "schema_migrations": frozenset({"SELECT"}),
        "projects": frozenset({"SELECT", "INSERT", "UPDATE"}),
        "tasks": frozenset({"SELECT", "INSERT", "UPDATE"}),
        "task_revisions": frozenset({"SELECT", "INSERT"}),
        "execution_revisions": frozenset({"SELECT", "INSERT"}),
        "triggers": frozenset(_ALL),
        "trigger_schedules": frozenset(_ALL),
    },
    "runtime": {
        "schema_migrations": frozenset({"SELECT"}),
        "projects": frozenset({"SELECT"}),
        "tasks": frozenset({"SELECT"}),
        "task_revisions": frozenset({"SELECT"}),
        "execution_revisions": frozenset({"SELECT"}),
        "triggers": frozenset({"SELECT"}),
        "trigger_schedules": frozenset({"SELECT", "UPDATE"}),
        "runs": frozenset({"SELECT", "INSERT"}),
        "attempts": frozenset({"SELECT", "INSERT"}),
        "run_events": frozenset({"SELECT", "INSERT"}),
        "schedule_skips": frozenset({"SELECT", "INSERT"}),
    },
    "worker_ingress": {},
}

#: Roles (by function) with USAGE on the schema.
EXPECTED_SCHEMA_USAGE = frozenset({"admin", "runtime", "worker_ingress"})

#: Every relation (table, view, sequence, ...) the migrations create in the schema.
EXPECTED_TABLES = frozenset({
    "schema_migrations", "projects", "tasks", "task_revisions", "execution_revisions", "triggers",
    "trigger_schedules", "runs", "attempts", "run_events", "schedule_skips",
})

_CATALOG_SQL = """
SELECT 'table' AS what, c.relname AS object, coalesce(g.rolname, 'PUBLIC') AS grantee,
       a.privilege_type AS privilege
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
  AND a.grantee <> c.relowner
UNION ALL
SELECT 'schema', n.nspname, coalesce(g.rolname, 'PUBLIC'), a.privilege_type
FROM pg_namespace n
CROSS JOIN LATERAL aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND a.grantee <> n.nspowner
UNION ALL
SELECT 'column', c.relname || '.' || att.attname, coalesce(g.rolname, 'PUBLIC'), a.privilege_type
FROM pg_attribute att
JOIN pg_class c ON c.oid = att.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(att.attacl) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND att.attacl IS NOT NULL
UNION ALL
SELECT 'function', p.proname, coalesce(g.rolname, 'PUBLIC'), a.privilege_type
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND a.grantee <> p.proowner
"""

_OBJECTS_SQL = """
SELECT c.relname, c.relkind::text, pg_get_userbyid(c.relowner)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
UNION ALL
SELECT n.nspname, 'schema', pg_get_userbyid(n.nspowner) FROM pg_namespace n WHERE n.nspname = %(schema)s
UNION ALL
SELECT p.proname, 'function', pg_get_userbyid(p.proowner)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %(schema)s
"""

_ROLES_SQL = """
SELECT r.rolname, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls,
       coalesce((SELECT array_agg(g.rolname ORDER BY g.rolname) FROM pg_auth_members m
                 JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid), '{}') AS member_of
FROM pg_roles r WHERE r.rolname = ANY(%(names)s)
"""


def expected_privileges(roles: Mapping[str, str]) -> set[tuple[str, str, str, str]]:
    """``{(what, object, grantee, privilege)}`` the catalog must show, with real role names."""
    expected: set[tuple[str, str, str, str]] = set()
    for function, tables in EXPECTED_GRANTS.items():
        for table, privileges in tables.items():
            for privilege in privileges:
                expected.add(("table", table, roles[function], privilege))
    for function in EXPECTED_SCHEMA_USAGE:
        expected.add(("schema", SCHEMA, roles[function], "USAGE"))
    return expected


async def privilege_problems(conn, roles: Mapping[str, str]) -> list[str]:
    """Every difference between the catalog and the expected roles, owners and GRANTs."""
    problems: list[str] = []
    cur = await conn.execute(_CATALOG_SQL, {"schema": SCHEMA})
    actual = {tuple(row) for row in await cur.fetchall()}
    expected = expected_privileges(roles)
    for what, obj, grantee, privilege in sorted(actual - expected):
        problems.append(f"unexpected privilege: {privilege} on {what} {obj} for {grantee}")
    for what, obj, grantee, privilege in sorted(expected - actual):
        problems.append(f"missing privilege: {privilege} on {what} {obj} for {grantee}")

    cur = await conn.execute(_OBJECTS_SQL, {"schema": SCHEMA})
    seen_tables = set()
    for name, kind, owner in await cur.fetchall():
        if kind == "function":
            problems.append(f"unexpected function {SCHEMA}.{name}")
            continue
        if kind != "schema":
            seen_tables.add(name)
        if owner != roles["owner"]:
            problems.append(f"{kind} {name} is owned by {owner}, expected {roles['owner']}")
    for name in sorted(seen_tables - EXPECTED_TABLES):
        problems.append(f"unexpected relation {SCHEMA}.{name}")
    for name in sorted(EXPECTED_TABLES - seen_tables):
        problems.append(f"missing relation {SCHEMA}.{name}")

    cur = await conn.execute(_ROLES_SQL, {"names": list(roles.values())})
    found = {row[0]: row for row in await cur.fetchall()}
    for function, name in roles.items():
        row = found.get(name)
        if row is None:
            problems.append(f"role {name} ({function}) does not exist")
            continue
        _, superuser, createrole, createdb, replication, bypassrls, member_of = row
        for flag, label in ((superuser, "SUPERUSER"), (createrole, "CREATEROLE"),
                            (createdb, "CREATEDB"), (replication, "REPLICATION"),
                            (bypassrls, "BYPASSRLS")):
            if flag:
                problems.append(f"role {name} ({function}) has {label}")
        if member_of:
            problems.append(f"role {name} ({function}) is a member of {', '.join(member_of)}")
    return problems


def bootstrap_statements(roles: Mapping[str, str], database: str) -> list[str]:
    """What a superuser runs once to create the roles and the database (passwords elided)."""
    from psycopg import sql  # only the CLI helper needs quoting

    def ident(name: str) -> str:
        return sql.Identifier(name).as_string(None)

    lines = []
    for function, name in roles.items():
        lines.append(
            f"CREATE ROLE {ident(name)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
            f"NOREPLICATION NOBYPASSRLS PASSWORD '...';  -- {function}"
        )
    lines.append(f"CREATE DATABASE {ident(database)} OWNER {ident(roles['owner'])};")
    lines.append(f"REVOKE ALL ON DATABASE {ident(database)} FROM PUBLIC;")
    others = ", ".join(ident(roles[f]) for f in ("admin", "runtime", "worker_ingress"))
    lines.append(f"GRANT CONNECT ON DATABASE {ident(database)} TO {others};")
    return lines
