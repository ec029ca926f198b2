"""The four roles and their exact privileges, and the catalog check that readiness runs.

* ``owner`` (migrator) owns the schema and every object in it;
* ``admin`` publishes projects, tasks and triggers and creates/resets/deletes schedule rows;
* ``runtime`` claims and advances schedules (SELECT, and UPDATE of the cursor and claim columns
  only: never the trigger, project or revision a schedule belongs to, never INSERT or DELETE),
  inserts Runs, Attempts, Events and skip records, and records its own rounds;
* ``gateway`` (the worker gateway's role) may use the schema and execute the worker functions
  (``worker_open_session`` ... ``worker_close_session``) and the gateway's token lookup
  (``worker_identity``): no privilege on any table at all;
* the runtime also executes the control-plane functions (``expire_attempt``, ``request_cancel``,
  ``prune_attempt_logs``, ``prune_skips``) and reads worker sessions and shipped logs; it changes Runs and
  Attempts after admission only through those functions.

The functions (``migrations/0005_workers.sql``, revised by ``0007_one_rule_source.sql``) are
SECURITY DEFINER, owned by the owner, written in PL/pgSQL with ``search_path`` pinned to
``pg_catalog, pg_temp``; :data:`EXPECTED_FUNCTIONS` says which role may execute each (internal
helpers: nobody but the owner), and readiness names a function that is missing, unexpected, not
SECURITY DEFINER, in another language, or without the pinned path. Its body, return type,
volatility and strictness are compared through the fingerprint (``fingerprint.py``).

The GRANTs are installed by ``migrations/0002_grants.sql``, ``0003_schedule_semantics.sql``,
narrowed by ``0004_runtime_schedule_columns.sql`` and extended by ``0005_workers.sql`` (the
functions' EXECUTE, SELECT on sessions and logs) and ``0007_one_rule_source.sql`` (expiry's new
function); :data:`EXPECTED_GRANTS`, :data:`EXPECTED_COLUMN_GRANTS` and :data:`EXPECTED_FUNCTIONS`
are the same set, and :func:`privilege_problems` compares them with the catalog. Anything else (a
GRANT added by hand, one re-issued WITH GRANT OPTION, a privilege for PUBLIC, another column grant,
a table owned by someone else, a role that is a superuser, a member of another role or has another
role as a member) is drift and readiness fails closed.

Readiness also checks what the session resolves names through (:func:`environment_problems`):
the pinned ``search_path`` must hold, no schema on it may let anyone but its owner create objects,
no other schema of the database may either (the way an operator or function gets planted), and
the database must grant CREATE or TEMPORARY to nobody but its owner. Finally it compares the
whole catalog fingerprint (``fingerprint.py``), which catches every structural drift as well.

Creating the roles is a superuser's job (outside the migration stream, because roles are
cluster-wide); :func:`bootstrap_statements` says what to run, and docs/cluster.md shows exactly
that (a test holds the two equal). The gateway's role is created NOLOGIN, without a password: an
operator gives it LOGIN (:func:`gateway_login_statement`) only where a gateway runs, restricted to
the gateway hosts in ``pg_hba.conf``; the fingerprint accepts that one attribute either way.
"""

from __future__ import annotations

from typing import Mapping

from psycopg.rows import dict_row

from .db import PINNED_SEARCH_PATH
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
        "trigger_revision_marks": frozenset({"SELECT", "INSERT", "UPDATE"}),
        "api_tokens": frozenset({"SELECT", "INSERT", "UPDATE"}),
        "audit_log": frozenset({"SELECT", "INSERT", "DELETE"}),
        "worker_registrations": frozenset({"SELECT", "INSERT", "UPDATE"}),
        "console_links": frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"}),
    },
    "runtime": {
        "schema_migrations": frozenset({"SELECT"}),
        "projects": frozenset({"SELECT"}),
        "tasks": frozenset({"SELECT"}),
        "task_revisions": frozenset({"SELECT"}),
        "execution_revisions": frozenset({"SELECT"}),
        "triggers": frozenset({"SELECT"}),
        "trigger_schedules": frozenset({"SELECT"}),  # UPDATE: columns, below
        "runs": frozenset({"SELECT", "INSERT"}),
        "attempts": frozenset({"SELECT", "INSERT"}),
        "run_events": frozenset({"SELECT", "INSERT"}),
        "schedule_skips": frozenset({"SELECT", "INSERT"}),
        "run_skips": frozenset({"SELECT"}),
        "scheduler_replicas": frozenset(_ALL),
        "worker_sessions": frozenset({"SELECT"}),
        "attempt_logs": frozenset({"SELECT"}),
        "event_outbox": frozenset({"SELECT", "DELETE"}),  # UPDATE: a column, below
        "event_deliveries": frozenset(_ALL),
        "operator_episodes": frozenset({"SELECT", "DELETE"}),
        "run_event_payloads": frozenset({"SELECT", "INSERT"}),
    },
    "gateway": {},
}

