"""Admission: commit the decisions of a page of claimed schedules, atomically, each row under its
own full fence.

One SERIALIZABLE transaction per page, holding one statement (``sql/admission.sql``,
``admit_page``). The statement re-checks every row by primary key (project, trigger and task
revisions and digests, the execution revision's digest, the schedule's revision, state and cursor,
the whole fence, the decision) and writes, for the rows that pass, the cursor advance, the Run,
Attempt, the two events and the skip record together; a row that fails a check writes nothing
and is reported on its own (see :class:`PageResult`). A write that fails fails the whole page:
never a partial occurrence. :func:`commit_decision` is the page of one row.

Wire-atomic: the whole transaction travels as ONE simple-protocol Query message,
``SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET LOCAL enable_seqscan = off;
SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE qinglong_admit_occurrence(<literals>)``,
on an autocommit connection. PostgreSQL runs such a message as one implicit transaction that
commits at the end of the message and rolls back by itself on any error, leaving the session
idle. The server executes nothing until the whole message has arrived, so a link cut at any
point either commits the whole page (the client may not learn it: the same case as a lost
COMMIT reply) or nothing, and never leaves a transaction open with the schedule rows locked.
(Sending BEGIN, the statement and COMMIT as separate messages could strand the transaction
between statement and COMMIT, with the rows locked and SKIP LOCKED keeping every takeover off.)
The statement returns one row whatever the page size, so the message's last CommandComplete,
sent only once the transaction committed, is always ``SELECT 1``.

The statement is a server-side prepared statement, made once per connection (a new connection
after a reconnect prepares it again) by a message of its own, at the start of the first round on
that connection (:func:`prepare_admission`), so the large CTE is parsed and planned once per
session instead of once per page, and before a burst rather than during one; its arguments (one array per column, one
element per row) are bound client-side as literals into the single message.

Outcomes, per row: the decision committed (a Run admitted, the cursor initialized or skipped
forward, or a claim released), or :class:`~qinglong.contracts.errors.FenceLost` (someone else
owns the schedule now: a takeover after expiry, a republish, a deleted trigger, a deactivated
project; never retried), or :class:`AdmissionRefused` (the inputs do not verify, e.g. a
corrupted execution revision digest; nothing written), or its subclass :class:`TaskChanged` (the
task was republished between claim and commit: a legitimate race, not an error; the coordinator
gives the claim back and the occurrence is decided again next round). Serialization failures are
retried with small full-jitter backoff: the page whole a few times, then split in halves down to
single rows, each retried a bounded number of times, so a row that keeps conflicting ends alone
and the rest of its page commits. Each retry re-checks every fence, so a retry can only end in a
refusal, never in a second Run. When a row's retries run out the coordinator gives its claim back
(``claim.release_claim``) so the occurrence is claimed again next round.

A ``fire`` or ``initialize`` may ask to keep the claim (``keep_claim``): when the new cursor is
already due at the commit's clock, the claim stays this claimer's, the row's acquisition time
becomes the commit's, and :func:`after` gives the claim to decide again at once (in the next page
of the same round).
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
import weakref
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import itemgetter

import psycopg
from psycopg import AsyncClientCursor, pq
from psycopg.adapt import Transformer
from psycopg import errors as pg_errors

from qinglong.contracts.frozen import record
from qinglong.contracts.errors import FenceLost
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.records import Admission, Decision, DecisionKind, ScheduleCursor, page_id_base

from .claim import ClaimedSchedule
from .db import AdmissionRefused
from .sql import query

#: SQLSTATEs worth retrying: the transaction lost a serialization race, nothing was written.
RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)

#: ``kind`` value of a commit that only releases the claim (a decision that changes nothing).
RELEASE = "release"

#: Name of the per-session prepared admission statement.
PREPARED_NAME = "qinglong_admit_occurrence"

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

#: Connections whose session holds the prepared statement. A reconnect is a new connection
#: object, so it is prepared again; weak, so a discarded connection is simply forgotten.
_prepared: "weakref.WeakSet[psycopg.AsyncConnection]" = weakref.WeakSet()


#: ``%(name)s::type[]``: each argument of the page statement and the array type it is read as.
_ARRAY_PLACEHOLDER = re.compile(r"%\((\w+)\)s::(\w+)\[\]")


@lru_cache(maxsize=1)
def _prepared_statement() -> tuple[str, tuple[tuple[str, str], ...]]:
    """``(PREPARE text, the arguments in order as (name, element type))`` of the ``admit_page``
    block: its named placeholders become positional parameters in order of first appearance
    (their types are the array casts written in the block)."""
    names: list[str] = []
    types = dict(_ARRAY_PLACEHOLDER.findall(query("admit_page")))

    def positional(match: re.Match) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    body = _PLACEHOLDER.sub(positional, query("admit_page"))
    return f"PREPARE {PREPARED_NAME} AS {body}", tuple((name, types[name]) for name in names)


#: The head of every admission message (see :func:`_message`).
_MESSAGE_HEAD = ("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET LOCAL enable_seqscan = off; "
                 f"SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE {PREPARED_NAME}(")
#: Results of the message before the statement's own: one per SET.
_MESSAGE_SETS = 3


def _message(columns: list[list[str]]) -> str:
    """The admission message of a page: ``columns`` holds, for each argument of the prepared
    statement in order, the SQL literal of every row (see :func:`_literals`).

    Each argument is written as ``ARRAY[v0, v1, ...]::type[]``, one literal per row, so the
    message reads like the per-occurrence one did (a fire decision is the literal ``'fire'``, a
    trigger id and an idempotency key are quoted literals of their own). The literals are joined
    here rather than by psycopg's client-side binding: that binding parses the message's
    template, one placeholder per row and argument, for every page, which cost more of a
    replica's CPU than everything else of an admission together.

    enable_seqscan off, for this transaction only: under SERIALIZABLE a sequential scan takes a
    relation-level SIRead lock, which conflicts with every concurrent admission's insert. The
    admission touches rows by key only, but the foreign-key checks of attempts and run_events
    against runs are planned per session, and a small (or empty, analysed) runs table gets a
    sequential scan: measured, that lock caused more than half of the serialization failures of
    four replicas draining a backlog. PostgreSQL's documentation advises steering serializable
    transactions towards index scans for this reason.

    plan_cache_mode force_generic_plan, for this transaction only: a prepared statement is
    planned afresh for each of its first five executions (a custom plan for its arguments)
    before its generic plan is kept, and planning this statement costs about 3 ms against about
    0.4 ms, so each replica paid some 15 ms at the start of every burst, the moment a burst is
    measured by. The generic plan is the one every later page runs anyway."""
    arguments = ", ".join(
        "ARRAY[" + ", ".join(column) + f"]::{kind}[]"
        for column, (_, kind) in zip(columns, _prepared_statement()[1]))
    return _MESSAGE_HEAD + arguments + ")"


def _literals(conn: psycopg.AsyncConnection, values) -> list[str]:
    """The SQL literal of each of ``values`` (None, bool, int or str), as psycopg's client-side
    binding writes it: ``NULL``, ``true``/``false``, the decimal digits (a negative number after
    a space), a string in single quotes. A string holding a quote, a backslash or a NUL is left to psycopg's own quoting
    (which escapes it according to the session's ``standard_conforming_strings``, and refuses a
    NUL); any other string needs no escaping under either setting."""
    out = []
    for value in values:
        kind = type(value)
        if value is None:
            out.append("NULL")
        elif kind is str:
            if "'" in value or "\\" in value or "\x00" in value:
                out.append(_quoted(conn, value))
            else:
                out.append("'" + value + "'")
        elif kind is bool:
            out.append("true" if value else "false")
        elif kind is int:
            # a negative number gets psycopg's leading space, so no '-' can follow another
            out.append(str(value) if value >= 0 else " " + str(value))
        else:
            out.append(_quoted(conn, value))
    return out


def _column_literals(conn: psycopg.AsyncConnection, values: list) -> list[str]:
    """:func:`_literals` of the values of one argument across a page, each distinct value quoted
    once: most arguments repeat across a page's rows (the task, its revision and digests, the
    owner, the decision's kind and times), and the values of one argument are all of one type
    (or None), so equal values have equal literals."""
    distinct = list(set(values))
    quoted = dict(zip(distinct, _literals(conn, distinct)))
    return list(map(quoted.__getitem__, values))


def _quoted(conn: psycopg.AsyncConnection, value) -> str:
    """``value`` quoted by psycopg for this connection (its escaping rules and encoding)."""
    return Transformer(conn).as_literal(value).decode(conn.info.encoding)


async def _prepare(conn: psycopg.AsyncConnection) -> None:
    # A message of its own, in autocommit: it takes no row lock, so a cut here leaves nothing.
    await AsyncClientCursor(conn).execute(_prepared_statement()[0])
    _prepared.add(conn)


async def prepare_admission(conn: psycopg.AsyncConnection) -> None:
    """Prepare the admission statement on ``conn`` (autocommit) unless its session already holds
    it: a round calls this before it claims, so the statement is parsed while the replica is
    idle (before a burst) rather than by the first page of one."""
    if conn not in _prepared:
        await _prepare(conn)


async def _send_admission(conn: psycopg.AsyncConnection, columns: list[list[str]]) -> dict:
    """Send the admission of a page (``columns``: see :func:`_message`) as one Query message
    and return its one result row by column name.

    The row is the last result of the message (after the SETs'), reached by ``nextset``; it
    is keyed by the names ``cur.description`` gives for that result, on the client only (the
    message sent is unchanged)."""
    await prepare_admission(conn)
    message = _message(columns)
    cur = AsyncClientCursor(conn)
    try:
        await cur.execute(message)
    except pg_errors.InvalidSqlStatementName:
        # the session lost the statement (DEALLOCATE, DISCARD): nothing ran; prepare and resend
        await _prepare(conn)
        await cur.execute(message)
    for _ in range(_MESSAGE_SETS):  # the first results are the SETs'
        cur.nextset()
    names = [column.name for column in cur.description]
    return dict(zip(names, await cur.fetchone()))


@record
class AdmissionResult:
    """What one commit did. ``admission`` is set when a Run was created."""

    kind: str
    admission: Admission | None
    serialization_retries: int
    admitted_at_ms: int
    #: the claim is still ours (``keep_claim`` and the new cursor was due at ``admitted_at_ms``)
    claim_kept: bool = False
    #: where the commit left the schedule row (its ``ctid``), for a claim kept
    row_tid: str | None = None


def after(claimed: ClaimedSchedule, decision: Decision, result: AdmissionResult) -> ClaimedSchedule:
    """The claim as it stands after ``result`` kept it: the decided cursor, one state version on,
    observed at the commit's clock (the row's new acquisition time), same fence."""
    cursor = claimed.cursor
    last = decision.scheduled_for_ms if decision.scheduled_for_ms is not None else cursor.last_scheduled_at_ms
    return replace(
        claimed,
        cursor=ScheduleCursor(cursor.trigger_revision, decision.next_fire_at_ms, last,
                              cursor.state_version + 1, cursor.published_at_ms),
        observed_at_ms=result.admitted_at_ms,
        row_tid=result.row_tid,
    )


class CasMiss(FenceLost):
    """The fence was intact but the schedule changed under it (revision, state or cursor)."""


class TaskChanged(AdmissionRefused):
    """The task was republished (a new revision) between the claim and the commit; nothing was
    written and the fence is still ours: give the claim back and decide again next round."""


def _params(claimed: ClaimedSchedule, decision: Decision | None, keep_claim: bool = False) -> dict:
    head, fence = claimed.head, claimed.fence
    if decision is None or decision.kind is DecisionKind.NOT_DUE:
        kind, next_ms, scheduled, skipped = RELEASE, claimed.cursor.next_fire_at_ms, None, None
    else:
        kind, next_ms, scheduled, skipped = (decision.kind.value, decision.next_fire_at_ms,
                                             decision.scheduled_for_ms, decision.skipped)
    key = idempotency_key(head.trigger_id, head.trigger_revision, scheduled, head.kind) if scheduled is not None else None
    return {
        "trigger_id": head.trigger_id,
        "task_id": head.task_id,
        "trigger_revision": head.trigger_revision,
        "trigger_digest": head.content_digest,
        "task_revision": claimed.task_revision,
        "task_digest": claimed.task_digest,
        "state_version": claimed.cursor.state_version,
        "expected_next_ms": claimed.cursor.next_fire_at_ms,
        "owner": fence.owner,
        "token": fence.token,
        "claim_version": fence.claim_version,
        "observed_at_ms": claimed.observed_at_ms,
        "kind": kind,
        "next_fire_at_ms": next_ms,
        "scheduled_for_ms": scheduled,
        "jitter_ms": decision.jitter_ms if scheduled is not None else 0,
        "idempotency_key": key,
        "policy": head.misfire_policy.value,
        "skip_first_ms": skipped.first_ms if skipped else None,
        "skip_last_ms": skipped.last_ms if skipped else None,
        "skip_count": skipped.count if skipped else None,
        "skip_count_exact": skipped.count_exact if skipped else None,
        "keep_claim": bool(keep_claim) and kind in ("fire", "initialize"),
        "row_tid": claimed.row_tid,
    }


def _refusal(claimed: ClaimedSchedule, row: dict) -> Exception:
    """Why an admission that advanced nothing refused: from its result row, by column name."""
    name = claimed.head.trigger_id
    if not row["schedule_found"]:
        return FenceLost(f"schedule of trigger {name!r} no longer exists")
    if not row["trigger_ok"]:
        # a republish (or a disable, which is one) since the claim: it also reset the claim, but
        # the cause is the schedule changing under the decision, a compare-and-set miss as on edge
        return CasMiss(f"trigger {name!r} changed revision or was disabled since it was claimed")
    if not row["fence_ok"]:
        return FenceLost(f"claim on trigger {name!r} was lost (expired, taken over or reset)")
    if not row["project_ok"]:
        return FenceLost(f"project of trigger {name!r} is no longer active")
    if not row["schedule_ok"]:
        return CasMiss(f"schedule of trigger {name!r} changed since it was claimed")
    if not row["task_ok"] and row["task_moved"]:
        return TaskChanged(
            f"task {claimed.head.task_id!r} of trigger {name!r} was republished since the claim"
        )
    if not row["task_ok"] and not row["task_revision_found"]:
        return AdmissionRefused(
            f"task {claimed.head.task_id!r} of trigger {name!r} points at revision "
            f"{claimed.task_revision}, which does not exist"
        )
    if not row["task_ok"]:
        return AdmissionRefused(
            f"task {claimed.head.task_id!r} of trigger {name!r} changed or its digest does not verify"
        )
    if not row["execution_ok"]:
        return AdmissionRefused(
            f"execution revision of task {claimed.head.task_id!r} (trigger {name!r}) is missing "
            "or its digest does not verify"
        )
    if not row["decision_ok"]:
        return AdmissionRefused(f"decision for trigger {name!r} is inconsistent with the claim")
    return AdmissionRefused(f"admission of trigger {name!r} wrote nothing")


#: Full-jitter backoff between serialization retries: uniform in [0, min(cap, base * 2**n)] ms.
#: Small, because a retry is cheap and always safe (it re-checks the whole fence) and the
#: conflicting admission usually commits within a millisecond or two.
BACKOFF_BASE_MS = 2.0
BACKOFF_CAP_MS = 50.0


#: How many times a page of several rows is retried whole after a serialization failure before
#: it is split in two (each half is retried the same way, a single row up to ``retries`` times):
#: a row that keeps conflicting (a hot row) ends up alone instead of starving its page.
PAGE_RETRIES = 2


@record
class PageItem:
    """One row of a page: a claim, its decision (None releases the claim), and whether a fire or
    an initialization may keep the claim (see the module docstring)."""

    claimed: ClaimedSchedule
    decision: Decision | None
    keep_claim: bool = False


@dataclass(slots=True)
class PageResult:
    """What a page commit did: per row (in the page's order) an :class:`AdmissionResult` or the
    exception that row ended with (FenceLost, CasMiss, AdmissionRefused, TaskChanged, a
    serialization failure whose retries ran out, or the database error of a write that failed on
    that row alone), and how many times a serialization failure made the page (or a part of it)
    be sent again, whole or split (the last failure of a row whose retries ran out is not one)."""

    outcomes: list
    serialization_retries: int = 0


def _page_ids(count: int) -> list[str]:
    """``count`` fresh random (version 4) UUIDs that differ only in their last 16 bits, in order.

    The Runs of one page then sit side by side in ``runs_pkey`` (one leaf page, not one leaf
    page each), and the pages of different transactions at random places apart. Under
    SERIALIZABLE, the foreign-key checks of a page's Attempts and events read ``runs_pkey`` and
    take page-level SIRead locks where they look; with one random id per Run, a page's checks
    locked a dozen leaf pages that the other replicas' pages were inserting into, and the
    replicas aborted each other. Unique: the 106 random bits are drawn afresh for every page
    (and every retry), and the row number fills the last 16."""
    if count > 0xFFFF:
        raise ValueError("a page holds at most 65535 rows")
    base = page_id_base()
    return [str(uuid.UUID(int=base | j)) for j in range(count)]


def _check_connection(conn: psycopg.AsyncConnection) -> None:
    if not conn.autocommit or conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        raise psycopg.ProgrammingError(
            "admission needs an autocommit connection outside pipeline mode (one message per transaction)")


async def commit_page(conn: psycopg.AsyncConnection, items: list[PageItem], *, retries: int = 10,
                      backoff_ms: float = BACKOFF_BASE_MS, max_queued: int | None = None) -> PageResult:
    """Commit the decisions of ``items`` (distinct schedules) in one SERIALIZABLE transaction,
    one message (see the module docstring and ``sql/admission.sql``, ``admit_page``).

    Every row is checked under its own whole fence and decision; the rows that pass commit
    together, each failing row gets its own refusal. On a serialization failure the page is
    retried whole (:data:`PAGE_RETRIES` times), then split in two halves committed one after the
    other, recursively, down to single rows retried up to ``retries`` times: every retry re-checks
    every fence, so a retry can only end in a refusal, never in a second Run. A write that fails
    (a constraint, a fault) rolls the whole page back; the page is split the same way until the
    failing row is alone, and only that row reports the error. A connection error propagates
    (the caller ends the round): nothing of the message in flight is reported.

    ``max_queued`` is written on each Run admitted: the bound on its task's waiting Runs that a
    worker's claim applies (this replica's ``[execution] max_queued``; None: no bound).
    """
    _check_connection(conn)
    if len({item.claimed.head.trigger_id for item in items}) != len(items):
        raise ValueError("a page holds each schedule once")
    result = PageResult([None] * len(items))
    # each row's arguments and, per argument, the literal of every row: once for every attempt
    # (only the ids change)
    params = [{**_params(item.claimed, item.decision, item.keep_claim), "max_queued": max_queued}
              for item in items]
    names = [name for name, _ in _prepared_statement()[1]]
    run_arg, attempt_arg = names.index("run_id"), names.index("attempt_id")
    # (the ids are given per attempt, below)
    literals = [_column_literals(conn, list(map(itemgetter(name), params)))
                if params and name in params[0] else ["NULL"] * len(params) for name in names]

    async def commit(indices: list[int], earlier_retries: int) -> None:
        tries = retries if len(indices) == 1 else min(retries, PAGE_RETRIES)
        attempt = 0
        while True:
            rows = [params[i] for i in indices]
            whole = len(indices) == len(items)
            columns = [list(column) if whole else [column[i] for i in indices] for column in literals]
            # Run identity is allocated here, for this transaction only: a claim never has one.
            run_ids, attempt_ids = _page_ids(len(rows)), _page_ids(len(rows))
            columns[run_arg] = ["'" + run_id + "'" for run_id in run_ids]
            columns[attempt_arg] = ["'" + attempt_id + "'" for attempt_id in attempt_ids]
            try:
                reply = await _send_admission(conn, columns)
            except RETRYABLE as exc:
                if attempt < tries:
                    result.serialization_retries += 1
                    attempt += 1
                    # full jitter, exponential, capped: racing admitters spread out
                    await asyncio.sleep(random.uniform(0, min(BACKOFF_CAP_MS, backoff_ms * 2 ** attempt)) / 1000)
                    continue
                if len(indices) == 1:
                    result.outcomes[indices[0]] = exc
                    return
                result.serialization_retries += 1
                await _split(indices, earlier_retries + attempt + 1)
                return
            except psycopg.Error as exc:
                if conn.broken or isinstance(exc, psycopg.OperationalError):
                    raise
                if len(indices) == 1:
                    result.outcomes[indices[0]] = exc
                    return
                await _split(indices, earlier_retries + attempt)
                return
            flags = reply["results"]
            for i, row, flag, run_id, attempt_id in zip(indices, rows, flags, run_ids, attempt_ids):
                claimed = items[i].claimed
                if not flag["advanced"]:
                    result.outcomes[i] = _refusal(claimed, flag)
                    continue
                admission = None
                if row["scheduled_for_ms"] is not None:
                    admission = Admission(
                        run_id=run_id, attempt_id=attempt_id,
                        idempotency_key=row["idempotency_key"], project_id=claimed.head.project_id,
                        trigger_id=claimed.head.trigger_id,
                        trigger_revision=claimed.head.trigger_revision,
                        scheduled_for_ms=row["scheduled_for_ms"], admitted_at_ms=reply["now_ms"],
                    )
                result.outcomes[i] = AdmissionResult(row["kind"], admission, earlier_retries + attempt,
                                                     reply["now_ms"], bool(flag["claim_kept"]),
                                                     flag.get("row_tid"))
            return

    async def _split(indices: list[int], earlier_retries: int) -> None:
        half = len(indices) // 2
        await commit(indices[:half], earlier_retries)
        await commit(indices[half:], earlier_retries)

    if items:
        await commit(list(range(len(items))), 0)
    return result


async def commit_decision(conn: psycopg.AsyncConnection, claimed: ClaimedSchedule,
                          decision: Decision | None, *, retries: int = 10,
                          backoff_ms: float = BACKOFF_BASE_MS,
                          keep_claim: bool = False, max_queued: int | None = None) -> AdmissionResult:
    """Commit ``decision`` for ``claimed`` alone (a page of one row; None releases the claim).

    ``keep_claim`` (fire and initialize only): keep the claim when the new cursor is already due
    at the commit's clock (``AdmissionResult.claim_kept``; see the module docstring).

    ``conn`` must be an autocommit connection outside pipeline mode: otherwise psycopg would send
    a BEGIN of its own ahead of the message, and the transaction would no longer be one message.
    Raises FenceLost, AdmissionRefused, or the database error after ``retries`` serialization
    failures.
    """
    _check_connection(conn)
    page = await commit_page(conn, [PageItem(claimed, decision, keep_claim)], retries=retries,
                             backoff_ms=backoff_ms, max_queued=max_queued)
    [outcome] = page.outcomes
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
