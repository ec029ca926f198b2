"""The catalog fingerprint: everything about the schema and its privileges that readiness trusts.

Readiness (``roles.privilege_problems``) reads the catalog as the runtime role and compares it,
line by line, with the fingerprint shipped in :mod:`.expected_fingerprint`, which was read from a
fresh server with every migration applied. Any difference fails closed and is named
(``catalog drift: unexpected ...`` / ``catalog drift: missing ...``). The fingerprint covers:

* the database: its owner and ACL (a CREATE or TEMPORARY for anyone, a CONNECT for PUBLIC);
* our four roles: their attributes, and role memberships both ways (our role a member of another,
  another role a member of ours); the gateway's role is written ``login=any`` (the bootstrap
  creates it NOLOGIN, an operator gives it LOGIN where a gateway runs: both are right);
* our schema: owner and ACL; every relation (kind, owner, persistence, row-level security flags)
  and its ACL; every column (position, type, NOT NULL, default, identity, generated, collation)
  and its ACL; constraints (with UNIQUE on ``runs.idempotency_key``), indexes (definition,
  validity), triggers (the internal foreign-key ones too, with their enabled state), rules,
  policies, types, operators, extensions;
* functions in our schema, functions owned by our roles anywhere, and SECURITY DEFINER functions
  in any schema but ``pg_catalog`` and ``information_schema``: each one's owner, kind, security,
  settings (``proconfig``: the pinned ``search_path``), language, arguments, result, volatility,
  strictness, leakproofness, parallel safety and the md5 of its body, so a function replaced,
  re-owned, made SECURITY INVOKER or stripped of its path is named drift; and their ACLs; default privileges of our roles or
  in our schema; event triggers;
* every shared dependency on our roles in this database (``pg_shdepend``): each object they own
  and each ACL that mentions them, wherever it is.

Every grant is listed with its grant option and grantor. Role names are written as
``{{owner}}``, ``{{admin}}``, ``{{runtime}}``, ``{{gateway}}`` so the fingerprint does not
depend on the configured names; other roles appear by name (they are drift). Facts that differ
between PostgreSQL 15 and 18 without meaning anything (18 records NOT NULL as constraints, 17
added the MAINTAIN privilege, which only the owner holds) are left out or normalised: the same
shipped file holds on both, and a test proves it on both.

**Regenerating the shipped file** after a migration is added or changed (one command, it starts
its own throw-away server through the test harness, applies every migration and rewrites
``expected_fingerprint.py``)::

    python tests/cluster/regenerate_fingerprint.py

``tests/cluster/test_fingerprint.py::test_shipped_fingerprint_matches_a_freshly_migrated_database``
fails while the shipped file is stale. Review the diff of the regenerated file like any other:
each added line is a privilege or structure that readiness will accept from then on.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .migrations import SCHEMA

#: The role functions, as they appear in the fingerprint.
ROLE_FUNCTIONS = ("owner", "admin", "runtime", "gateway")

# The queries run on a session whose search_path is pinned to pg_catalog (db.py), and every
# comparison in them is between exactly matching types, so no operator is resolved outside
# pg_catalog even on an unpinned session. Each query returns named columns; a column whose name ends in ``_role`` holds a role name (or
# 'PUBLIC') and is written as a placeholder when it is one of ours; ``_roles`` holds an array of
# them. ``%(schema)s`` is our schema, ``%(roles)s`` the array of our four role names.
_QUERIES: tuple[tuple[str, str], ...] = (
    ("database", """
SELECT pg_catalog.pg_get_userbyid(d.datdba) AS owner_role
FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
"""),
    ("database-acl", """
SELECT coalesce(g.rolname, 'PUBLIC') AS grantee_role, a.privilege_type AS privilege,
       a.is_grantable AS grantable, pg_catalog.pg_get_userbyid(a.grantor) AS grantor_role
FROM pg_catalog.pg_database d
CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(d.datacl, pg_catalog.acldefault('d', d.datdba))) a
LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
WHERE d.datname = pg_catalog.current_database() AND a.grantee <> d.datdba
"""),
    ("role", """
SELECT r.rolname AS name_role, r.rolsuper AS superuser, r.rolinherit AS inherit,
       r.rolcreaterole AS createrole, r.rolcreatedb AS createdb, r.rolcanlogin AS login,
       r.rolreplication AS replication, r.rolbypassrls AS bypassrls