#: The worker protocol's functions (EXECUTE for the gateway role alone).
WORKER_FUNCTIONS = ("worker_open_session", "worker_heartbeat", "worker_claim", "worker_started",
                    "worker_append_log", "worker_complete", "worker_complete_late",
                    "worker_close_session")
#: The gateway role's CONNECTION LIMIT in the bootstrap: the gateway processes'
#: pools and listeners, with room; a role without a limit fails the gateway's readiness.
GATEWAY_CONNECTION_LIMIT = 64
#: The gateway's lookup of a worker token (EXECUTE for the gateway role).
GATEWAY_FUNCTIONS = ("worker_identity",)
#: Registration functions (EXECUTE for the admin role).
ADMIN_FUNCTIONS = ("worker_revoke",)
#: The control plane's functions (EXECUTE for the runtime alone); ``request_cancel_audited`` also
#: appends the API request's audit entry of the cancel it made, in the caller's transaction.
CONTROL_FUNCTIONS = ("expire_attempt", "request_cancel", "prune_attempt_logs", "request_cancel_audited",
                     "operator_episode", "check_stranded_runs", "prune_skips")
#: Helpers the functions above call; only the owner executes them.
INTERNAL_FUNCTIONS = ("_now_ms", "_event", "_utc", "_cancel_words", "_run_spec", "_spec_problem",
                      "_retry_decision", "_end_attempt", "_finish_attempt", "_requeue", "_session",
                      "_lease", "_overlap", "_reason", "_claim_routing", "_runs_routing",
                      "_outbox_run_ended", "_outbox_skipped", "_chain_after_end", "_runs_key_kept",
                      "_skip_run", "_operator_event", "_outbox_worker_lost", "_notify_claimable")

#: ``{function name: role function allowed to EXECUTE it, or None (owner only)}``.
EXPECTED_FUNCTIONS: dict[str, str | None] = {
    **{name: "gateway" for name in WORKER_FUNCTIONS + GATEWAY_FUNCTIONS},
    **{name: "admin" for name in ADMIN_FUNCTIONS},
    **{name: "runtime" for name in CONTROL_FUNCTIONS},
    **{name: None for name in INTERNAL_FUNCTIONS},
}

#: Functions shipped in more than one form (their argument lists; the fingerprint names each):
#: ``worker_complete`` with and without the count of log bytes that could not be shipped, and with
#: the worker's own stop request, and with the age of the job's exit; ``worker_complete_late``
#: without and with the worker's own stop request and the age of the job's exit.
FUNCTION_FORMS = {"worker_complete": 4, "worker_complete_late": 2}

#: The settings every function of the schema runs with.
FUNCTION_CONFIG = "search_path=" + ", ".join(PINNED_SEARCH_PATH)

#: The columns of ``trigger_schedules`` the runtime writes: the cursor (claim, admission) and the
#: four-part claim fence plus its state version and acquisition time. ``trigger_id``,
#: ``project_id``, ``trigger_revision`` and ``published_at_ms`` are the publisher's alone.
RUNTIME_SCHEDULE_COLUMNS = frozenset({
    "next_fire_at_ms", "last_scheduled_at_ms", "state_version", "claim_owner", "claim_token",
    "claim_version", "claim_expires_at_ms", "updated_at_ms",
})

#: ``{role function: {table: {privilege: columns}}}``: column-level grants.
EXPECTED_COLUMN_GRANTS: dict[str, dict[str, dict[str, frozenset[str]]]] = {
    "runtime": {"trigger_schedules": {"UPDATE": RUNTIME_SCHEDULE_COLUMNS},
                "event_outbox": {"UPDATE": frozenset({"routed_at_ms"})}},
}

#: Roles (by function) with USAGE on the schema.
EXPECTED_SCHEMA_USAGE = frozenset({"admin", "runtime", "gateway"})

