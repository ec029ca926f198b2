"""A Run cancelled through the management API on the cluster: the runtime role cancels it, and the
request's audit entry commits in the same transaction (qinglong.request_cancel_audited), on each
PostgreSQL build."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from qinglong.contracts.errors import NotFound
from qinglong.contracts.execution import CancelReason, RunState
from qinglong.contracts.tokens import CURRENT_AUDIT, AuditEntry, AuditScope
from tests.cluster.test_worker_functions import CMD, admit, publish
from tests.support.cluster import arun


def _cancel_under_audit(cluster, run_id: str) -> tuple[AuditScope, RunState | Exception]:
    """``request_cancel`` through the backend's run control (runtime role) while the API's audit
    scope of a `run.cancel` request is set, as the API's handler calls it."""
    scope = AuditScope(AuditEntry(1_700_000_000_000, "ops-laptop", "tok-1", "192.0.2.7", "run.cancel", run_id,
                                  "ok", {}))

    async def body():
        backend = cluster.backend("api")
        token = CURRENT_AUDIT.set(scope)
        try:
            return await backend.run_control().request_cancel(run_id, CancelReason.OPERATOR)
        except NotFound as exc:
            return exc
        finally:
            CURRENT_AUDIT.reset(token)
            await backend.close()

    return scope, arun(body())


def _audit_rows(cluster):
    return cluster.sql("SELECT actor, token_id, source, action, object, result FROM qinglong.audit_log "
                       "ORDER BY entry_id")


def test_a_done_cancel_records_exactly_one_entry_in_its_own_transaction(cluster):
    """Written after the change, an entry is lost if the process dies between the two (a
    cancelled Run nobody is recorded as cancelling), and written by the API again after the store
    wrote it, it is duplicated."""
    publish(cluster, "t", CMD)
    ((run_id, _),) = admit(cluster, "t", 1)
    scope, state = _cancel_under_audit(cluster, run_id)
    assert state == RunState.CANCELLED
    assert scope.written, "the API would write the entry a second time"
    assert _audit_rows(cluster) == [("ops-laptop", "tok-1", "192.0.2.7", "run.cancel", run_id, "ok")]


def test_a_refused_cancel_records_nothing(cluster):
    """A cancel of a Run that does not exist changes nothing, so an `ok` entry for it would record
    a change that never happened."""
    scope, state = _cancel_under_audit(cluster, str(uuid.uuid4()))
    assert isinstance(state, NotFound)
    assert not scope.written
    assert _audit_rows(cluster) == []


def test_the_runtime_role_still_cannot_write_the_audit_log_itself(cluster):
    """The function appends only the entry of the cancel it made: were the audit log writable by
    the runtime role, any replica's credential could forge or erase entries."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        cluster.sql("INSERT INTO qinglong.audit_log (at_ms, actor, source, action, object, result) "
                    "VALUES (1, 'x', 'x', 'token.create', 'x', 'ok')", role="qinglong_runtime")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        cluster.sql("DELETE FROM qinglong.audit_log", role="qinglong_runtime")