FROM pg_catalog.pg_roles r WHERE r.rolname = ANY (%(roles)s)
"""),
    ("membership", """
SELECT m.rolname AS member_role, g.rolname AS of_role, a.admin_option AS admin_option
FROM pg_catalog.pg_auth_members a
JOIN pg_catalog.pg_roles g ON g.oid = a.roleid
JOIN pg_catalog.pg_roles m ON m.oid = a.member
WHERE g.rolname = ANY (%(roles)s) OR m.rolname = ANY (%(roles)s)
"""),
    ("schema", """
SELECT n.nspname AS name, pg_catalog.pg_get_userbyid(n.nspowner) AS owner_role
FROM pg_catalog.pg_namespace n WHERE n.nspname = %(schema)s
"""),
    ("schema-acl", """
SELECT n.nspname AS name, coalesce(g.rolname, 'PUBLIC') AS grantee_role,
       a.privilege_type AS privilege, a.is_grantable AS grantable,
       pg_catalog.pg_get_userbyid(a.grantor) AS grantor_role
FROM pg_catalog.pg_namespace n
CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) a
LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND a.grantee <> n.nspowner
"""),
    ("relation", """
SELECT c.relname AS name, c.relkind::text AS kind, pg_catalog.pg_get_userbyid(c.relowner) AS owner_role,
       c.relpersistence::text AS persistence, c.relrowsecurity AS row_security,
       c.relforcerowsecurity AS force_row_security
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s
"""),
    ("relation-acl", """
SELECT c.relname AS name, coalesce(g.rolname, 'PUBLIC') AS grantee_role,
       a.privilege_type AS privilege, a.is_grantable AS grantable,
       pg_catalog.pg_get_userbyid(a.grantor) AS grantor_role
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(c.relacl, pg_catalog.acldefault(
    CASE WHEN c.relkind = 'S' THEN 's'::"char" ELSE 'r'::"char" END, c.relowner))) a
LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND a.grantee <> c.relowner
  AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
"""),
    ("column", """
SELECT c.relname AS relation, att.attname AS name, att.attnum AS position,
       pg_catalog.format_type(att.atttypid, att.atttypmod) AS type, att.attnotnull AS not_null,
       coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '') AS default_expr,
       att.attidentity::text AS identity, att.attgenerated::text AS generated,
       coalesce(co.collname, '') AS collation
FROM pg_catalog.pg_attribute att
JOIN pg_catalog.pg_class c ON c.oid = att.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = att.attrelid AND d.adnum = att.attnum
LEFT JOIN pg_catalog.pg_collation co ON co.oid = att.attcollation
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND att.attnum > 0 AND NOT att.attisdropped
"""),
    ("column-acl", """
SELECT c.relname AS relation, att.attname AS name, coalesce(g.rolname, 'PUBLIC') AS grantee_role,
       a.privilege_type AS privilege, a.is_grantable AS grantable,
       pg_catalog.pg_get_userbyid(a.grantor) AS grantor_role
FROM pg_catalog.pg_attribute att
JOIN pg_catalog.pg_class c ON c.oid = att.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(att.attacl) a
LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %(schema)s AND att.attacl IS NOT NULL
"""),
    ("constraint", """
SELECT c.relname AS relation, k.conname AS name, k.contype::text AS type,
       pg_catalog.pg_get_constraintdef(k.oid) AS definition, k.convalidated AS validated,
       k.condeferrable AS deferrable, k.condeferred AS deferred
FROM pg_catalog.pg_constraint k
JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND k.contype <> 'n'
"""),
    ("index", """
SELECT c.relname AS relation, i.relname AS name, pg_catalog.pg_get_indexdef(x.indexrelid) AS definition,
       x.indisvalid AS valid, x.indisready AS ready
FROM pg_catalog.pg_index x
JOIN pg_catalog.pg_class c ON c.oid = x.indrelid
JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s
"""),
    ("trigger", """
SELECT c.relname AS relation, t.tgname AS name, pg_catalog.pg_get_triggerdef(t.oid) AS definition,
       t.tgenabled::text AS enabled
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND NOT t.tgisinternal
"""),
    ("internal-trigger", """