#: Every relation (table, view, sequence, ...) the migrations create in the schema.
EXPECTED_TABLES = frozenset({
    "schema_migrations", "projects", "tasks", "task_revisions", "execution_revisions", "triggers",
    "trigger_schedules", "runs", "attempts", "run_events", "schedule_skips",
    "trigger_revision_marks", "scheduler_replicas", "worker_sessions", "attempt_logs",
    "event_outbox", "event_outbox_seq_seq", "event_deliveries", "operator_episodes",
    "run_event_payloads",
    "api_tokens", "audit_log", "audit_log_entry_id_seq", "run_skips", "run_skips_skip_seq_seq",
    "worker_registrations", "console_links",
})

_CATALOG_SQL = """
SELECT 'table' AS what, c.relname AS object, coalesce(g.rolname, 'PUBLIC') AS grantee,
       a.privilege_type || CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END AS privilege
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
  AND a.grantee <> c.relowner
UNION ALL
SELECT 'schema', n.nspname, coalesce(g.rolname, 'PUBLIC'),
       a.privilege_type || CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
FROM pg_namespace n
CROSS JOIN LATERAL aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND a.grantee <> n.nspowner
UNION ALL
SELECT 'column', c.relname::text || '.' || att.attname::text, coalesce(g.rolname, 'PUBLIC'),
       a.privilege_type || CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
FROM pg_attribute att
JOIN pg_class c ON c.oid = att.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(att.attacl) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND att.attacl IS NOT NULL
UNION ALL
SELECT 'function', p.proname, coalesce(g.rolname, 'PUBLIC'),
       a.privilege_type || CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
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

_FUNCTIONS_SQL = """
SELECT p.proname, p.prosecdef, l.lanname,
       coalesce(pg_catalog.array_to_string(p.proconfig, ';'), '') AS config
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
WHERE n.nspname = %(schema)s
ORDER BY p.proname
"""

_ROLES_SQL = """
SELECT r.rolname, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls,
       coalesce((SELECT array_agg(g.rolname ORDER BY g.rolname) FROM pg_auth_members m
                 JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid), '{}') AS member_of,
       coalesce((SELECT array_agg(g.rolname ORDER BY g.rolname) FROM pg_auth_members m
                 JOIN pg_roles g ON g.oid = m.member WHERE m.roleid = r.oid), '{}') AS members
FROM pg_roles r WHERE r.rolname = ANY(%(names)s)
"""

# The session's path, and every schema on it with a privilege for someone but its owner other
# than USAGE (pg_catalog's USAGE for PUBLIC is the server's own), or an owner that is not a
# superuser.
_PATH_SQL = """
SELECT current_setting('search_path'), current_schemas(true)::text[]
"""

_PATH_SCHEMAS_SQL = """
SELECT n.nspname, pg_get_userbyid(n.nspowner), o.rolsuper,
       coalesce((SELECT array_agg(coalesce(g.rolname::text, 'PUBLIC') || ':' || a.privilege_type
                                  ORDER BY g.rolname, a.privilege_type)
                 FROM aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
                 LEFT JOIN pg_roles g ON g.oid = a.grantee
                 WHERE a.grantee <> n.nspowner AND a.privilege_type <> 'USAGE'), '{}')
FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner
WHERE n.nspname = ANY (current_schemas(true))
"""

# Every other schema (not ours, not the system's, not a session's temporary schema) where a role
# other than its owner may CREATE, or whose owner is not a superuser, the database owner or our
# owner role: whoever can create objects there can plant operators and functions.
_OTHER_SCHEMAS_SQL = """
SELECT n.nspname, pg_get_userbyid(n.nspowner),
       (o.rolsuper OR o.rolname = 'pg_database_owner' OR o.rolname = %(owner)s
        OR o.oid = (SELECT datdba FROM pg_database WHERE datname = current_database())) AS owner_ok,
       coalesce((SELECT array_agg(coalesce(g.rolname::text, 'PUBLIC') ORDER BY g.rolname)
                 FROM aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
                 LEFT JOIN pg_roles g ON g.oid = a.grantee
                 WHERE a.grantee <> n.nspowner AND a.privilege_type = 'CREATE'), '{}')
FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner
WHERE n.nspname <> %(schema)s AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp\\_%%'
  AND NOT (n.nspname = ANY (current_schemas(true)))
