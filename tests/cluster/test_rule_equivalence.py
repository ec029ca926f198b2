"""The contracts' rules that the cluster's SQL must repeat, because the untrusted worker's calls
decide inside the database: each SQL copy against its contract, on generated inputs, reason
strings included. The retry decision has its own module (test_worker_retry_equivalence.py).

* ``qinglong._reason`` is generated from ``contracts.reasons.REASONS`` and answers every key in
  the table's words;
* ``qinglong._cancel_words`` against ``contracts.execution.cancel_words``;
* ``qinglong._spec_problem`` against ``contracts.stored_spec.stored_spec_problem``;
* ``qinglong._claim_routing`` against ``contracts.stored_spec.stored_claim_routing``;
* ``qinglong._overlap`` against ``contracts.execution.overlap_decision``, on Runs in the store.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong.contracts.execution import (
    ActiveRun,
    CancelReason,
    ConcurrencyMode,
    ConcurrencyPolicy,
    ExecutionSpec,
    OverlapAction,
    RetryPolicy,
    cancel_words,
    overlap_decision,
    spec_to_payload,
)
from qinglong.contracts.reasons import REASONS, fields, reason, sql_reason_function
from qinglong.contracts.stored_spec import MISSING, stored_claim_routing, stored_spec_problem
from qinglong.plugins.cluster_postgres.migrations import known_migrations
from tests.cluster.test_worker_functions import admit, publish

EXAMPLES = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Text a reason value may hold: anything PostgreSQL text can (no NUL, no lone surrogate).
VALUES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


def _owner(cluster) -> psycopg.Connection:
    return psycopg.connect(cluster.dsn("qinglong_owner"), autocommit=True)


# ------------------------------------------------------------------------------------------------
# The reasons table
# ------------------------------------------------------------------------------------------------


def test_the_shipped_reason_function_is_the_one_generated_from_the_contracts_table():
    """A word changed in the table but not in the SQL (or the reverse) would make the two
    profiles record different reasons for the same event; so the newest migration that defines
    qinglong._reason must hold exactly the function the table generates, and a change to the
    table fails here until a new migration installs it again."""
    marker = "CREATE OR REPLACE FUNCTION qinglong._reason("
    defining = [m for m in known_migrations() if marker in m.text]
    assert defining, "no migration defines qinglong._reason"
    text = defining[-1].text
    generated = sql_reason_function()
    assert generated in text, (
        f"migration {defining[-1].version:04d}_{defining[-1].name} does not hold the function "
        "reasons.sql_reason_function() generates: add a migration with its output")
    assert text.count(marker) == 1


def test_the_database_answers_every_reason_key_in_the_tables_words(cluster):
    """Whatever values a reason carries (a worker id, a run id, a count), the database must print
    exactly what the contracts print; a key the table lacks must fail loudly, not print NULL."""
    with _owner(cluster) as conn:

        @EXAMPLES
        @given(key=st.sampled_from(sorted(REASONS)), data=st.data())
        def check(key, data):
            values = {name: data.draw(VALUES, label=name) for name in fields(key)}
            got = conn.execute("SELECT qinglong._reason(%s, %s::text[])",
                               (key, [values[name] for name in fields(key)])).fetchone()[0]
            assert got == reason(key, **values)

        check()
        for key in REASONS:  # each key once more with the values named after their fields
            args = list(fields(key))
            got = conn.execute("SELECT qinglong._reason(%s, %s::text[])", (key, args)).fetchone()[0]
            assert got == reason(key, **{name: name for name in args}), key
        for bad in (("no_such_reason", []), ("retry_attempts_used", []),
                    ("retry_succeeded", ["extra"]), ("retry_attempts_used", [None])):
            try:
                conn.execute("SELECT qinglong._reason(%s, %s::text[])", bad)
            except psycopg.Error as exc:
                assert exc.sqlstate == "QL003", bad
            else:
                raise AssertionError(f"{bad} was answered")


def test_sql_cancel_words_equal_the_contracts_cancel_words(cluster):
    """The words a cancelled Run records must not depend on the profile that cancelled it."""
    with _owner(cluster) as conn:
        for cancel in CancelReason:
            got = conn.execute("SELECT qinglong._cancel_words(%s)", (cancel.value,)).fetchone()[0]
            assert got == cancel_words(cancel), cancel
        assert conn.execute("SELECT qinglong._cancel_words('whim')").fetchone()[0] is None


# ------------------------------------------------------------------------------------------------
# The stored execution spec
# ------------------------------------------------------------------------------------------------

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(-2, 2),
                         st.sampled_from(["", "allow", "queue", "x"]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "mode", "max_attempts"]), inner,
                                                 max_size=3)), max_leaves=6)


@st.composite
def stored_specs(draw):
    """A normalised spec as the publisher stores it, then perhaps damaged: a key removed, or a
    value replaced by any JSON value, at the top level or inside concurrency or retry; or no
    spec at all, JSON null, or any JSON value."""
    kind = draw(st.sampled_from(["valid", "damaged", "damaged", "damaged", "missing", "null", "any"]))
    if kind == "missing":
        return MISSING
    if kind == "null":
        return None
    if kind == "any":
        return draw(JSON_VALUES)
    mode = draw(st.sampled_from(list(ConcurrencyMode)))
    spec = ExecutionSpec(
        command=("true",),
        concurrency=ConcurrencyPolicy(mode, draw(st.one_of(st.none(), st.integers(1, 5)))
                                      if mode is ConcurrencyMode.ALLOW else None),
        retry=RetryPolicy(max_attempts=draw(st.integers(1, 5)),
                          exit_codes=draw(st.one_of(st.none(), st.just((1, 2))))),
        idempotent=draw(st.booleans()),
        labels=draw(st.sampled_from([(), ("gpu",)])))
    stored = json.loads(json.dumps(spec_to_payload(spec)))
    if kind == "damaged":
        where = draw(st.sampled_from(["top", "concurrency", "retry"]))
        target = stored if where == "top" else stored[where]
        key = draw(st.sampled_from(sorted(target)))
        if draw(st.booleans()):
            del target[key]
        else:
            target[key] = draw(JSON_VALUES)
    return stored


def test_sql_spec_problem_equals_the_contracts_stored_spec_problem(cluster):
    """If the two disagreed, a worker would be handed a spec it cannot run (or a runnable Run
    would be failed at claim) on the cluster while the contract says otherwise."""
    with _owner(cluster) as conn:

        @settings(EXAMPLES, max_examples=300)
        @given(spec=stored_specs())
        def check(spec):
            text = None if spec is MISSING else json.dumps(spec)
            got = conn.execute("SELECT qinglong._spec_problem(%s::jsonb)", (text,)).fetchone()[0]
            assert got == stored_spec_problem(spec), spec

        check()


#: A ``labels`` value as a damaged or hand-written revision may hold it: strings (repeated, in any
#: order), JSON nulls or any other JSON value in an array, or a value of another JSON type.
LABEL_VALUES = st.one_of(
    st.lists(st.one_of(st.sampled_from(["gpu", "arm", "eu-1", "GPU", "x.y"]), st.none()), max_size=5),
    # elements of any JSON type: SQL reads each as its jsonb text ([false] needs label 'false')
    st.lists(JSON_VALUES, min_size=1, max_size=3),
    JSON_VALUES.filter(lambda v: not isinstance(v, list)))


@st.composite
def routed_specs(draw):
    """A stored spec (valid, damaged, missing, null or any JSON), its labels then perhaps
    replaced by any labels value and its concurrency by any JSON value."""
    spec = draw(stored_specs())
    if isinstance(spec, dict) and draw(st.booleans()):
        spec["labels"] = draw(LABEL_VALUES)
    if isinstance(spec, dict) and draw(st.integers(0, 3)) == 0:
        spec["concurrency"] = draw(JSON_VALUES)
    return spec


def test_sql_claim_routing_equals_the_contracts_stored_claim_routing(cluster):
    """Each Run carries the labels a worker must offer and whether its start needs a concurrency
    decision, computed in SQL when the Run is inserted. If the two disagreed, a Run would be
    offered to a worker without the labels its task needs (a GPU job on a router), never be
    offered to any worker at all, or start past its 'forbid' or 'max_running' gate."""
    publish(cluster, "route", {"command": ["true"]})
    with _owner(cluster) as conn:
        rev = conn.execute("SELECT task_revision FROM qinglong.tasks WHERE project_id = 'p1' "
                           "AND task_id = 'route'").fetchone()[0]

        @settings(EXAMPLES, max_examples=300)
        @given(spec=routed_specs())
        def check(spec):
            stored = {} if spec is MISSING else {"execution": spec}
            conn.execute("BEGIN")
            try:
                conn.execute("UPDATE qinglong.execution_revisions SET spec_json = %s WHERE project_id = 'p1' "
                             "AND task_id = 'route' AND task_revision = %s", (json.dumps(stored), rev))
                labels, gated = conn.execute(
                    "SELECT required_labels, start_gated FROM qinglong._claim_routing('p1', 'route', %s, "
                    "'remote_worker')", (rev,)).fetchone()
            finally:
                conn.execute("ROLLBACK")
            assert len(labels) == len(set(labels)), labels
            assert (frozenset(labels), gated) == stored_claim_routing(spec), spec

        check()


# ------------------------------------------------------------------------------------------------
# Overlap
# ------------------------------------------------------------------------------------------------

#: What each Run of the task is at the moment of the decision.
RUN_ROLES = ["active", "active_cancelled", "waiting_due", "waiting_later", "ended"]


@st.composite
def overlap_cases(draw):
    mode = draw(st.sampled_from(list(ConcurrencyMode)))
    max_running = draw(st.one_of(st.none(), st.integers(1, 3))) if mode is ConcurrencyMode.ALLOW else None
    n = draw(st.integers(1, 5))
    roles = [draw(st.sampled_from(RUN_ROLES)) for _ in range(n)]
    # dispatch keys with ties, so the order falls to admitted_at_ms and then to run_id
    keys = [(draw(st.integers(0, 2)), draw(st.integers(0, 1))) for _ in range(n + 1)]
    # the bound on waiting Runs, often below the Runs waiting ahead
    max_queued = draw(st.one_of(st.none(), st.integers(1, 3)))
    return ConcurrencyPolicy(mode, max_running), roles, keys, max_queued


def test_sql_overlap_equals_the_contracts_overlap_decision(cluster):
    """The worker's claim decides a task's concurrency in SQL: if it drifted from the contract,
    a 'forbid' task could run twice at once on the cluster, a 'queue' task out of order, or a
    'replace' cancel the wrong Run, a backlog grow past max_queued on one profile only; and the
    reason an operator reads would differ by profile."""
    publish(cluster, "ov", {"command": ["true"]})
    made = admit(cluster, "ov", 6)
    runs = sorted(made)  # fixed ids; the example gives them keys and states
    session = str(uuid.uuid4())
    with _owner(cluster) as conn:

        @settings(EXAMPLES, max_examples=120)
        @given(case=overlap_cases())
        def check(case):
            policy, roles, keys, max_queued = case
            now = conn.execute("SELECT qinglong._now_ms()").fetchone()[0]
            candidate, others = runs[0], runs[1:len(roles) + 1]
            conn.execute("BEGIN")
            try:
                rows = []
                for (run_id, attempt_id), role, (sched, adm) in zip([candidate, *others], ["candidate", *roles],
                                                                    keys):
                    run_state, attempt_state, cancel, not_before = {
                        "candidate": ("queued", "claimed", None, None),
                        "active": ("running", "running", None, None),
                        "active_cancelled": ("dispatching", "dispatching", "operator", None),
                        "waiting_due": ("retry_wait", "claimed", None, now - 1),
                        "waiting_later": ("queued", "claimed", None, now + 600_000),
                        "ended": ("succeeded", "succeeded", None, None),
                    }[role]
                    leased = attempt_state in ("dispatching", "running")
                    conn.execute("UPDATE qinglong.runs SET state = %s, scheduled_for_ms = %s, admitted_at_ms = %s "
                                 "WHERE run_id = %s", (run_state, sched, adm, run_id))
                    conn.execute("UPDATE qinglong.attempts SET state = %s, cancel_reason = %s, not_before_ms = %s, "
                                 "session_id = %s, session_generation = %s, lease_token_hash = %s, "
                                 "lease_expires_at_ms = %s WHERE attempt_id = %s",
                                 (attempt_state, cancel, not_before, session if leased else None,
                                  1 if leased else None, b"h" if leased else None,
                                  now + 60_000 if leased else None, attempt_id))
                    rows.append((run_id, attempt_id, role, (sched, adm, run_id)))
                key = rows[0][3]
                active = sorted((r for r in rows[1:] if r[2].startswith("active")), key=lambda r: r[3])
                expected = overlap_decision(
                    policy,
                    [ActiveRun(r[0], r[3][0], cancel_requested=r[2] == "active_cancelled") for r in active],
                    sum(1 for r in rows[1:] if r[2] == "waiting_due" and r[3] < key), max_queued=max_queued)
                spec = json.dumps(spec_to_payload(ExecutionSpec(command=("true",), concurrency=policy)))
                action, why = conn.execute(
                    "SELECT action, reason FROM qinglong._overlap(%s::jsonb, 'p1', 'ov', %s, %s, %s, %s, %s)",
                    (spec, candidate[0], key[0], key[1], now, max_queued)).fetchone()
                cancelled = {str(r[0]) for r in conn.execute(
                    "SELECT a.run_id FROM qinglong.attempts a WHERE a.run_id = ANY (%s::uuid[]) "
                    "AND a.cancel_reason = 'replaced'", ([r[0] for r in rows],))}
            finally:
                conn.execute("ROLLBACK")
            assert (action, why or "") == (expected.action.value, expected.reason), (roles, keys, max_queued)
            assert cancelled == set(expected.cancel if expected.action is OverlapAction.REPLACE else ())

        check()