SELECT c.relname AS relation, coalesce(k.conname, '') AS constraint_name,
       t.tgfoid::pg_catalog.regproc::text AS function, t.tgtype AS type, t.tgenabled::text AS enabled,
       pg_catalog.count(*) AS count
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_constraint k ON k.oid = t.tgconstraint
WHERE n.nspname = %(schema)s AND t.tgisinternal
GROUP BY 1, 2, 3, 4, 5
"""),
    ("rule", """
SELECT c.relname AS relation, r.rulename AS name, pg_catalog.pg_get_ruledef(r.oid) AS definition,
       r.ev_enabled::text AS enabled
FROM pg_catalog.pg_rewrite r
JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s
"""),
    ("policy", """
SELECT c.relname AS relation, p.polname AS name, p.polcmd::text AS command,
       p.polpermissive AS permissive,
       ARRAY(SELECT coalesce(g.rolname, 'PUBLIC') FROM pg_catalog.unnest(p.polroles) AS u (oid)
             LEFT JOIN pg_catalog.pg_roles g ON g.oid = u.oid) AS to_roles,
       coalesce(pg_catalog.pg_get_expr(p.polqual, p.polrelid), '') AS using_expr,
       coalesce(pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid), '') AS check_expr
FROM pg_catalog.pg_policy p
JOIN pg_catalog.pg_class c ON c.oid = p.polrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s
"""),
    ("function", """