"""

# The database's CREATE and TEMPORARY for anyone but its owner.
_DATABASE_SQL = """
SELECT current_database(), coalesce(g.rolname, 'PUBLIC'), a.privilege_type
FROM pg_database d
CROSS JOIN LATERAL aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a
LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE d.datname = current_database() AND a.grantee <> d.datdba
  AND a.privilege_type IN ('CREATE', 'TEMPORARY')
ORDER BY 2, 3
"""


#: Role and database settings (``ALTER ROLE/DATABASE ... SET``) for our roles and database,
#: ``pg_db_role_setting``. We ship none; these names are only about observation and memory, and
#: may be set. Anything else differs from what we ship (``session_replication_role = replica``
#: would switch off every foreign key and trigger, ``synchronous_commit = off`` weaken
#: durability, ``default_transaction_read_only`` refuse writes) and fails readiness.
HARMLESS_SETTINGS = ("application_name", "work_mem", "maintenance_work_mem", "temp_buffers",
                     "track_io_timing",
                     # every session's options set these over any role or database default
                     # (db.session_options); environment_problems checks the search path
                     "search_path", "statement_timeout")
HARMLESS_SETTING_PREFIXES = ("log_", "auto_explain.")

#: What every session must run with, as the session shows it (``SHOW``): pinned by the session's
#: options where a role may set it (:func:`.db.session_options`), checked where only a
#: superuser can (``session_replication_role``).
PINNED_SESSION_SETTINGS = {"session_replication_role": "origin", "synchronous_commit": "on",
                           "default_transaction_read_only": "off", "transaction_read_only": "off"}

_ROLE_SETTINGS_SQL = """
SELECT s.setrole = 0 AS all_roles, r.rolname AS role, s.setdatabase = 0 AS all_databases,
       d.datname AS database, c.setting
FROM pg_catalog.pg_db_role_setting s
LEFT JOIN pg_catalog.pg_roles r ON r.oid = s.setrole
LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS c (setting)
WHERE (s.setdatabase = 0 OR d.datname = pg_catalog.current_database())
  AND (s.setrole = 0 OR r.rolname = ANY (%(roles)s))
