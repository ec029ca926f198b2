"""Every reason string a Run or an Attempt records, in one table, for both backends.

The contracts' rules (:func:`~qinglong.contracts.execution.retry_decision`,
:func:`~qinglong.contracts.execution.overlap_decision`, the cancel words of
:func:`~qinglong.contracts.execution.classify_outcome`, :func:`.spec_check.stored_spec_problem`)
and the edge store print these words through :func:`reason`. The cluster's SQL functions, which
must decide inside the database for the untrusted worker, print them through
``qinglong._reason(key, ARRAY[values])``: a SQL function generated from this table by
:func:`sql_reason_function` and installed by a migration. A test compares the database's answer
for every key with :func:`reason`, so a word changed here fails until a new migration installs
the regenerated function.

A template names its values as ``{name}``; the SQL function takes them as text, in the order
they first appear in the template (:func:`fields`).
"""

from __future__ import annotations

import re
from typing import Mapping

#: ``{key: template}``. Keys are lower-case identifiers; a template holds no quote-less braces
#: other than its ``{field}`` names.
REASONS: Mapping[str, str] = {
    # retry_decision: why an ended Attempt gets no successor
    "retry_succeeded": "the process exited 0",
    "retry_cancelled": "cancelled runs are not retried",
    "retry_not_started": "the process could not be started",
    "retry_none_configured": "no retry configured",
    "retry_attempts_used": "all {attempts} attempts used",
    "retry_lost_not_idempotent":
        "a lost attempt may have run to the end; retried only for an idempotent task",
    "retry_timeout_not_retried": "timeouts are not retried (retry.on_timeout = false)",
    "retry_exit_not_listed": "exit status {status} is not in retry.exit_codes",
    "retry_exit_by_signal": "by signal",
    # overlap_decision: why a dispatchable Run does not start now
    "overlap_max_running": "{active} of this task running (concurrency.max_running = {max_running})",
    "overlap_forbid": "skipped: concurrency 'forbid' and run {run_id} of this task is still running",
    "overlap_replace_older": "concurrency 'replace': an older run of this task starts first",
    "overlap_replacing": "replacing the running run of this task",
    "overlap_queue_full":
        "skipped: {waiting} runs of this task already wait to start ([execution] max_queued = {max_queued})",
    "overlap_replace_waiting": "concurrency 'replace': waiting for the replaced run {run_id} to end",
    "overlap_queue": "concurrency 'queue': waiting for the earlier run",
    # a durable cancel request, in words (classify_outcome)
    "cancel_timeout": "the timeout expired",
    "cancel_operator": "cancelled by an operator",
    "cancel_replaced": "replaced by a newer run of the task",
    "cancel_shutdown": "stopped with the control plane",
    "cancelled_before_start": "{cancel} before the process started",
    # a stored execution spec a cluster worker cannot run (stored_spec_problem)
    "spec_missing": "the task revision was published without an execution spec for workers; "
                    "publish the task again",
    "spec_no_command": "the task has no command",
    "spec_invalid": "invalid execution spec: the stored spec lacks a key or has a key of the "
                    "wrong type; publish the task again",
    # the control plane's expiry and a worker's close (cluster)
    "lease_expired": "the lease of worker {worker_id} (session generation {generation}) expired "
                     "while the job was running",
    "deadline_unreported": "the timeout expired and the worker did not report the end of the job",
    "session_closed": "the worker closed its session while the job was running",
    # a Run's reason after its Attempt ended
    "status_exit": "exit status {code}",
    "status_signal": "killed by signal {signal}",
    "retry_scheduled": "attempt {attempt_no} {state} ({what}); attempt {next_attempt_no} "
                       "not before {not_before}",
}

_FIELD = re.compile(r"\{([a-z_]+)\}")
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def fields(key: str) -> tuple[str, ...]:
    """The value names of ``key``'s template, in order of first appearance (the SQL order)."""
    found: list[str] = []
    for name in _FIELD.findall(REASONS[key]):
        if name not in found:
            found.append(name)
    return tuple(found)


def reason(key: str, **values: object) -> str:
    """The words of ``key`` with its ``{field}`` values filled in; every field must be given."""
    template = REASONS[key]
    missing = set(fields(key)) - set(values)
    extra = set(values) - set(fields(key))
    if missing or extra:
        raise TypeError(f"reason {key!r} takes {fields(key)}, not {tuple(sorted(values))}")
    return _FIELD.sub(lambda m: str(values[m[1]]), template)


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sql_expression(key: str) -> str:
    """The template as a SQL text expression over ``p_args`` (1-based, in :func:`fields` order)."""
    order = fields(key)
    parts: list[str] = []
    at = 0
    template = REASONS[key]
    for match in _FIELD.finditer(template):
        if match.start() > at:
            parts.append(_sql_literal(template[at:match.start()]))
        parts.append(f"p_args[{order.index(match[1]) + 1}]")
        at = match.end()
    if at < len(template):
        parts.append(_sql_literal(template[at:]))
    return " || ".join(parts)


def sql_reason_function(schema: str = "qinglong") -> str:
    """``CREATE OR REPLACE FUNCTION <schema>._reason``: this table in SQL. The function raises
    (SQLSTATE QL003) on an unknown key or a wrong number of values, as :func:`reason` does."""
    for key in REASONS:
        if not _KEY.match(key):
            raise ValueError(f"reason key {key!r} must be a lower-case identifier")
    arms = "\n".join(
        f"        WHEN {_sql_literal(key)} THEN\n"
        f"            CASE WHEN v_count = {len(fields(key))} THEN {_sql_expression(key)} END"
        for key in REASONS)
    return (
        f"CREATE OR REPLACE FUNCTION {schema}._reason(p_key text, p_args text[] DEFAULT '{{}}')\n"
        "RETURNS text\n"
        "LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$\n"
        "DECLARE\n"
        "    v_count integer := coalesce(pg_catalog.array_length(p_args, 1), 0);\n"
        "    v_text text;\n"
        "BEGIN\n"
        "    v_text := CASE p_key\n"
        f"{arms}\n"
        "    END;\n"
        "    IF v_text IS NULL THEN\n"
        "        RAISE EXCEPTION 'reason %: unknown key, or a missing or NULL value', p_key\n"
        "            USING ERRCODE = 'QL003';\n"
        "    END IF;\n"
        "    RETURN v_text;\n"
        "END $$;\n")


__all__ = ["REASONS", "fields", "reason", "sql_reason_function"]
