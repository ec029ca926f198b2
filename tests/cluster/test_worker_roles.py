"""The gateway role can execute the worker functions and nothing else; readiness names every
difference of a function from what the migrations define."""

from __future__ import annotations

import psycopg
import pytest

from qinglong.contracts.errors import SchemaNotReady
from qinglong.plugins.cluster_postgres.roles import CONTROL_FUNCTIONS, INTERNAL_FUNCTIONS, WORKER_FUNCTIONS
from tests.support.cluster import arun
from tests.cluster.test_worker_functions import CMD, INGRESS, RUNTIME, Worker, admit, publish
from tests.support.aio import closing

ADMIN = "qinglong_admin"


def _denied(db, role: str, statement: str) -> str | None:
    """The SQLSTATE ``statement`` fails with as ``role`` (None if it succeeded); rolled back."""
    with psycopg.connect(db.dsn(role)) as conn:
        try:
            conn.execute(statement)
            return None
        except psycopg.Error as exc:
            return exc.sqlstate
        finally:
            conn.rollback()


def _calls(db, names) -> dict[str, str]:
    """A call of each named function of the schema with NULL arguments of its own types."""
    rows = db.sql("SELECT p.proname, coalesce((SELECT string_agg('NULL::' || format_type(t, NULL), ', ' "
                  "ORDER BY i) FROM unnest(p.proargtypes) WITH ORDINALITY AS a (t, i)), '') "
                  "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                  "WHERE n.nspname = 'qinglong' AND p.proname = ANY (%s)", (list(names),))
    assert {r[0] for r in rows} == set(names)
    return {name: f"SELECT qinglong.{name}({args})" for name, args in rows}


def test_gateway_role_executes_each_worker_function(cluster):
    """If one of the seven calls were not executable by the worker's role, workers could not
    run, report or hand back their Runs."""
    publish(cluster, "t", CMD)
    admit(cluster, "t", 2)
    w = Worker(cluster, "w1")  # open_session
    assert w.heartbeat() == {}
    a, b = w.claim(2)
    assert w.started(a)[0] is not None
    assert w.append(a, 0, b"out") == 3
    assert w.complete(a, log_bytes=3)[0] == "accepted"
    w.close()
    assert cluster.sql("SELECT state FROM qinglong.attempts WHERE attempt_id = %s", (b.attempt_id,)) == [("claimed",)]


def test_gateway_role_can_do_nothing_but_execute_the_worker_functions(cluster):
    """A stolen worker credential must not read tasks (their env may hold secrets), forge Runs or
    outcomes, call the control plane's functions or the helpers behind the fences, create objects
    or even temporary tables (where a planted operator could hide)."""
    tables = [r[0] for r in cluster.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'qinglong' ORDER BY 1")]
    assert {"worker_sessions", "attempt_logs", "runs", "attempts"} <= set(tables)
    statements = []
    for table in tables:
        # the first column a statement may write (an identity column ALWAYS refuses an UPDATE
        # before any privilege is looked at)
        column = cluster.sql("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                             "AND NOT attisdropped AND attidentity <> 'a' AND attgenerated = '' "
                             "ORDER BY attnum LIMIT 1", (f"qinglong.{table}",))[0][0]
        statements += [f"SELECT * FROM qinglong.{table} LIMIT 1",
                       f"INSERT INTO qinglong.{table} DEFAULT VALUES",
                       f"UPDATE qinglong.{table} SET {column} = {column} WHERE false",
                       f"DELETE FROM qinglong.{table} WHERE false",
                       f"TRUNCATE qinglong.{table}"]
    statements += list(_calls(cluster, CONTROL_FUNCTIONS + INTERNAL_FUNCTIONS).values())
    statements += ["CREATE TABLE qinglong.planted (x int)",
                   "CREATE FUNCTION qinglong.planted() RETURNS int LANGUAGE sql AS 'SELECT 1'",
                   "CREATE TABLE public.planted (x int)",
                   "CREATE TEMP TABLE planted (x int)",
                   "CREATE SCHEMA planted"]
    for statement in statements:
        assert _denied(cluster, INGRESS, statement) == "42501", statement


def test_only_gateway_role_executes_worker_functions_and_only_runtime_the_control_plane(cluster):
    """The runtime (a replica) must not be able to act as a worker (claim, complete), nor admin
    as either: each credential reaches only its own side of the protocol."""
    worker_calls = _calls(cluster, WORKER_FUNCTIONS)
    control_calls = _calls(cluster, CONTROL_FUNCTIONS)
    for name, statement in worker_calls.items():
        assert _denied(cluster, RUNTIME, statement) == "42501", name
        assert _denied(cluster, ADMIN, statement) == "42501", name
    for name, statement in control_calls.items():
        assert _denied(cluster, ADMIN, statement) == "42501", name
    assert _denied(cluster, RUNTIME, "SELECT * FROM qinglong.expire_attempt(gen_random_uuid(), 1, 'requeued', "
                                      "NULL, NULL, NULL, NULL)") is None
    assert _denied(cluster, RUNTIME, "SELECT * FROM qinglong.worker_sessions, qinglong.attempt_logs") is None
    for statement in ("UPDATE qinglong.attempts SET reason = 'x'", "UPDATE qinglong.runs SET state = 'failed'",
                      "DELETE FROM qinglong.attempt_logs", "UPDATE qinglong.worker_sessions SET capacity = 1"):
        assert _denied(cluster, RUNTIME, statement) == "42501", statement


def _readiness_problem(db) -> str:
    async def body():
        backend = db.backend()
        async with closing(backend):
            await backend.check_readiness()

    with pytest.raises(SchemaNotReady) as info:
        arun(body())
    return str(info.value)


CLAIM = "qinglong.worker_claim(text, uuid, bigint, bytea[])"
HEARTBEAT = "qinglong.worker_heartbeat(text, uuid, bigint, uuid[])"
EXPIRE = "qinglong.expire_attempt(uuid, bigint, text, text, integer, bigint, text)"
FINISH = "qinglong._finish_attempt(uuid, text, integer, integer, bigint, bigint, text, boolean, bigint)"


def _replace_body(db, signature: str) -> None:
    """CREATE OR REPLACE the function, as its owner, with one statement added to its body."""
    definition = db.sql("SELECT pg_get_functiondef(%s::regprocedure)", (signature,))[0][0]
    changed = definition.replace("BEGIN", "BEGIN\n    PERFORM 1;", 1)
    assert changed != definition
    db.sql(changed, role="qinglong_owner")


DRIFTS = {
    "body replaced": (lambda db: _replace_body(db, CLAIM),
                      ["catalog drift: unexpected function signature=qinglong.worker_claim(",
                       "catalog drift: missing function signature=qinglong.worker_claim("]),
    "helper body replaced": (lambda db: _replace_body(db, FINISH),
                             ["catalog drift: unexpected function signature=qinglong._finish_attempt("]),
    "security invoker": (lambda db: db.sql(f"ALTER FUNCTION {HEARTBEAT} SECURITY INVOKER", role="qinglong_owner"),
                         ["function qinglong.worker_heartbeat is SECURITY INVOKER, expected SECURITY DEFINER"]),
    "search_path removed": (lambda db: db.sql(f"ALTER FUNCTION {CLAIM} RESET search_path", role="qinglong_owner"),
                            ["function qinglong.worker_claim runs with settings '(none)'"]),
    "search_path changed": (lambda db: db.sql(f"ALTER FUNCTION {CLAIM} SET search_path = public, pg_catalog",
                                              role="qinglong_owner"),
                            ["function qinglong.worker_claim runs with settings 'search_path=public, pg_catalog'"]),
    "execute granted to public": (lambda db: db.sql(f"GRANT EXECUTE ON FUNCTION {EXPIRE} TO PUBLIC",
                                                    role="qinglong_owner"),
                                  ["unexpected privilege: EXECUTE on function expire_attempt for PUBLIC"]),
    "helper granted to a worker": (lambda db: db.sql(f"GRANT EXECUTE ON FUNCTION {FINISH} TO qinglong_gateway",
                                                     role="qinglong_owner"),
                                   ["unexpected privilege: EXECUTE on function _finish_attempt for "
                                    "qinglong_gateway"]),
    "owner changed": (lambda db: db.sql(f"ALTER FUNCTION {CLAIM} OWNER TO qinglong_admin"),
                      ["function qinglong.worker_claim is owned by qinglong_admin, expected qinglong_owner"]),
    "function added": (lambda db: db.sql("CREATE FUNCTION qinglong.worker_extra() RETURNS int "
                                         "LANGUAGE sql AS 'SELECT 1'", role="qinglong_owner"),
                       ["unexpected function qinglong.worker_extra"]),
    "function dropped": (lambda db: db.sql("DROP FUNCTION qinglong.prune_attempt_logs(bigint, integer)",
                                           role="qinglong_owner"),
                         ["missing function qinglong.prune_attempt_logs"]),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_readiness_names_every_drift_of_a_function(cluster, drift):
    """A replaced body, a lost SECURITY DEFINER or search_path pin, an extra grant or another
    owner each undoes a fence or the role matrix: a replica must refuse to start on such a
    schema and say which function differs."""
    change, fragments = DRIFTS[drift]
    change(cluster)
    message = _readiness_problem(cluster)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