ORDER BY 1, 2, 3
"""


def harmless_setting(name: str) -> bool:
    """A role or database setting readiness accepts (:data:`HARMLESS_SETTINGS`)."""
    name = name.lower()
    return name in HARMLESS_SETTINGS or name.startswith(HARMLESS_SETTING_PREFIXES)


async def setting_problems(conn, roles: Mapping[str, str]) -> list[str]:
    """Role and database settings of our roles and database that differ from what we ship (none
    but :data:`HARMLESS_SETTINGS`), and any of :data:`PINNED_SESSION_SETTINGS` this session does
    not run with."""
    problems: list[str] = []
    cur = await conn.execute(_ROLE_SETTINGS_SQL, {"roles": list(roles.values())})
    for all_roles, role, all_databases, database, setting in await cur.fetchall():
        name = setting.split("=", 1)[0]
        if harmless_setting(name):
            continue
        where, undo = _setting_origin(all_roles, role, all_databases, database, name)
        problems.append(f"{where} sets {setting}, which Qinglong does not ship and its guarantees may "
                        f"depend on ({undo})")
    for name, expected in PINNED_SESSION_SETTINGS.items():
        cur = await conn.execute(f"SHOW {name}")
        (value,) = await cur.fetchone()
        if str(value).lower() != expected:
            problems.append(f"the session runs with {name} = {value}, expected {expected}")
    return problems


def _setting_origin(all_roles: bool, role: str | None, all_databases: bool, database: str | None,
                    name: str) -> tuple[str, str]:
    """Where a ``pg_db_role_setting`` row applies, and the statement that removes it. A row for
    no role is the database's (``ALTER DATABASE d SET``, the same row as ``ALTER ROLE ALL IN
    DATABASE d SET``) or, for no database either, ``ALTER ROLE ALL SET``'s: every role on the
    server, ours included, removed only by ``ALTER ROLE ALL RESET``."""
    if all_roles and all_databases:
        return "every role (ALTER ROLE ALL)", f"ALTER ROLE ALL RESET {name}"
    if all_roles:
        return f"database {database}", f"ALTER DATABASE {_ident(database or '')} RESET {name}"
    if all_databases:
        return f"role {role}", f"ALTER ROLE {_ident(role or '')} RESET {name}"
    return (f"role {role} in database {database}",
            f"ALTER ROLE {_ident(role or '')} IN DATABASE {_ident(database or '')} RESET {name}")


def expected_privileges(roles: Mapping[str, str]) -> set[tuple[str, str, str, str]]:
    """``{(what, object, grantee, privilege)}`` the catalog must show, with real role names."""
    expected: set[tuple[str, str, str, str]] = set()
    for function, tables in EXPECTED_GRANTS.items():
        for table, privileges in tables.items():
            for privilege in privileges:
                expected.add(("table", table, roles[function], privilege))
    for function, tables in EXPECTED_COLUMN_GRANTS.items():
        for table, by_privilege in tables.items():
            for privilege, columns in by_privilege.items():
                for column in columns:
                    expected.add(("column", f"{table}.{column}", roles[function], privilege))
    for function in EXPECTED_SCHEMA_USAGE:
        expected.add(("schema", SCHEMA, roles[function], "USAGE"))
    for name, function in EXPECTED_FUNCTIONS.items():
        if function is not None:
            expected.add(("function", name, roles[function], "EXECUTE"))
    return expected


async def function_problems(conn) -> list[str]:
    """Every function of the schema that is not exactly one of :data:`EXPECTED_FUNCTIONS` as the
    migrations define it: unknown or missing, not SECURITY DEFINER, not PL/pgSQL, or not running
    with the pinned ``search_path`` (and nothing else)."""
    problems: list[str] = []
    cur = await conn.execute(_FUNCTIONS_SQL, {"schema": SCHEMA})
    seen: dict[str, int] = {}
    for name, definer, language, config in await cur.fetchall():
        label = f"function {SCHEMA}.{name}"
        if seen.get(name, 0) >= FUNCTION_FORMS.get(name, 1) or name not in EXPECTED_FUNCTIONS:
            problems.append(f"unexpected {label}")
            continue
        seen[name] = seen.get(name, 0) + 1
        if not definer:
            problems.append(f"{label} is SECURITY INVOKER, expected SECURITY DEFINER")
        if language != "plpgsql":
            problems.append(f"{label} is written in {language}, expected plpgsql")
        if config != FUNCTION_CONFIG:
            problems.append(f"{label} runs with settings {config or '(none)'!r}, expected "
                            f"{FUNCTION_CONFIG!r}")
    for name in sorted(set(EXPECTED_FUNCTIONS) - set(seen)):
        problems.append(f"missing function {SCHEMA}.{name}")
    return problems


async def environment_problems(conn, roles: Mapping[str, str]) -> list[str]:
    """Why names this session resolves could be someone else's objects: the pinned
    ``search_path`` does not hold, a schema on the path or elsewhere in the database lets a role
    other than its owner create objects (or is owned by a role that is not trusted), or the
    database grants CREATE or TEMPORARY to a role other than its owner."""
    problems: list[str] = []
    cur = await conn.execute(_PATH_SQL)
    setting, effective = await cur.fetchone()
    pinned = ", ".join(PINNED_SEARCH_PATH)
    given = [part.strip().strip('"') for part in setting.split(",") if part.strip()]
    if given != list(PINNED_SEARCH_PATH):
        problems.append(f"the session's search_path is {setting!r}, expected {pinned!r}")
    for schema in effective:
        if schema != "pg_catalog" and not schema.startswith("pg_temp_"):
            problems.append(f"schema {schema} is on the session's effective search path")
    cur = await conn.execute(_PATH_SCHEMAS_SQL)
    for schema, owner, owner_is_superuser, grants in await cur.fetchall():
        if not owner_is_superuser:
            problems.append(f"schema {schema} on the search path is owned by {owner}, not a superuser")
        for grant in grants:
            grantee, privilege = grant.rsplit(":", 1)
            problems.append(f"schema {schema} on the search path grants {privilege} to {grantee}")
    cur = await conn.execute(_OTHER_SCHEMAS_SQL, {"schema": SCHEMA, "owner": roles["owner"]})
    for schema, owner, owner_ok, creators in await cur.fetchall():
        if not owner_ok:
            problems.append(f"schema {schema} is owned by {owner}, who could create objects in it "
                            "(expected a superuser or the database owner)")
        for grantee in creators:
            problems.append(f"schema {schema} grants CREATE to {grantee}: a role other than its owner "
                            f"can plant functions and operators there (REVOKE CREATE ON SCHEMA "
                            f"{schema} FROM {grantee})")
    cur = await conn.execute(_DATABASE_SQL)
    for database, grantee, privilege in await cur.fetchall():
        problems.append(f"database {database} grants {privilege} to {grantee}, expected none for "
                        f"anyone but its owner (REVOKE {privilege} ON DATABASE {database} FROM {grantee})")
    return problems


async def privilege_problems(conn, roles: Mapping[str, str]) -> list[str]:
    """Every difference between the catalog and the expected roles, owners and GRANTs, then
    :func:`environment_problems` and the catalog fingerprint's differences."""
    from . import fingerprint

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
            if owner != roles["owner"]:
                problems.append(f"function {SCHEMA}.{name} is owned by {owner}, expected {roles['owner']}")
            continue
        if kind != "schema":
            seen_tables.add(name)
        if owner != roles["owner"]:
            problems.append(f"{kind} {name} is owned by {owner}, expected {roles['owner']}")
    for name in sorted(seen_tables - EXPECTED_TABLES):
        problems.append(f"unexpected relation {SCHEMA}.{name}")
    for name in sorted(EXPECTED_TABLES - seen_tables):
        problems.append(f"missing relation {SCHEMA}.{name}")
    problems += await function_problems(conn)

    async with conn.cursor(row_factory=dict_row) as named:
        await named.execute(_ROLES_SQL, {"names": list(roles.values())})
        found = {row["rolname"]: row for row in await named.fetchall()}
    for function, name in roles.items():
        row = found.get(name)
        if row is None:
            problems.append(f"role {name} ({function}) does not exist")
            continue
        for flag, label in (("rolsuper", "SUPERUSER"), ("rolcreaterole", "CREATEROLE"),
                            ("rolcreatedb", "CREATEDB"), ("rolreplication", "REPLICATION"),
                            ("rolbypassrls", "BYPASSRLS")):
            if row[flag]:
                problems.append(f"role {name} ({function}) has {label}")
        if row["member_of"]:
            problems.append(f"role {name} ({function}) is a member of {', '.join(row['member_of'])}")
        if row["members"]:
            problems.append(f"role {name} ({function}) has member(s) {', '.join(row['members'])}, "
                            "who could act with its privileges")
    problems += await environment_problems(conn, roles)
    problems += await setting_problems(conn, roles)
    problems += await fingerprint.problems(conn, roles)
    return problems