SELECT p.oid::pg_catalog.regprocedure::text AS signature, pg_catalog.pg_get_userbyid(p.proowner) AS owner_role,
       p.prokind::text AS kind, p.prosecdef AS security_definer,
       coalesce(pg_catalog.array_to_string(p.proconfig, ','), '') AS config,
       l.lanname AS language, pg_catalog.pg_get_function_arguments(p.oid) AS arguments,
       pg_catalog.pg_get_function_result(p.oid) AS returns, p.provolatile::text AS volatility,
       p.proisstrict AS strict, p.proleakproof AS leakproof, p.proparallel::text AS parallel,
       pg_catalog.md5(coalesce(p.prosrc, '')) AS body_md5
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
WHERE n.nspname = %(schema)s
   OR pg_catalog.pg_get_userbyid(p.proowner) = ANY (%(roles)s)
   OR (p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema'))
"""),
    ("function-acl", """
SELECT p.oid::pg_catalog.regprocedure::text AS signature, coalesce(g.rolname, 'PUBLIC') AS grantee_role,
       a.privilege_type AS privilege, a.is_grantable AS grantable,
       pg_catalog.pg_get_userbyid(a.grantor) AS grantor_role
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
WHERE (n.nspname = %(schema)s
       OR pg_catalog.pg_get_userbyid(p.proowner) = ANY (%(roles)s)
       OR (p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema')))
  AND a.grantee <> p.proowner
"""),
    ("type", """
SELECT t.typname AS name, t.typtype::text AS kind, pg_catalog.pg_get_userbyid(t.typowner) AS owner_role
FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = %(schema)s
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type e JOIN pg_catalog.pg_class c ON c.oid = e.typrelid
                  WHERE e.oid = t.typelem AND t.typcategory = 'A' AND c.relkind <> 'c')
"""),
    ("operator", """
SELECT o.oid::pg_catalog.regoperator::text AS signature, pg_catalog.pg_get_userbyid(o.oprowner) AS owner_role
FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace
WHERE n.nspname = %(schema)s OR pg_catalog.pg_get_userbyid(o.oprowner) = ANY (%(roles)s)
"""),
    ("extension", """
SELECT e.extname AS name, pg_catalog.pg_get_userbyid(e.extowner) AS owner_role
FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
WHERE n.nspname = %(schema)s OR pg_catalog.pg_get_userbyid(e.extowner) = ANY (%(roles)s)
"""),
    ("default-acl", """
SELECT pg_catalog.pg_get_userbyid(d.defaclrole) AS for_role, coalesce(n.nspname, '') AS schema,
       d.defaclobjtype::text AS object_type, coalesce(g.rolname, 'PUBLIC') AS grantee_role,
       a.privilege_type AS privilege, a.is_grantable AS grantable
FROM pg_catalog.pg_default_acl d
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = d.defaclnamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(d.defaclacl) a
LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
WHERE pg_catalog.pg_get_userbyid(d.defaclrole) = ANY (%(roles)s) OR n.nspname = %(schema)s
"""),
    ("event-trigger", """
SELECT e.evtname AS name, e.evtevent AS event, pg_catalog.pg_get_userbyid(e.evtowner) AS owner_role,
       e.evtenabled::text AS enabled, e.evtfoid::pg_catalog.regproc::text AS function
FROM pg_catalog.pg_event_trigger e
"""),
    ("depends-on-role", """
SELECT s.deptype::text AS dependency,
       CASE WHEN s.classid = 'pg_catalog.pg_database'::pg_catalog.regclass THEN 'this database'
            ELSE pg_catalog.pg_describe_object(s.classid, s.objid, s.objsubid) END AS object,
       pg_catalog.pg_get_userbyid(s.refobjid) AS on_role
FROM pg_catalog.pg_shdepend s
WHERE s.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass
  AND pg_catalog.pg_get_userbyid(s.refobjid) = ANY (%(roles)s)
  AND (s.dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
       OR (s.dbid = 0::pg_catalog.oid AND s.classid = 'pg_catalog.pg_database'::pg_catalog.regclass
           AND s.objid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())))
"""),
)


def _value(name: str, value, placeholders: Mapping[str, str]) -> str:
    if name.endswith("_roles"):
        return "[" + ",".join(sorted(placeholders.get(v, v) for v in (value or []))) + "]"
    if name.endswith("_role"):
        return placeholders.get(value, value)
    if isinstance(value, bool):
        return "t" if value else "f"
    return " ".join(str(value).split())  # one line: definitions may span lines


#: ``{role function: column}`` of a role's attribute that may be either value.
_EITHER = {"gateway": "login"}


def _line(section: str, columns: Sequence[str], row: Sequence, placeholders: Mapping[str, str]) -> str:
    values = [_value(c, v, placeholders) for c, v in zip(columns, row)]
    if section == "role":
        either = _EITHER.get(values[columns.index("name_role")].strip("{}"))
        if either in columns:
            values[columns.index(either)] = "any"
    return section + " " + " ".join(f"{c}={v}" for c, v in zip(columns, values))


async def collect(conn, roles: Mapping[str, str]) -> list[str]:
    """The fingerprint of the database ``conn`` is connected to, sorted, with our role names as
    placeholders. Needs only the catalog's public read access (any role can run it)."""
    placeholders = {name: "{{" + function + "}}" for function, name in roles.items()}
    params = {"schema": SCHEMA, "roles": [roles[f] for f in ROLE_FUNCTIONS]}
    lines: list[str] = []
    for section, query in _QUERIES:
        cur = await conn.execute(query, params)
        columns = [d.name for d in cur.description]
        for row in await cur.fetchall():
            lines.append(_line(section, columns, row, placeholders))
    return sorted(set(lines))


def expected() -> list[str]:
    """The shipped fingerprint (see the module docstring for how it is regenerated)."""
    from .expected_fingerprint import LINES

    return sorted(LINES)


def differences(actual: Iterable[str], wanted: Iterable[str], limit: int = 40) -> list[str]:
    """Readiness problems, one per line present on one side only (at most ``limit`` named)."""
    actual, wanted = set(actual), set(wanted)
    problems = [f"catalog drift: unexpected {line}" for line in sorted(actual - wanted)]
    problems += [f"catalog drift: missing {line}" for line in sorted(wanted - actual)]
    if len(problems) > limit:
        problems = problems[:limit] + [f"and {len(problems) - limit} more catalog differences"]
    return problems


async def problems(conn, roles: Mapping[str, str]) -> list[str]:
    """Every difference between this database's fingerprint and the shipped one."""
    return differences(await collect(conn, roles), expected())


def render_module(lines: Iterable[str]) -> str:
    """The text of ``expected_fingerprint.py`` holding ``lines``."""
    body = "".join(f"    {line!r},\n" for line in sorted(set(lines)))
    return (
        '"""The catalog fingerprint readiness expects (generated: do not edit by hand).\n\n'
        "Regenerate with ``python tests/cluster/regenerate_fingerprint.py`` after changing a migration;\n"
        "see ``fingerprint.py``.\n"
        '"""\n\n'
        "LINES = (\n" + body + ")\n"
    )