def _ident(name: str) -> str:
    from psycopg import sql  # only the CLI helper needs quoting

    return sql.Identifier(name).as_string(None)


def bootstrap_statements(roles: Mapping[str, str], database: str) -> list[str]:
    """What a superuser runs once to create the roles and the database (passwords elided). The
    gateway's role is NOLOGIN, bounded and without a password (see :func:`gateway_login_statement`)."""
    ident = _ident
    lines = []
    for function, name in roles.items():
        if function == "gateway":
            # its connections are bounded whatever calls it (readiness checks it); it logs in only
            # where an operator allows it
            lines.append(
                f"CREATE ROLE {ident(name)} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
                f"NOREPLICATION NOBYPASSRLS CONNECTION LIMIT {GATEWAY_CONNECTION_LIMIT};  -- {function}"
            )
            continue
        lines.append(
            f"CREATE ROLE {ident(name)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
            f"NOREPLICATION NOBYPASSRLS PASSWORD '...';  -- {function}"
        )
    lines.append(f"CREATE DATABASE {ident(database)} OWNER {ident(roles['owner'])};")
    lines.append(f"REVOKE ALL ON DATABASE {ident(database)} FROM PUBLIC;")
    others = ", ".join(ident(roles[f]) for f in ("admin", "runtime", "gateway"))
    lines.append(f"GRANT CONNECT ON DATABASE {ident(database)} TO {others};")
    # readiness refuses a database whose public schema others can create in (the default before
    # PostgreSQL 15, kept by pg_upgrade and restores)
    lines.append(f"\\connect {ident(database)}")
    lines.append("REVOKE CREATE ON SCHEMA public FROM PUBLIC;")
    return lines


def gateway_login_statement(roles: Mapping[str, str]) -> str:
    """What an operator runs where a worker gateway runs, to let its role log in (password
    elided); ``pg_hba.conf`` should admit that role from the gateway hosts alone."""
    return f"ALTER ROLE {_ident(roles['gateway'])} LOGIN PASSWORD '...';"
